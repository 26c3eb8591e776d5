"""Stop a ``spanner-cdc`` process the way an operator does (SIGTERM), and when it does not end,
say where it hangs instead of leaving it behind.

The commands the tests start run under ``tests.support.hang_report``: SIGUSR1 makes it print its
asyncio tasks' awaits, SIGABRT every thread's stack as it dies, both to the process's stderr,
so a failure carries the place the process was stuck in (its log, or the pipe the caller reads).
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

#: Time the process has to print its tasks before it is aborted.
REPORT_SECONDS = 2.0


def stop_with_sigterm(process: subprocess.Popen[Any], timeout: float, log: Path | None = None) -> str:
    """SIGTERM, wait until it ended, and return what it wrote to a piped stderr ("" otherwise).

    A process still running after ``timeout`` seconds is made to print its threads' stacks and
    killed, and the test fails showing the end of its stderr: the pipe's, or ``log``'s where it
    writes to a file. The exit code is the caller's to check (``process.returncode``).
    """
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGUSR1)
        time.sleep(REPORT_SECONDS)
        process.send_signal(signal.SIGABRT)
        try:
            _, stderr = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
        written = _text(stderr) or ("" if log is None else log.read_text())
        raise AssertionError(
            f"still running {timeout:.0f}s after SIGTERM; its stderr, ending in its tasks' awaits and "
            "its threads' stacks:\n" + written[-12000:]
        ) from None
    return _text(stderr)


def _text(stderr: str | bytes | None) -> str:
    """A pipe's output whether the process was started in text mode or not (None: no pipe)."""
    if isinstance(stderr, bytes):
        return stderr.decode(errors="replace")
    return stderr or ""
