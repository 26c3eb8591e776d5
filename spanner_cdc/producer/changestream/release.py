"""Commit-order release: held data change records go to the publisher once the low watermark
passes them — with ``--group`` the whole group's (PartitionScheduler.release_bound_micros); the
buffer and the reasons are in ``producer.lineage.ordering`` — or, with
``--release-order partition``, as soon as they are read: commit order within each partition only,
and no wait for the other partitions' heartbeats (docs/producer.md, Performance).

Every release runs under one lock, so a watermark or a shutdown never sees a release half done:
a record taken from the buffer but not yet handed to Kafka would be in neither place, and a
watermark or checkpoint computed then could pass it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from spanner_cdc.producer.lineage.acks import AckTracker
from spanner_cdc.producer.lineage.ordering import CommitOrderBuffer
from spanner_cdc.producer.lineage.partitions import Partition, PartitionScheduler, shard_of
from spanner_cdc.producer.publish.publisher import EventPublisher
from spanner_cdc.schemas.records import DataChangeRecord

#: Records held before partitions ahead of the low watermark pause (back-pressure).
MAX_HELD_RECORDS = 100_000
_POLL_SECONDS = 0.02


class CommitOrderRelease:
    def __init__(
        self, scheduler: PartitionScheduler, publisher: EventPublisher, *, across_partitions: bool
    ) -> None:
        self.scheduler = scheduler
        self.publisher = publisher
        #: Wait for the low watermark (every key's changes in commit order), or release what
        #: each partition read at once (``--release-order partition``).
        self.across_partitions = across_partitions
        self.buffer = CommitOrderBuffer()
        self._lock = asyncio.Lock()

    def hold(self, record: DataChangeRecord, partition: Partition, tracker: AckTracker) -> None:
        self.buffer.hold(record, partition, tracker)

    def oldest(self, tracker: AckTracker) -> int | None:
        """The commit time of the oldest record held of ``tracker``'s run, or None."""
        return self.buffer.oldest(tracker)

    def next_commit(self) -> int | None:
        """The commit time of the next record to release, or None when nothing is held."""
        return self.buffer.next_commit()

    def discard(self, tracker: AckTracker) -> None:
        """Drop what is held of ``tracker``'s run (it is read again from its checkpoint)."""
        self.buffer.discard(tracker)

    async def release(self) -> None:
        """Publish held records the low watermark has passed, in commit order."""
        if not len(self.buffer):
            return
        async with self._lock:
            await self.release_locked()

    async def release_locked(self) -> None:
        """The same, for a caller already inside :meth:`locked`."""
        up_to = self.scheduler.release_bound_micros() if self.across_partitions else None
        while (held := self.buffer.ready(up_to)) is not None:
            shard = shard_of(held.partition.token, self.scheduler.shards)
            await self.publisher.publish(held.record, held.partition.query_token, held.tracker, shard)
            self.buffer.published(held)

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """No release runs inside this block."""
        async with self._lock:
            yield

    async def wait_published(self, tracker: AckTracker) -> None:
        """After a query ended: wait until the other partitions' progress released its records."""
        while self.buffer.holds(tracker):
            await self.release()
            await asyncio.sleep(_POLL_SECONDS)

    async def wait_for_room(self, partition: Partition) -> None:
        """Back-pressure: while too much is held, partitions ahead of the low watermark pause.

        The partitions holding the low watermark back never wait, so the buffer always drains.
        """
        while len(self.buffer) > MAX_HELD_RECORDS:
            low = self.scheduler.low_watermark_micros()
            if low is None or partition.watermark_micros <= low:
                return
            await self.release()
            await asyncio.sleep(_POLL_SECONDS)
