"""Rows read in order → events on Kafka, a position moved only past what Kafka acknowledged.

The shared loop of a backfill (rows in key order, position: the last key) and of a poll (rows in
commit-timestamp order, position: the boundary and its keys). Rows are read on a worker thread
(``producer.spanner.reader``), one chunk at a time; each chunk's events are counted by a tracker of their
own, and a chunk's ``passed`` callback runs only once it and every chunk before it are
acknowledged, so the position never passes an event Kafka may not have. The position is saved
about once a second while it moves; saving it at the end is the caller's (a poll adds to it).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from spanner_cdc.producer.lineage.acks import AckTracker
from spanner_cdc.producer.publish.publisher import EventSender
from spanner_cdc.producer.spanner.reader import QueryStream
from spanner_cdc.schemas.events import Event

Chunk = list[tuple[Any, ...]]
#: A chunk's events, and what moves the position past the chunk once Kafka has all of them.
ChunkEvents = tuple[Sequence[Event], Callable[[], None]]
SAVE_INTERVAL_SECONDS = 1.0


async def publish_chunks(
    name: str,
    chunks: Callable[[], Iterator[Chunk]],
    *,
    sender: EventSender,
    events_of: Callable[[Chunk], Awaitable[ChunkEvents]],
    save: Callable[[], Awaitable[None]],
    read_timeout: float,
) -> str | None:
    """Publish every chunk ``chunks()`` yields; None once all are acknowledged, else why not
    (the position then stands after the last chunk that was). Errors of the read are raised."""
    stream: QueryStream[Chunk] = QueryStream(name, chunks)
    unsettled: deque[tuple[AckTracker, Callable[[], None]]] = deque()
    saved_at = time.monotonic()
    stream.start()
    try:
        while (chunk := await stream.next(read_timeout)) is not None:
            events, passed = await events_of(chunk)
            if not events:
                unsettled.append((AckTracker(), passed))
                continue
            tracker = AckTracker()
            await sender.send(events, tracker)
            unsettled.append((tracker, passed))
            if _advance(unsettled) and time.monotonic() - saved_at > SAVE_INTERVAL_SECONDS:
                await save()
                saved_at = time.monotonic()
    finally:
        stream.stop()
    if unsettled:
        sender.kafka.commit_soon()  # nothing more to send: the last chunks need not wait an interval
    for tracker, _ in unsettled:
        await tracker.drained()
    _advance(unsettled)
    if unsettled:
        tracker = unsettled[0][0]
        return tracker.fatal or tracker.failed or "not acknowledged"
    return None


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
