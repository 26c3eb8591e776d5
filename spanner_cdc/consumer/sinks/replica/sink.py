"""The replica sink: one database transaction per micro-batch.

The transaction records the batch id with the data (``ReplicaMerge.batch``), so a replayed
batch is skipped; with whole transactions (``cut``) it also holds back events past the
consistent cut and records the cut, so the replica is always a consistent cut of the source.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spanner_cdc.consumer.decoded import DecodedEvent
from spanner_cdc.consumer.metrics import ConsumerMetrics
from spanner_cdc.consumer.sinks.contents import BatchContents, by_table
from spanner_cdc.consumer.sinks.replica.cut import ConsistentCut
from spanner_cdc.consumer.sinks.replica.merge import ReplicaMerge
from spanner_cdc.consumer.status import StreamSeen
from spanner_cdc.consumer.streams.catalog import existing_streams


@dataclass(frozen=True)
class ReplicaCommit:
    """What a committed replica batch holds, for observers (the demo's invariant check, tests).

    ``query`` runs SQL on the replica's own connection, after the commit and before the next
    batch, so an observer sees exactly this batch's state.
    """

    batch_id: int
    cut_micros: int | None
    #: Commit timestamps of the events this batch applied (commit → replica latency).
    applied_commits: list[int]
    held: int
    query: Callable[[str], list[tuple[Any, ...]]]

    def has_table(self, table: str) -> bool:
        """Has the replica created ``table`` yet (the cut may not have reached its first change)?"""
        found = self.query(f"SELECT count(*) FROM information_schema.tables WHERE table_name = '{table}'")
        return bool(found[0][0])


@dataclass
class ReplicaSink:
    merge: ReplicaMerge
    metrics: ConsumerMetrics
    #: Spark's checkpoint of the query; its ``metadata`` file holds the query id.
    spark_checkpoint: Path
    #: Whole transactions up to a consistent cut; None applies every batch as it comes.
    cut: ConsistentCut | None = None
    on_commit: Callable[[ReplicaCommit], None] | None = None
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

    def write(self, batch_id: int, contents: BatchContents) -> None:
        """One replica transaction; with whole transactions, only what the cut lets through.
        The database is let go of after each batch (``SqlBackend.release``): stream commands use
        a DuckDB replica between batches."""
        try:
            self._write(batch_id, contents)
        finally:
            self.merge.backend.release()

    def _write(self, batch_id: int, contents: BatchContents) -> None:
        self.metrics.watermarks.inc(len(contents.watermarks))
        query = self.merge.backend.execute
        fresh = contents.fresh
        with self.merge.batch(self.query_id, batch_id) as new:
            if not new:
                return
            if self.cut is None:
                self.merge.write(contents.tables)
                commit = ReplicaCommit(batch_id, None, [e.commit_micros for e in fresh], 0, query)
            else:
                applied: list[int] = []

                def apply(events: list[DecodedEvent], cut: int) -> None:
                    self.merge.write(by_table(events), cut)
                    applied.extend(e.commit_micros for e in events)

                release = self.cut.release(fresh, contents.watermarks, apply)
                if self.merge.history is not None and release.cut_micros is not None:
                    self.merge.history.record(release.cut_micros, release.previous_cut_micros)
                commit = ReplicaCommit(batch_id, release.cut_micros, applied, release.held, query)
                self.metrics.observe_release(release)
                self.metrics.observe_streams(
                    [
                        StreamSeen(s.name, s.table_on, s.mode, s.offset_micros)
                        for s in existing_streams(self.merge.backend)
                    ]
                )
        if self.on_commit is not None:
            self.on_commit(commit)
