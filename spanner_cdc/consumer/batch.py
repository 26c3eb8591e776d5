"""One micro-batch, start to finish: decode, quarantine, dedupe, order, write every sink.

Spark's executors do the per-event work (consumer.tasks): every task reads its share of
the batch's Kafka rows through the one gate (consumer.decode.gate), writes the changelog's
files and the replica's stage rows of what it read, and hands the driver an outline — one
narrow row per message (consumer.decode.outline_rows). The driver deduplicates on it, checks
watermarks, publishes the changelog's files and hands the kept stage rows to the replica's one
database transaction (docs/consumer.md, "Where the work runs").

The order of writes is what makes a crash at any point harmless. Spark replays an unfinished
batch with the same offsets, and every step repeats its first attempt's result:

1. changelog and quarantine files are named by batch id (and task) and replaced whole;
2. the replica transaction records the batch id with the data — and, with whole
   transactions, with the held events, watermarks and cut (consumer.sinks.replica.cut) — and
   skips a batch it has;
3. the delivered-uuid memory is saved last, tagged with the batch id; once it has the batch,
   a replay is skipped entirely.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle
from pyspark.sql.pandas.types import from_arrow_schema

from spanner_cdc.consumer.decode.decoded import DecodedBatch, Quarantined, Unknown
from spanner_cdc.consumer.decode.driver import BatchDecoder
from spanner_cdc.consumer.decode.gate import DecodeContext
from spanner_cdc.consumer.decode.kafka_rows import DECODE_COLUMNS
from spanner_cdc.consumer.decode.outline_rows import (
    COORDINATES,
    EVENT,
    OUTLINE_SCHEMA,
    QUARANTINED,
    TOMBSTONE,
    UNKNOWN_COLUMNS,
    WATERMARK,
    unknown_from_columns,
    watermarks_from_rows,
)
from spanner_cdc.consumer.dedupe import DeliveredChanges
from spanner_cdc.consumer.errors import BadMessageError, ChangelogShortfallError
from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.metrics import ConsumerMetrics
from spanner_cdc.consumer.sinks.changelog import ChangelogSink
from spanner_cdc.consumer.sinks.quarantine import QuarantineSink
from spanner_cdc.consumer.sinks.replica.sink import BatchContents, ReplicaSink
from spanner_cdc.consumer.sinks.replica.stage.loaded import StagedTables
from spanner_cdc.consumer.sinks.replica.stage.rows import ReplicaStaging, StagedEvents
from spanner_cdc.consumer.spark.data_loss import DataLossCounter
from spanner_cdc.consumer.spark.offsets_log import OffsetsLog
from spanner_cdc.consumer.status import BatchSeen
from spanner_cdc.consumer.tasks import STAGED_OUTLINE_SCHEMA, drop_from_staged, outline, staged_outline
from spanner_cdc.schemas.timestamps import now_micros, seconds_behind

log = logging.getLogger("spanner_cdc.consumer")
#: Held events the driver reads again itself when the consistent cut passes them (those whose
#: stage rows were not kept from the batch that held them: sinks.replica.stage.held, after a
#: restart); more are read by Spark tasks, so the driver's share stays this small however fast
#: events come. Below it a job gains nothing: up to 20,000 held events the driver read them as
#: fast as tasks did, at 50,000 tasks were faster; with this at 2,000, the bench's DuckDB
#: replica with whole transactions was slower.
DRIVER_READS_HELD = 10_000


@dataclass(frozen=True)
class Outline:
    """A batch as its tasks outlined it (``decode.outline_rows.OUTLINE_SCHEMA``), on the driver."""

    rows: pa.Table

    def of_kind(self, kind: str) -> pa.Table:
        return self.rows.filter(pc.equal(self.rows.column("kind"), kind))

    @property
    def events(self) -> pa.Table:
        return self.of_kind(EVENT)

    def quarantined(self) -> list[Quarantined]:
        """Coordinates and reasons; the bytes are in the files the tasks staged."""
        rows = self.of_kind(QUARANTINED).select([*COORDINATES, "reason", "detail"])
        return [
            Quarantined(r["topic"], r["partition"], r["offset"], None, None, r["reason"], r["detail"])
            for r in rows.to_pylist()
        ]

    def unknown(self) -> list[Unknown]:
        """Each schema, registry id or table version named by quarantined messages that the
        driver may learn, once however many messages (and tasks) named it."""
        names = self.of_kind(QUARANTINED).select(UNKNOWN_COLUMNS)
        given = functools.reduce(pc.or_, (pc.is_valid(names.column(c)) for c in UNKNOWN_COLUMNS))
        named = names.filter(given)
        distinct = named.group_by(UNKNOWN_COLUMNS, use_threads=False).aggregate([])
        return [unknown_from_columns(row) for row in distinct.to_pylist()]

    def decoded(self) -> DecodedBatch:
        """Watermarks (as the tasks read them) and the quarantine's rows — coordinates and
        reasons, for the metrics and ``--on-bad-message fail``; their bytes are in the files the
        tasks staged. Events stay with the tasks."""
        watermarks = watermarks_from_rows(self.of_kind(WATERMARK))
        return DecodedBatch([], watermarks, self.quarantined(), len(self.of_kind(TOMBSTONE)))


@dataclass
class ContextBroadcast:
    """A batch's :class:`DecodeContext` as the tasks get it: its lookups (schema texts, table
    versions, refused fingerprints, registry ids) broadcast by Spark, once to each executor,
    and sent again only when the driver has learnt something. With thousands of tables the
    lookups are tens of MB; in the task's closure they were pickled again for every batch
    (Spark broadcasts a closure over 1 MB once per job) and unpickled by every task, which
    made a batch about half as slow again as broadcast."""

    _sent: Any = None
    _lookups: DecodeContext | None = None

    def share(self, spark_context: Any, context: DecodeContext) -> Any:
        """The broadcast holding ``context``'s lookups (``now_micros`` left out: it changes
        every batch, and the task is given it apart)."""
        lookups = replace(context, now_micros=0)
        if lookups != self._lookups:
            if self._sent is not None:
                self._sent.unpersist()  # the executors' copies; no running task reads it any more
            self._sent, self._lookups = spark_context.broadcast(CloudPickled(lookups)), lookups
        return self._sent


@dataclass(frozen=True)
class CloudPickled:
    """A value that pickles through cloudpickle. Spark pickles broadcasts with the standard
    pickle, which cannot pickle the converters a JSON table version holds (functions made per
    column); cloudpickle, which Spark pickles tasks with, can. Unpickled, it is the value
    itself — once per executor process, where the broadcast keeps it."""

    value: Any

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return cloudpickle.loads, (cloudpickle.dumps(self.value),)  # type: ignore[no-untyped-call]  # pyspark ships it untyped


#: A batch that planned to read at most this many offsets is read in as many tasks as the
#: session has task slots. Spark's Kafka source makes a task of each partition with new offsets
#: — with watermark records in every partition, every partition of every event topic, each
#: batch — and a task costs its scheduling and its Python worker's round trip whatever it reads:
#: at a few dozen events a batch that was most of the batch (docs/consumer.md, Latency). Not
#: for larger batches: Spark groups partitions into fewer tasks by count, not size, and one
#: busy topic's partitions grouped together would read in fewer tasks than slots.
SMALL_BATCH_OFFSETS = 5_000


@dataclass(frozen=True)
class Staging:
    """Where an outlining job's tasks stage their outline, and what they write besides it
    (None: nothing)."""

    #: The job's outline files (consumer.tasks.stage_outline), read by the driver.
    outline: Location
    changelog: ChangelogSink | None = None
    quarantine: Location | None = None
    replica: ReplicaStaging | None = None
    #: The events' Kafka messages beside their replica stage rows: what the consistent cut holds.
    replica_messages: bool = True
    #: Where the tasks load their replica stage rows in the database (None: the driver does).
    replica_tables: StagedTables | None = None

    def clear(self) -> None:
        """What an earlier attempt staged, or this job before it learnt a schema."""
        self.outline.delete_tree()
        if self.changelog is not None:
            self.changelog.clear()
        if self.quarantine is not None:
            self.quarantine.delete_tree()
        if self.replica is not None:
            self.replica.clear()


@dataclass
class BatchProcessor:
    decoder: BatchDecoder
    delivered: DeliveredChanges
    #: Written by the executors, first.
    changelog: ChangelogSink | None
    #: Merged from the driver, after the changelog, from the stage rows the tasks staged; its
    #: transaction records the batch id, so a replay of the same batch id is harmless.
    replica: ReplicaSink | None
    quarantine: QuarantineSink
    #: Where the tasks stage each batch's outline rows (consumer.tasks.stage_outline).
    outlines: Location
    #: The query's offsets log: how much each batch planned to read.
    offsets: OffsetsLog
    fail_on_bad_message: bool
    metrics: ConsumerMetrics
    #: With --fail-on-data-loss false: counts what Kafka no longer had of each batch's range.
    data_loss: DataLossCounter | None = None
    #: The first batch after a start is the only one that can be a replay (see ChangelogSink).
    _started: bool = False
    _context: ContextBroadcast = field(default_factory=ContextBroadcast)

    def __call__(self, batch: Any, batch_id: int) -> None:
        """The ``foreachBatch`` function: a Spark DataFrame of Kafka rows and its batch id."""
        started = time.monotonic()
        if self.delivered.committed(batch_id):
            self.metrics.batches.labels("replayed-skipped").inc()
            log.info("batch %d was already written by an earlier attempt; skipped", batch_id)
            return
        rows = batch.select(*DECODE_COLUMNS)
        span = self.offsets.planned_span(batch_id)
        if span is not None and span <= SMALL_BATCH_OFFSETS:
            rows = rows.coalesce(rows.sparkSession.sparkContext.defaultParallelism)
        self._process(rows, batch_id, started)

    def _process(self, rows: Any, batch_id: int, started: float) -> None:
        if not self._started:  # the first batch after a start is the only one that can be a replay
            self.quarantine.remove_batch(batch_id)
            self.quarantine.discard_staged(batch_id)  # an earlier run's; this run's jobs clear their own
            if self.changelog is not None:
                self.changelog.remove_batch(batch_id)
            if self.replica is not None:
                self.replica.clear_staging()
        staging = Staging(
            self.outlines / f"batch-{batch_id}",
            self.changelog.staging(batch_id) if self.changelog is not None else None,
            None if self.fail_on_bad_message else self.quarantine.staging(batch_id),
            self.replica.staging(batch_id) if self.replica is not None else None,
            replica_tables=self.replica.staged_tables(batch_id) if self.replica is not None else None,
        )
        context, outlined = self._read(rows, self.decoder.start_batch(), batch_id, staging)
        if self.data_loss is not None:
            self.metrics.lost_offsets.inc(self.data_loss.count(batch_id, outlined.rows))
        decoded = outlined.decoded()
        watermarks, refuted = self.decoder.refuted(decoded.watermarks, context)
        quarantined = sorted([*decoded.quarantined, *refuted], key=lambda q: (q.topic, q.partition, q.offset))
        if quarantined and self.fail_on_bad_message:
            first = quarantined[0]
            raise BadMessageError(
                f"{first.topic}[{first.partition}] offset {first.offset}: {first.reason} ({first.detail}); "
                f"{len(quarantined)} undecodable message(s) in batch {batch_id}"
            )
        events = outlined.events
        keep = self.delivered.fresh(batch_id, events)
        fresh = events.filter(keep)
        duplicates = events.filter(pc.invert(keep)).select(list(COORDINATES))
        if self.changelog is not None:
            self._write_changelog(self.changelog, rows, duplicates, batch_id, kept=per_table(fresh))
        self._started = True
        if self.replica is not None:
            staged = self.replica.staging(batch_id)
            tables = staging.replica_tables
            stage_held = self._held_stager(rows.sparkSession, context, batch_id, staged, tables)
            contents = BatchContents(
                fresh, staged.read(), staged.messages(), watermarks, stage_held, rows.sparkSession
            )
            self.replica.write(batch_id, contents)
            staged.clear()
        self.quarantine.publish(batch_id, refuted)
        horizon = self.delivered.oldest_remembered(batch_id)
        self.delivered.remember(batch_id, fresh)
        self.metrics.tombstones.inc(decoded.tombstones)
        seen = BatchSeen(
            batch_id,
            fresh.num_rows,
            events.num_rows - fresh.num_rows,
            len(quarantined),
            time.monotonic() - started,
            now_micros(),
        )
        self._observe(seen, fresh, quarantined, horizon)

    def _read(
        self, rows: Any, context: DecodeContext, batch_id: int, staging: Staging
    ) -> tuple[DecodeContext, Outline]:
        """The tasks' outline of ``rows`` (Kafka rows, a Spark DataFrame) and the context it was
        read with: read again, once, with what the driver learnt if messages named something
        the context lacked."""
        outlined = self._outline(rows, context, batch_id, staging)
        unknown = outlined.unknown()
        learnt = self.decoder.learn(context, unknown) if unknown else None
        if learnt is None:
            return context, outlined
        return learnt, self._outline(rows, learnt, batch_id, staging)

    def _outline(self, rows: Any, context: DecodeContext, batch_id: int, staging: Staging) -> Outline:
        staging.clear()
        task = outline(
            self._context.share(rows.sparkSession.sparkContext, context),
            context.now_micros,
            batch_id,
            outlines=staging.outline,
            staging=staging.changelog.root if staging.changelog is not None else None,
            quarantine=staging.quarantine,
            replica=staging.replica.root if staging.replica is not None else None,
            replica_messages=staging.replica_messages,
            replica_tables=staging.replica_tables,
        )
        staged = rows.mapInArrow(task, from_arrow_schema(STAGED_OUTLINE_SCHEMA)).toArrow()
        found = Outline(
            staged_outline(staging.outline, staged.cast(STAGED_OUTLINE_SCHEMA)).cast(OUTLINE_SCHEMA)
        )
        staging.outline.delete_tree()  # read: the outline is the driver's now
        return found

    def _held_stager(
        self,
        spark: Any,
        context: DecodeContext,
        batch_id: int,
        staged: ReplicaStaging,
        tables: StagedTables | None,
    ) -> Callable[[pa.Table], StagedEvents]:
        """How the batch stages held events again when the consistent cut passes them
        (sinks.replica.cut): read by Spark tasks from their Kafka rows, as the batch's own. With
        the default trigger and watermark interval (1 s each) a steady stream holds nearly every
        event once, and when one partition's watermarks lag or stop the batch that brings the
        watermark releases the whole backlog; read again on the driver, that was per-event work in
        one Python thread, however large the cluster (docs/consumer.md, "Where the work runs"). A
        few (:data:`DRIVER_READS_HELD`) are read on the driver, where a job costs more than they do."""
        jobs = itertools.count()

        def stage(held: pa.Table) -> StagedEvents:
            if held.num_rows <= DRIVER_READS_HELD:
                return StagedEvents.of(self.decoder.read(held, context)[1])
            job = next(jobs)
            staging = ReplicaStaging(staged.root / f"held-{job}")
            held_staging = Staging(  # their messages are held already
                self.outlines / f"batch-{batch_id}-held-{job}",
                replica=staging,
                replica_messages=False,
                replica_tables=tables.for_job(f"h{job}") if tables is not None else None,
            )
            _, outlined = self._read(spark.createDataFrame(held), context, batch_id, held_staging)
            return StagedEvents(outlined.rows, staging.read())

        return stage

    def _write_changelog(
        self, changelog: ChangelogSink, rows: Any, duplicates: pa.Table, batch_id: int, *, kept: Counter[str]
    ) -> None:
        """Publish the files the tasks staged, once they hold exactly the ``kept`` events: a batch
        with duplicates (after a producer restart) first has their rows removed from the staged
        files by tasks, one per file, by Kafka coordinates — nothing is read or decoded again.
        The rows are checked from the files' footers before anything is published."""
        staged = changelog.staging(batch_id)
        files = staged.files()
        if duplicates.num_rows and files:
            names = [(file.relative_to(staged.root),) for file in files]
            listed = rows.sparkSession.createDataFrame(names, "file string")
            listed.mapInArrow(drop_from_staged(staged.root, duplicates), listed.schema).collect()
        check_written(batch_id, kept, staged.rows_per_table())
        changelog.publish(staged)

    def _observe(
        self, seen: BatchSeen, fresh: pa.Table, quarantined: list[Quarantined], horizon: int | None
    ) -> None:
        batch_id = seen.batch_id
        metrics = self.metrics
        reasons = Counter(q.reason for q in quarantined)
        metrics.observe_batch(seen, reasons)
        metrics.duplicates.inc(seen.duplicates)
        metrics.batches.labels("written").inc()
        metrics.batch_seconds.observe(seen.seconds)
        commits = fresh.column("commit_micros")
        beyond_horizon = 0 if horizon is None else pc.sum(pc.less(commits, horizon)).as_py() or 0
        metrics.beyond_horizon.inc(beyond_horizon)
        counts = fresh.group_by(["object", "change_type"]).aggregate([("uuid", "count")])
        for row in counts.to_pylist():
            metrics.events.labels(row["object"], row["change_type"]).inc(row["uuid_count"])
        for reason, count in reasons.items():
            metrics.quarantined.labels(reason).inc(count)
            log.warning("batch %d: quarantined %d message(s): %s", batch_id, count, reason)
        if fresh.num_rows:
            metrics.commit_lag.set(seconds_behind(pc.max(commits).as_py()))
        if beyond_horizon:
            log.warning(
                "batch %d: %d event(s) older than the dedupe horizon were delivered without a uuid check",
                batch_id,
                beyond_horizon,
            )


def per_table(events: pa.Table) -> Counter[str]:
    """How many of ``events`` (outline rows) each table has, counted in Arrow."""
    counts = pc.value_counts(events.column("object"))
    return Counter(
        dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True))
    )


def check_written(batch_id: int, kept: Counter[str], written: Counter[str]) -> None:
    """The changelog holds every kept event of the batch once: what the tasks wrote, per table,
    is what the driver kept. A difference fails the batch before anything is committed."""
    differ = sorted(t for t in kept.keys() | written.keys() if kept[t] != written[t])
    if differ:
        shown = ", ".join(f"{t!r}: kept {kept[t]}, written {written[t]}" for t in differ[:5])
        raise ChangelogShortfallError(
            f"batch {batch_id}: the changelog's tasks wrote other rows than kept ({shown})"
        )
