"""Rows read in order → events on Kafka, a position moved only past what Kafka acknowledged.

The shared loop of a backfill (rows in key order, position: the last key) and of a poll (rows in
commit-timestamp order, position: the boundary and its keys). Rows are read on a worker thread
(``producer.spanner.reader``), one chunk at a time; each chunk's events are counted by a tracker of their
own, and a chunk's ``passed`` callback runs only once it and every chunk before it are
acknowledged, so the position never passes an event Kafka may not have. The position is saved
about once a second while it moves, beside the sending; saving it at the end is the caller's (a
poll adds to it).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any

from spanner_cdc.producer.lineage.acks import AckTracker
from spanner_cdc.producer.publish.publisher import EventSender
from spanner_cdc.producer.spanner.reader import QueryStream
from spanner_cdc.schemas.events import Event
from spanner_cdc.schemas.table import TableSchema

Chunk = list[tuple[Any, ...]]
#: A chunk's events, and what moves the position past the chunk once Kafka has all of them.
ChunkEvents = tuple[Sequence[Event], Callable[[], None]]
SAVE_INTERVAL_SECONDS = 1.0


async def publish_chunks(
    name: str,
    chunks: Callable[[], Iterator[Chunk]],
    *,
    table: TableSchema,
    sender: EventSender,
    events_of: Callable[[Chunk], Awaitable[ChunkEvents]],
    save: Callable[[], Coroutine[Any, Any, None]],
    read_timeout: float,
) -> str | None:
    """Publish every chunk ``chunks()`` yields, events of the table version ``table``; None once
    all are acknowledged, else why not (the position then stands after the last chunk that was).
    Errors of the read and of a save are raised."""
    stream: QueryStream[Chunk] = QueryStream(name, chunks)
    unsettled: deque[tuple[AckTracker, Callable[[], None]]] = deque()
    saving: asyncio.Task[None] | None = None
    saved_at = time.monotonic()
    stream.start()
    try:
        await sender.prepare(table)  # while the query's first rows are on their way
        while (chunk := await stream.next(read_timeout)) is not None:
            events, passed = await events_of(chunk)
            if not events:
                unsettled.append((AckTracker(), passed))
                continue
            tracker = AckTracker()
            await sender.send(events, tracker)
            unsettled.append((tracker, passed))
            due = time.monotonic() - saved_at > SAVE_INTERVAL_SECONDS
            if _advance(unsettled) and due and (saving is None or saving.done()):
                # Beside the sending, one at a time: a save waits for a commit, the next chunks need not.
                if saving is not None:
                    saving.result()  # the last save's error
                saving = asyncio.create_task(save())
                saving.add_done_callback(_retrieved)  # a failure beside another is not logged as lost
                saved_at = time.monotonic()
        if saving is not None:
            await saving
    finally:
        stream.stop()
        if saving is not None and not saving.done():
            saving.cancel()  # the publication failed or was cancelled: its caller saves what stands
    if unsettled:
        sender.kafka.commit_soon()  # nothing more to send: the last chunks need not wait an interval
    for tracker, _ in unsettled:
        await tracker.drained()
    _advance(unsettled)
    if unsettled:
        tracker = unsettled[0][0]
        return tracker.fatal or tracker.failed or "not acknowledged"
    return None


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _advance(unsettled: deque[tuple[AckTracker, Callable[[], None]]]) -> bool:
    """Move the position past the leading chunks Kafka fully acknowledged; True if it moved."""
    moved = False
    while unsettled and _settled(unsettled[0][0]):
        _, passed = unsettled.popleft()
        passed()
        moved = True
    return moved


def _settled(tracker: AckTracker) -> bool:
    """Every event Kafka acknowledged (none failed)."""
    return tracker.pending == 0 and not tracker.failed and not tracker.fatal
