"""``spanner-cdc`` run as a user runs it: a subprocess of this interpreter, its output captured."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def spanner_cdc(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 180, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``spanner-cdc ARGS``; its exit status and text output, whatever they are."""
    return subprocess.run(
        [sys.executable, "-m", "spanner_cdc.cli", *args],
        capture_output=True,
        text=True,
        env=None if env is None else dict(env),
        timeout=timeout,
        cwd=cwd,
        check=False,
    )
