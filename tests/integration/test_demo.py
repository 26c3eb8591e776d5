"""`spanner-cdc demo`, short: the whole pipeline runs and every verification check holds."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_short_demo_passes_every_check() -> None:
    """On its own stack: addresses of other services in the environment are not used."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPANNER_CDC_", "SPANNER_EMULATOR"))}
    result = subprocess.run(
        [sys.executable, "-m", "spanner_cdc.cli", "demo", "--seconds", "5", "--replica", "postgres"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checks = [line for line in result.stdout.splitlines() if line.strip().startswith(("ok", "FAIL"))]
    assert len(checks) == 4
    assert all(line.strip().startswith("ok") for line in checks), result.stdout
