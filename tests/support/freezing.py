"""A service's processes stopped with SIGSTOP — connections stay open, nothing answers — and
let go with SIGCONT, also when the test fails meanwhile."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen(pgid: int | None) -> Iterator[None]:
    """The process group ``pgid`` stopped for the block's duration."""
    assert pgid is not None, "the service is not a process this test's stack started"
    os.killpg(pgid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(pgid, signal.SIGCONT)
