"""``QueryStream.next`` and a cancellation that meets a row arriving (the producer's stop)."""

from __future__ import annotations

import asyncio

import pytest

from spanner_cdc.producer.spanner.reader import QueryStream

pytestmark = pytest.mark.unit


def test_a_task_cancelled_as_its_row_arrives_is_cancelled() -> None:
    """The row is handed over and, in the same turn of the loop, the reading task is cancelled
    (the producer's shutdown cancelling its partitions while changes flow). Python 3.11's
    ``asyncio.wait_for`` then returned the row and dropped the cancellation, so the task read
    on; the shutdown, holding the release lock until its partitions ended, and the task,
    waiting for that lock, waited for each other forever. Either the task ended before the
    cancel (which then says so) or it must end cancelled."""

    async def scenario() -> None:
        stream: QueryStream[str] = QueryStream("partition", lambda: iter(()))
        reading = asyncio.create_task(stream.next(30))
        await asyncio.sleep(0)  # waiting for a row
        stream._slots.acquire()  # what the reading thread does before it hands a row over
        stream._queue.put_nowait("row")
        await asyncio.sleep(0)  # the row reaches the waiting task's queue read ...
        if reading.cancel():  # ... and the task is cancelled before it ran again
            with pytest.raises(asyncio.CancelledError):
                await reading
        else:
            assert await reading == "row"

    asyncio.run(scenario())
