"""Waiting with a timeout, without losing a cancellation.

Python 3.11's ``asyncio.wait_for`` returns what it waited for when its task is cancelled in the
same turn of the event loop as the result arrives, and the cancellation is gone
(python/cpython#86296; 3.12 rebuilt ``wait_for`` on ``asyncio.timeout``). A task that loses its
cancellation goes on running: the producer's shutdown, which holds the release lock until its
partition tasks end, waited forever for a partition that had read on and was waiting for that
lock. ``asyncio.timeout`` (3.11) lets a cancellation from outside through, so the project waits
with it and never with ``wait_for`` (``tests/unit/producer/spanner/test_query_stream.py`` shows the race).
"""

from __future__ import annotations

import asyncio
import contextlib


async def set_within(event: asyncio.Event, seconds: float) -> None:
    """Wait until ``event`` is set or ``seconds`` passed, whichever comes first."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
