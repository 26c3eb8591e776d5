"""One micro-batch, start to finish: decode, quarantine, dedupe, order, write every sink.

The order of writes is what makes a crash at any point harmless. Spark replays an unfinished
batch with the same offsets, and every step repeats its first attempt's result:

1. changelog files and the quarantine file are named by batch id and replaced whole;
2. the replica transaction records the batch id with the data — and, with whole
   transactions, with the held events, watermarks and cut (consumer.replica.cut) — and
   skips a batch it has;
3. the delivered-uuid memory is saved last, tagged with the batch id; once it has the batch,
   a replay is skipped entirely.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from spanner_cdc.consumer.change_rows import TableChanges
from spanner_cdc.consumer.changelog import ChangelogSink
from spanner_cdc.consumer.decode import (
    BatchDecoder,
    DecodedEvent,
    Quarantined,
    WatermarkSeen,
    quarantine_table,
)
from spanner_cdc.consumer.dedupe import DeliveredChanges
from spanner_cdc.consumer.errors import BadMessageError
from spanner_cdc.consumer.metrics import ConsumerMetrics
from spanner_cdc.consumer.parquet_files import batch_file_name, write_atomically
from spanner_cdc.consumer.replica.cut import ConsistentCut
from spanner_cdc.consumer.replica.merge import ReplicaMerge

log = logging.getLogger("spanner_cdc.consumer")


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
class BatchProcessor:
    decoder: BatchDecoder
    delivered: DeliveredChanges
    changelog: ChangelogSink | None
    replica: ReplicaMerge | None
    quarantine_dir: Path
    fail_on_bad_message: bool
    metrics: ConsumerMetrics
    #: Spark's checkpoint of the query; its ``metadata`` file holds the query id.
    spark_checkpoint: Path
    #: Whole transactions up to a consistent cut; None applies every batch as it comes.
    cut: ConsistentCut | None = None
    on_replica_commit: Callable[[ReplicaCommit], None] | None = None
    _query_id: str | None = None

    @property
    def query_id(self) -> str:
        """Spark's id for the query, kept in its checkpoint across restarts (the replica's marker key).

        Spark writes it before the first micro-batch, so it is there when a batch runs; it never
        changes for a checkpoint, so it is read once.
        """
        if self._query_id is None:
            self._query_id = str(json.loads((self.spark_checkpoint / "metadata").read_text())["id"])
        return self._query_id

    def __call__(self, batch: Any, batch_id: int) -> None:
        """The ``foreachBatch`` function: a Spark DataFrame of Kafka rows and its batch id."""
        self.process(batch.select("key", "value", "topic", "partition", "offset").toArrow(), batch_id)

    def process(self, rows: pa.Table, batch_id: int) -> None:
        started = time.monotonic()
        if self.delivered.committed(batch_id):
            self.metrics.batches.labels("replayed-skipped").inc()
            log.info("batch %d was already written by an earlier attempt; skipped", batch_id)
            return
        decoded = self.decoder.decode(rows)
        events, quarantined = decoded.events, decoded.quarantined
        if quarantined and self.fail_on_bad_message:
            first = quarantined[0]
            raise BadMessageError(
                f"{first.topic}[{first.partition}] offset {first.offset}: {first.reason} ({first.detail}); "
                f"{len(quarantined)} undecodable message(s) in batch {batch_id}"
            )
        fresh = self._deduplicate(batch_id, events)
        horizon = self.delivered.oldest_remembered(batch_id)
        beyond_horizon = sum(1 for e in fresh if horizon is not None and e.commit_micros < horizon)
        tables = _by_table(fresh)
        if self.changelog is not None:
            for changes in tables:
                self.changelog.write(batch_id, changes)
        if self.replica is not None:
            self._write_replica(batch_id, fresh, tables, decoded.watermarks)
        if quarantined:
            write_atomically(self.quarantine_dir / batch_file_name(batch_id), quarantine_table(quarantined))
        self.delivered.remember(batch_id, [e.record["uuid"] for e in fresh], [e.commit_micros for e in fresh])
        self.metrics.duplicates.inc(len(events) - len(fresh))
        self._observe(batch_id, fresh, quarantined, beyond_horizon, time.monotonic() - started)

    def _write_replica(
        self,
        batch_id: int,
        fresh: list[DecodedEvent],
        tables: list[TableChanges],
        watermarks: list[WatermarkSeen],
    ) -> None:
        """One replica transaction; with whole transactions, only what the cut lets through."""
        assert self.replica is not None
        self.metrics.watermarks.inc(len(watermarks))
        query = self.replica.backend.execute
        with self.replica.batch(self.query_id, batch_id) as new:
            if not new:
                return
            if self.cut is None:
                self.replica.write(tables)
                commit = ReplicaCommit(batch_id, None, [e.commit_micros for e in fresh], 0, query)
            else:
                release = self.cut.release(fresh, watermarks)
                self.replica.write(tables if release.events is fresh else _by_table(release.events))
                applied = [e.commit_micros for e in release.events]
                commit = ReplicaCommit(batch_id, release.cut_micros, applied, release.held, query)
                self.metrics.observe_release(release)
        if self.on_replica_commit is not None:
            self.on_replica_commit(commit)

    def _deduplicate(self, batch_id: int, events: list[DecodedEvent]) -> list[DecodedEvent]:
        keep = self.delivered.fresh(
            batch_id, [e.record["uuid"] for e in events], [e.commit_micros for e in events]
        )
        return [event for event, kept in zip(events, keep, strict=True) if kept]

    def _observe(
        self,
        batch_id: int,
        fresh: list[DecodedEvent],
        quarantined: list[Quarantined],
        beyond_horizon: int,
        seconds: float,
    ) -> None:
        metrics = self.metrics
        metrics.batches.labels("written").inc()
        metrics.batch_seconds.observe(seconds)
        metrics.beyond_horizon.inc(beyond_horizon)
        counts = Counter((e.record["object"], e.record["source_metadata"]["change_type"]) for e in fresh)
        for (table, change_type), count in counts.items():
            metrics.events.labels(table, change_type).inc(count)
        for reason, count in Counter(q.reason for q in quarantined).items():
            metrics.quarantined.labels(reason).inc(count)
            log.warning("batch %d: quarantined %d message(s): %s", batch_id, count, reason)
        if fresh:
            newest = max(e.commit_micros for e in fresh)
            metrics.commit_lag.set(max(0.0, time.time() - newest / 1_000_000))
        if beyond_horizon:
            log.warning(
                "batch %d: %d event(s) older than the dedupe horizon were delivered without a uuid check",
                batch_id,
                beyond_horizon,
            )


def _by_table(events: list[DecodedEvent]) -> list[TableChanges]:
    grouped: dict[str, list[DecodedEvent]] = defaultdict(list)
    for event in events:
        grouped[event.record["object"]].append(event)
    return [TableChanges(table, grouped[table]) for table in sorted(grouped)]
