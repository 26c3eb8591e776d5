"""`spanner-cdc demo`, short: the whole pipeline runs and every verification check holds; and
`spanner-cdc demo-database`, which the docker/ stack uses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest

from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.services import EMULATOR_PROJECT
from tests.support.screen import foreign_lines

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.mark.parametrize("replica", ["duckdb", "postgres"])
def test_short_demo_passes_every_check(replica: str) -> None:
    """On its own stack (addresses of other services in the environment are not used); nothing
    on the screen but the demo's report and the project's log lines — no DuckDB leak report, no
    stack trace from the consumer's stop (it used to cancel a just-started batch now and then)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPANNER_CDC_", "SPANNER_EMULATOR"))}
    result = subprocess.run(
        [sys.executable, "-m", "spanner_cdc.cli", "demo", "--seconds", "5", "--replica", replica],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    for line in result.stdout.splitlines():  # what the demo leaves for a person to look at
        if line.strip().startswith("outputs: "):
            shutil.rmtree(line.split()[1], ignore_errors=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    results = [line.split()[-1] for line in lines if line.rstrip().endswith((" ok", " FAIL"))]
    assert results == ["ok"] * 5, result.stdout
    assert foreign_lines(result.stderr) == [], result.stderr[-3000:]
    assert not [line for line in result.stdout.splitlines() if "Traceback" in line or "Exception" in line]


def test_demo_database_is_created_once_then_left_alone(stack: EmbeddedStack) -> None:
    command = [
        sys.executable, "-m", "spanner_cdc.cli", "demo-database",
        "--emulator-host", stack.endpoint("spanner"), "--project", EMULATOR_PROJECT,
        "--instance", "compose", "--database", f"bank-{uuid.uuid4().hex[:6]}",
    ]  # fmt: skip
    first = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert (first.returncode, again.returncode) == (0, 0), first.stderr + again.stderr
    assert first.stdout.startswith("created") and again.stdout.startswith("exists")
