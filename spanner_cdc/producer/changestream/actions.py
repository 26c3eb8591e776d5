"""One action per change-stream record type, applied to the partition run that returned it.

Each record also says how far the partition is complete (its watermark): everything before a
data change record's commit timestamp, everything at or before a heartbeat, everything before a
child partition's start.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from spanner_cdc.producer.changestream.release import CommitOrderRelease
from spanner_cdc.producer.lineage.acks import AckTracker
from spanner_cdc.producer.lineage.partitions import Partition, PartitionScheduler, shard_of
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.publish.checkpoints import CheckpointStore
from spanner_cdc.schemas.records import (
    ChangeStreamRecord,
    ChildPartitionsRecord,
    DataChangeRecord,
    HeartbeatRecord,
)

log = logging.getLogger(__name__)


@dataclass
class PartitionRun:
    """One (re)start of a partition's query: its acks, whether it reported children, the
    commits registering them, and the commit of its FINISHED record once sent."""

    partition: Partition
    tracker: AckTracker
    reported_children: bool = False
    registrations: list[asyncio.Future[None]] = field(default_factory=list)
    finished: asyncio.Future[None] | None = None
    #: Its FINISHED record is in the transaction being committed, or in one before: no running
    #: record of the partition may follow it (producer.shards.transaction_checkpoints).
    finish_staged: bool = False

    def registering(self, commit: asyncio.Future[None]) -> None:
        self.registrations.append(_observed(commit))

    def finishing(self, commit: asyncio.Future[None]) -> asyncio.Future[None]:
        """Keep ``commit``, its FINISHED record's, for :meth:`settled`; return it."""
        self.finished = _observed(commit)
        return commit

    def stage_finish(self) -> None:
        self.finish_staged = True

    def raise_failed_registration(self) -> None:
        """DeliveryFailedError now if a registration of this run already failed."""
        for commit in self.registrations:
            if commit.done() and not commit.cancelled() and (error := commit.exception()) is not None:
                raise error

    async def children_registered(self) -> None:
        """Once every registration of this run committed; DeliveryFailedError if one did not."""
        await asyncio.gather(*self.registrations)

    async def settled(self) -> None:
        """Once its registrations and its FINISHED record committed or failed."""
        commits = [*self.registrations, *([self.finished] if self.finished is not None else [])]
        await asyncio.gather(*commits, return_exceptions=True)


@dataclass(frozen=True)
class TableFilter:
    """``--include-tables`` / ``--exclude-tables``: names or globs."""

    include: Sequence[str] = ()
    exclude: Sequence[str] = ()

    def wanted(self, table: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(table, pattern) for pattern in self.include):
            return False
        return not any(fnmatch.fnmatchcase(table, pattern) for pattern in self.exclude)

    def unmatched(self, tables: Sequence[str]) -> list[str]:
        """Patterns that select no table of ``tables``: most likely a typo, worth a warning."""
        return [
            pattern
            for pattern in (*self.include, *self.exclude)
            if not any(fnmatch.fnmatchcase(table, pattern) for table in tables)
        ]


class DataChangeAction:
    """Hold the record for commit-order release (unless its table is filtered out)."""

    def __init__(self, release: CommitOrderRelease, tables: TableFilter, metrics: ProducerMetrics) -> None:
        self.release = release
        self.tables = tables
        self.metrics = metrics

    def apply(self, run: PartitionRun, record: DataChangeRecord) -> None:
        partition = run.partition
        if record.commit_timestamp_micros < partition.watermark_micros:
            # The partition had promised everything up to its watermark: a server bug, and what
            # a checkpoint written since may have skipped. Said loudly, handled anyway.
            self.metrics.late_records.inc()
            log.warning(
                "partition %s returned a change committed at %d after reporting everything up to %d",
                partition.token[:16],
                record.commit_timestamp_micros,
                partition.watermark_micros,
            )
        if self.tables.wanted(record.table_name):
            self.release.hold(record, partition, run.tracker)
        partition.watermark_micros = max(partition.watermark_micros, record.commit_timestamp_micros - 1)


class HeartbeatAction:
    """Everything at or before the heartbeat was returned."""

    @staticmethod
    def apply(run: PartitionRun, record: HeartbeatRecord) -> None:
        run.partition.watermark_micros = max(run.partition.watermark_micros, record.timestamp_micros)


class ChildPartitionsAction:
    """Register the children and send their records at once: a parent may finish only once its
    children are durably known, or a restart could lose them (``PartitionRunner`` waits for
    :meth:`PartitionRun.children_registered` before it finishes one). The query reads on
    meanwhile: the children of the answers that follow — a split's children come in one answer
    each — join the same commit, or the next, instead of each waiting for its own.

    The parent's own record goes in the same transaction or one before it (``CheckpointStore.due``:
    the transaction that carries the children carries it — its FINISHED record, when the parent
    finishes in that one — unless the commit then in flight already did): a restart that finds
    the children finds their parent too. Without it a
    process killed after the children's commit and before the parent's first record restored
    children whose parent it had never heard of, and waited for it forever. The parent's record
    is not written here with its checkpoint of now: sent behind a commit in flight, it would
    land after that commit's newer checkpoint and set it back."""

    def __init__(self, scheduler: PartitionScheduler, checkpoints: CheckpointStore) -> None:
        self.scheduler = scheduler
        self.checkpoints = checkpoints

    def apply(self, run: PartitionRun, record: ChildPartitionsRecord) -> None:
        partition = run.partition
        run.reported_children = True
        partition.watermark_micros = max(partition.watermark_micros, record.start_timestamp_micros - 1)
        added = self.scheduler.register_children(record, partition.token)
        if added:  # by the parent's writer: a process that lost the parent can register nothing
            self.checkpoints.make_due(partition.token)
            run.registering(self.checkpoints.send(added, shard_of(partition.token, self.scheduler.shards)))


class RecordActions:
    """Dispatch by record type."""

    def __init__(
        self, data_change: DataChangeAction, heartbeat: HeartbeatAction, children: ChildPartitionsAction
    ) -> None:
        self.data_change = data_change
        self.heartbeat = heartbeat
        self.children = children

    def apply(self, run: PartitionRun, record: ChangeStreamRecord) -> None:
        if isinstance(record, DataChangeRecord):
            self.data_change.apply(run, record)
        elif isinstance(record, HeartbeatRecord):
            self.heartbeat.apply(run, record)
        else:
            self.children.apply(run, record)


def _observed(commit: asyncio.Future[None]) -> asyncio.Future[None]:
    """``commit``, its failure observed as it happens: a run stopped (at shutdown, at a shard's
    handover) before it waits for its commits has nobody to tell."""
    commit.add_done_callback(lambda done: done.cancelled() or done.exception())
    return commit
