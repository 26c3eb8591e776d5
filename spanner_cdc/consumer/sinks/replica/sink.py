"""The replica sink: one database transaction per micro-batch.

The transaction records the batch id with the data (``ReplicaMerge.batch``), so a replayed
batch is skipped; with whole transactions (``cut``) it also holds back events past the
consistent cut and records the cut, so the replica is always a consistent cut of the source.
The batch's stage rows were built by the tasks that decoded its events (stage/rows.py); the driver
hands them to the database, or the tasks loaded them into a PostgreSQL replica themselves
(stage/loaded.py: their tables go with the batch's transaction).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from spanner_cdc.consumer.decode.decoded import WatermarkSeen
from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.metrics import ConsumerMetrics
from spanner_cdc.consumer.sinks.parquet_files import batch_file_name
from spanner_cdc.consumer.sinks.replica.backends import SqlBackend
from spanner_cdc.consumer.sinks.replica.cut import ConsistentCut, Slice
from spanner_cdc.consumer.sinks.replica.history import RowHistory
from spanner_cdc.consumer.sinks.replica.names import quote_all
from spanner_cdc.consumer.sinks.replica.stage.held import HeldStageRows
from spanner_cdc.consumer.sinks.replica.stage.loaded import StagedTables, batch_prefix, query_prefix
from spanner_cdc.consumer.sinks.replica.stage.rows import (
    ReplicaStaging,
    StagedEvents,
    StagedPart,
    combined,
    parts_of_events,
)
from spanner_cdc.consumer.sinks.replica.stopped import StoppedTables
from spanner_cdc.consumer.status import StreamSeen

log = logging.getLogger("spanner_cdc.consumer")


@dataclass(frozen=True)
class BatchContents:
    """What one micro-batch hands the replica."""

    #: Events delivered for the first time (duplicates dropped): outline rows
    #: (consumer.decode.outline_rows), which carry no event bytes (those are in ``messages``).
    fresh: pa.Table
    #: The stage rows the batch's tasks staged: of every event they read, duplicates too.
    staged: list[StagedPart]
    #: Those events' Kafka messages (``stage.rows.MESSAGES_SCHEMA``), which the cut holds.
    messages: pa.Table
    watermarks: list[WatermarkSeen]
    #: Held events' Kafka rows (``kafka_rows.DECODE_SCHEMA``) staged again, when the cut passes them.
    stage_held: Callable[[pa.Table], StagedEvents]
    #: The micro-batch's Spark session (a store Spark writes writes with it).
    spark: Any


@dataclass(frozen=True)
class ReplicaCommit:
    """What a committed replica batch holds, for observers (the demo's invariant check, tests).

    ``query`` runs SQL (names in double quotes) on the replica, after the commit and before
    the next batch, so an observer sees exactly this batch's state.
    """

    batch_id: int
    cut_micros: int | None
    #: Commit timestamps of the events this batch applied (commit → replica latency).
    applied_commits: list[int]
    held: int
    query: Callable[[str], list[tuple[Any, ...]]]
    #: Has the replica created the table yet (the cut may not have reached its first change)?
    has_table: Callable[[str], bool]


class ReplicaStore(Protocol):
    """Where the replica's tables are, and how a batch's slices are merged into them: one SQL
    database (merge.ReplicaMerge) or Delta tables (sinks.lakehouse)."""

    @property
    def backend(self) -> SqlBackend:
        """The replica's bookkeeping (and, for the SQL replicas, its tables)."""
        ...

    @property
    def history(self) -> RowHistory | None:
        """The row history streams read; None keeps none."""
        ...

    @property
    def stopped(self) -> StoppedTables: ...

    def batch(self, query_id: str, batch_id: int, spark: Any) -> AbstractContextManager[bool]:
        """The batch's transaction; yields False for a batch the store has (a replay)."""
        ...

    def write(self, parts: Sequence[StagedPart], cut: int | None = None) -> None: ...

    def query(self, sql: str) -> list[tuple[Any, ...]]: ...

    def has_table(self, table: str) -> bool: ...

    def release(self) -> None:
        """Let other processes use the replica between batches."""
        ...

    def close(self) -> None: ...


@dataclass
class ReplicaSink:
    merge: ReplicaStore
    metrics: ConsumerMetrics
    #: Spark's checkpoint of the query; its ``metadata`` file holds the query id.
    spark_checkpoint: Location
    #: Where the tasks stage each batch's stage rows (a directory per batch).
    staging_root: Location
    #: Whole transactions up to a consistent cut; None applies every batch as it comes.
    cut: ConsistentCut | None = None
    on_commit: Callable[[ReplicaCommit], None] | None = None
    #: The PostgreSQL replica's connection string when the tasks load the stage rows they built
    #: (stage/loaded.py); None: the driver loads them.
    tasks_load_with: str | None = None
    #: The streams over the replica, as the status page shows them after each batch (they live in
    #: the replica database; ``consumer.streams`` reads them).
    streams_seen: Callable[[], list[StreamSeen]] = list
    _query_id: str | None = None

    @property
    def query_id(self) -> str:
        """Spark's id for the query, kept in its checkpoint across restarts (the batch marker's key).

        Spark writes it before the first micro-batch, so it is there when a batch runs; it never
        changes for a checkpoint, so it is read once.
        """
        if self._query_id is None:
            self._query_id = str(json.loads((self.spark_checkpoint / "metadata").read_text())["id"])
        return self._query_id

    def staging(self, batch_id: int) -> ReplicaStaging:
        """Where the tasks stage ``batch_id``'s stage rows; removed once the batch is written."""
        return ReplicaStaging(self.staging_root / batch_file_name(batch_id).removesuffix(".parquet"))

    def staged_tables(self, batch_id: int) -> StagedTables | None:
        """Where ``batch_id``'s tasks load their stage rows in the database; None: they do not."""
        if self.tasks_load_with is None:
            return None
        return StagedTables(self.tasks_load_with, self.query_id, batch_id)

    @property
    def held_rows(self) -> HeldStageRows:
        """The stage rows of held events, kept from the batches that staged them."""
        return HeldStageRows(self.staging_root / "held")

    def clear_staging(self) -> None:
        """Remove whatever earlier runs staged (a batch staged before a crash, committed or not:
        a replay stages it again)."""
        self.staging_root.delete_tree()
        self._drop_staged_tables(query_prefix(self.query_id))

    def write(self, batch_id: int, contents: BatchContents) -> None:
        """One replica transaction; with whole transactions, only what the cut lets through.
        The database is let go of after each batch (``SqlBackend.release``): stream commands use
        a DuckDB replica between batches."""
        try:
            self._write(batch_id, contents)
        finally:
            self.merge.release()

    def _write(self, batch_id: int, contents: BatchContents) -> None:
        self.metrics.watermarks.inc(len(contents.watermarks))
        commit = None
        with self.merge.batch(self.query_id, batch_id, contents.spark) as new:
            if new:
                commit = self._apply(batch_id, contents)
            self._drop_staged_tables(batch_prefix(self.query_id, batch_id))
        for table, changes in self.merge.stopped.skipped_in_batch().items():
            self.metrics.stopped_changes.labels(table).inc(changes)
            log.warning(
                "batch %d: table %s is stopped in the replica: %d change(s) not applied",
                batch_id,
                table,
                changes,
            )
        if commit is not None and self.on_commit is not None:
            self.on_commit(commit)

    def _apply(self, batch_id: int, contents: BatchContents) -> ReplicaCommit:
        """The batch's merge (or, with whole transactions, what the cut lets through)."""
        query, has_table = self.merge.query, self.merge.has_table
        fresh = contents.fresh
        if self.cut is None:
            self.merge.write(combined(parts_of_events(contents.staged, fresh)))
            return ReplicaCommit(batch_id, None, _commits(fresh), 0, query, has_table)
        applied: list[int] = []

        def apply(piece: Slice, cut: int) -> None:
            held = piece.held.parts if piece.held is not None else []
            parts = [*parts_of_events(contents.staged, piece.fresh), *held]
            self.merge.write(combined(parts), cut)
            applied.extend(_commits(piece.rows))

        held_rows = self.held_rows
        stage_held = held_rows.staging_with(contents.stage_held)
        release = self.cut.release(fresh, contents.messages, contents.watermarks, apply, stage_held)
        if self.merge.history is not None and release.cut_micros is not None:
            self.merge.history.record(release.cut_micros, release.previous_cut_micros)
        held_rows.keep(batch_id, release.newly_held, contents.staged)
        self.metrics.observe_release(
            release.cut_micros, release.held, release.incomplete_transactions, release.behind_cut
        )
        self.metrics.observe_streams(self.streams_seen())
        return ReplicaCommit(batch_id, release.cut_micros, applied, release.held, query, has_table)

    def _drop_staged_tables(self, prefix: str) -> None:
        """Drop the tables the tasks loaded whose names begin with ``prefix`` (stage/loaded.py)."""
        if self.tasks_load_with is None:
            return
        backend = self.merge.backend
        found = backend.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND left(tablename, ?) = ?",
            [len(prefix), prefix],
        )
        if found:
            backend.execute("DROP TABLE " + quote_all([str(name) for (name,) in found]))


def _commits(events: pa.Table) -> list[int]:
    commits: list[int] = events.column("commit_micros").to_pylist()
    return commits
