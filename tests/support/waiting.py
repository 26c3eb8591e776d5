"""Waiting in tests for something another process brings about."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(condition: Callable[[], object], seconds: float) -> bool:
    """Whether ``condition`` held within ``seconds`` (asked every 0.2 s)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Wait until ``condition`` holds; fail the test naming ``what`` after ``timeout`` seconds."""
    assert eventually(condition, timeout), f"timed out waiting for {what}"
