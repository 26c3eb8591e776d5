"""A page as a person sees it: Debian's Chromium, headless, after the page's script has run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def rendered(url: str, screenshot: Path) -> str:
    """The page's DOM after its script ran (up to 5 s of page time), and a screenshot of it."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("no chromium: scripts/system-deps.sh installs Debian's package")
    common = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        f"--user-data-dir={screenshot.parent / 'chromium-profile'}", "--virtual-time-budget=5000",
        "--window-size=1200,900",
    ]  # fmt: skip
    subprocess.run([*common, f"--screenshot={screenshot}", url], capture_output=True, timeout=90, check=True)
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=90, check=True)
    return dom.stdout
