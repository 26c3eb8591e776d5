"""Consumer benchmarks: events/s into each sink beside raw reads, in the same run.

The same topic (a random insert/update/delete history over many keys, with a tenth re-sent as
duplicates) is consumed by separate Trigger.AvailableNow queries:

- raw reads, the ceilings: the Kafka source into Spark's ``noop`` sink (read on the executors,
  nothing on the driver), and into ``foreachBatch`` collecting the rows as Arrow on the driver
  (what the consumer's batch function starts with today);
- the floor under the consumer's per-event Python: the same read in the consumer's batches,
  handed by the JVM to a Python worker per task that does nothing with the rows and yields an
  empty outline (``mapInArrow``, as the consumer's tasks get them) — what Spark costs before
  the project's own work;
- changelog: decode, dedupe, order, Parquet; and the same events written as a changelog by
  Spark alone (``decoded_in_the_jvm``: ``from_avro``, ``dropDuplicates``, Spark's Parquet), the
  other design's cost;
- replica DuckDB / replica PostgreSQL: decode, dedupe, order, merge — each with whole
  transactions (the default: hold what the watermarks have not passed) and without; the Delta
  replica with whole transactions, in the default batches and in larger ones;
- growth: the changelog again on a ``local[1]`` session (the rest run on ``local[2]``), the
  issue's figure. A session's queries get faster one after another while its JVM compiles
  (9.3, 5.5, 5.2 s for the same query), and the ``local[1]`` session
  runs last, in the same JVM: so the changelog is also timed again at the end of the ``local[2]``
  session, warm, and then with the driver, the JVM and its Python workers pinned to one CPU
  (``bench.cpus``) — on two cores ``local[1]`` still keeps both busy (one task's source worker
  feeds its Python worker through the JVM);
- growth on a Spark standalone cluster (``--only cluster``): the changelog on a cluster of one
  worker of one core, then of two such workers (a master and workers as JVMs of their own,
  ``testkit.spark_cluster``), the driver this process, each cluster warmed up as above;
- driver memory: this process's peak RSS while the changelog runs with batches of 10,000 and
  of 200,000 events;
- a wide table: the same history's shape on a table of 30 INT64 value columns, an update setting
  3 of them — its raw read, and its DuckDB and PostgreSQL replicas with whole transactions — where
  costs that grow with a table's columns show;
- decoding alone, in this process (no Spark): the same events read by fastavro's
  ``schemaless_reader`` and by the consumer's compiled reader (``schemas.avro_reader``, through
  ``schemas.wire.read_body``, timestamps read as the numbers Arrow takes, as the consumer reads
  them), the largest cost of a task's Python (docs/consumer.md).

Events are published in chunks of ``WATERMARK_EVERY`` with a watermark after each, as a
producer writing that many events per watermark interval would.

Each figure is wall time from query start to its end, so it includes Spark's per-query start
(about 1 s of a warm query on this machine: small runs understate every
rate). Before the first figure, a warm-up reads the topic raw and runs the consumer over
``WARM_UP_CHANGES`` changes of its own topics, each sent twice (so the path that removes
duplicates from the staged changelog runs too), so no figure pays for starting Python workers
and their imports, or Spark's first plan of each kind (the first job that removes duplicates
took 2 s, the next 0.3 s).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import random
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema

from bench.cpu_time import CpuSeconds
from bench.cpus import pinned
from bench.jars import bench_jars
from bench.memory import PeakRss
from bench.producer import Figure
from spanner_cdc.consumer.config import ConsumerConfig
from spanner_cdc.consumer.decode.gate import DecodeContext, MessageReader
from spanner_cdc.consumer.decode.kafka_rows import DECODE_COLUMNS
from spanner_cdc.consumer.main import ConsumerJob, drain, source_options
from spanner_cdc.consumer.spark.graceful_stop import StopRequest
from spanner_cdc.consumer.spark.session import spark_session
from spanner_cdc.consumer.tasks import STAGED_OUTLINE_SCHEMA
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.wire import HEADER_LENGTH, WriterSchema, encode, read_body
from testkit.consumer_run import consumer_config, fresh_postgres_database, unique_prefix
from testkit.spark_cluster import spark_cluster
from testkit.synthetic import ChangeFactory, publish, random_history, wide_table

WATERMARK_EVERY = 5_000
#: Changes the warm-up consumer reads (on topics of their own) before anything is timed: sent
#: twice, 12,000 messages, so that the Python workers of both cores start before a figure is
#: timed.
WARM_UP_CHANGES = 6_000
CHANGELOG = "changelog (decode, dedupe, order, Parquet)"
JVM_CHANGELOG = "changelog decoded in the JVM (from_avro, dropDuplicates, Spark's Parquet; no gate)"
#: The wide table's shape: a real table's columns, where per-column costs show (the fold sorted
#: once per value column), which the two of the main table hide.
WIDE_VALUE_COLUMNS = 30
WIDE_UPDATED_COLUMNS = 3
WIDE_NAME = f"a table of {WIDE_VALUE_COLUMNS} value columns, {WIDE_UPDATED_COLUMNS} set per update"
LAKEHOUSE_LARGE_BATCH = 200_000


@dataclass(frozen=True)
class ConsumerFigures:
    raw_on_executors: Figure
    #: The same events over Spark's time in the query's batches (timed_with_batches).
    raw_in_batches: Figure
    raw_to_driver: Figure
    #: The raw read in the consumer's batches, handed to Python workers that do nothing
    #: (through_idle_worker): the floor under any per-event Python; whole, and its batches alone.
    idle_worker: Figure
    idle_worker_in_batches: Figure
    changelog: Figure
    changelog_in_batches: Figure
    #: The same events written by Spark alone (decoded_in_the_jvm): the other design's cost.
    changelog_in_the_jvm: Figure
    changelog_in_the_jvm_in_batches: Figure
    #: DuckDB then PostgreSQL, each with whole transactions and then without.
    replicas: list[Figure]
    #: PostgreSQL with whole transactions, its stage rows loaded by the driver (--postgres-staging
    #: driver): the baseline of the tasks loading them, run just before.
    postgres_loaded_by_driver: Figure
    changelog_on_one_core: Figure
    changelog_on_one_core_in_batches: Figure
    #: The changelog again at the end of the ``local[2]`` session, warm.
    changelog_warm: Figure
    #: Then the same with Spark's processes and the driver pinned to one CPU (None on a machine
    #: that gives this process one).
    changelog_on_one_cpu: Figure | None
    #: Peak RSS of this (driver) process, MiB, with small and with large batches.
    driver_rss_small_batches: float
    driver_rss_large_batches: float
    #: The raw read of the wide table's topic, then its DuckDB and PostgreSQL replicas.
    wide_raw: Figure
    wide_replicas: list[Figure]
    #: The Delta replica with whole transactions: in the consumer's default batches, then in
    #: batches of LAKEHOUSE_LARGE_BATCH (a Delta batch's cost is mostly fixed: its MERGEs' jobs).
    lakehouse: list[Figure]


def into_noop(batch: Any) -> None:
    """A raw batch read on the executors into Spark's ``noop`` sink: nothing reaches the driver."""
    batch.write.format("noop").mode("overwrite").save()


def to_driver(batch: Any) -> None:
    """A raw batch collected on the driver as Arrow."""
    batch.toArrow()


def through_idle_worker(batch: Any) -> None:
    """A raw batch's columns the consumer decodes handed by the JVM to a Python worker per task
    (``mapInArrow``, as the consumer's outline job hands them) that stages no outline and hands
    back no file name, which the driver takes: Spark's cost of moving the rows to where the
    consumer's per-event Python runs, with none of it run."""

    def idle(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist([], schema=STAGED_OUTLINE_SCHEMA)

    batch.select(*DECODE_COLUMNS).mapInArrow(idle, from_arrow_schema(STAGED_OUTLINE_SCHEMA)).toArrow()


def decoded_in_the_jvm(writer: WriterSchema, out: Path) -> Callable[[Any], None]:
    """A batch written as a changelog by Spark alone, to compare designs: ``from_avro`` (Spark's
    Avro data source) on the body after the single-object header of the one writer schema the
    bench publishes, the envelope's columns, duplicates dropped by uuid, each task's rows in
    ``sort_keys`` order, Spark's Parquet writer. It has none of the gate's rules, no memory of
    uuids across batches, no watermarks and one writer schema: what decoding in the JVM would
    cost, not a consumer."""
    from pyspark.sql import functions as F  # noqa: N812 - PySpark's own spelling
    from pyspark.sql.avro.functions import from_avro

    def write(batch: Any) -> None:
        header = F.substring("value", 1, HEADER_LENGTH)
        body = F.expr(f"substring(value, {HEADER_LENGTH + 1})")
        (
            batch.where(header == F.lit(writer.header))
            .select(from_avro(body, writer.schema_json).alias("event"))
            .select("event.*")
            .dropDuplicates(["uuid"])
            .sortWithinPartitions("sort_keys")
            .write.mode("append")
            .parquet(str(out))
        )

    return write


def raw_read(
    spark: Any,
    config: ConsumerConfig,
    checkpoint: Path,
    consume: Callable[[Any], None],
    *,
    consumer_batches: bool = False,
) -> Finished:
    """Rows read by one AvailableNow query that does only ``consume`` with each batch, and the
    query: in one batch, or with ``consumer_batches`` in the consumer's (its
    ``max_events_per_batch``)."""
    settings = source_options(config, spark)
    if not consumer_batches:
        del settings["maxOffsetsPerTrigger"]
    reader = spark.readStream.format("kafka").options(**settings)
    query = (
        reader.load()
        .writeStream.foreachBatch(lambda batch, _batch_id: consume(batch))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return Finished(sum(int(progress["numInputRows"]) for progress in query.recentProgress), query)


def decoder_figures(changes: int) -> tuple[Figure, Figure]:
    """The bench's events decoded by fastavro and by the compiled reader as the consumer's tasks
    read them (one pass each after a pass of both that is not timed); the same values come out,
    but timestamps as numbers, not ``datetime`` (tests/unit/schemas/test_avro_reader.py)."""
    events = random_history(ChangeFactory(), changes, keys=max(10, changes // 5))
    writer = WriterSchema.from_schema(events[0].table.event_schema)
    messages = [encode(writer, event.value) for event in events]

    def by_fastavro() -> int:
        for message in messages:
            body = io.BytesIO(message)
            body.seek(HEADER_LENGTH)
            fastavro.schemaless_reader(body, writer.reading, None)
        return len(messages)

    def by_compiled_reader() -> int:
        for message in messages:
            read_body(writer, message, HEADER_LENGTH, calendar_numbers=True)
        return len(messages)

    by_fastavro(), by_compiled_reader()
    return (
        timed("decode alone: fastavro schemaless_reader", by_fastavro),
        timed("decode alone: compiled reader, as the consumer reads", by_compiled_reader),
    )


#: Corrupt messages among the gate's: none, then one in each of these many.
CORRUPT_EVERY = (100, 10)


def gate_figures(changes: int) -> list[Figure]:
    """The gate (consumer.decode.gate) over the bench's events as one task's share, clean and
    with every Nth message cut short: what damaged messages among good ones cost the rest."""
    events = random_history(ChangeFactory(), changes, keys=max(10, changes // 5))
    table = events[0].table
    published = {
        w.fingerprint: w.schema_json
        for w in map(WriterSchema.from_schema, (table.event_schema, table.key_schema))
    }
    writer = WriterSchema.from_schema(table.event_schema)
    good = [encode(writer, event.value) for event in events]
    context = DecodeContext(Topics("P"), time.time_ns() // 1_000, schemas=published)
    figures = []
    for every in (None, *CORRUPT_EVERY):
        messages = [m[:-1] if every and n % every == every - 1 else m for n, m in enumerate(good)]
        rows = pa.table(
            {
                "key": pa.array([b"k"] * len(messages), pa.binary()),
                "value": pa.array(messages, pa.binary()),
                "topic": [Topics("P").event(table.table)] * len(messages),
                "partition": pa.array([0] * len(messages), pa.int32()),
                "offset": pa.array(range(len(messages)), pa.int64()),
            }
        )
        MessageReader(context).read(rows)  # the readers compiled, not timed
        name = "gate, clean" if every is None else f"gate, 1 message in {every} cut short"
        figures.append(timed(name, functools.partial(_gate_events, context, rows)))
    return figures


def _gate_events(context: DecodeContext, rows: pa.Table) -> int:
    return len(MessageReader(context).read(rows).events)


def timed(name: str, run: Callable[[], int]) -> Figure:
    started = time.perf_counter()
    events = run()
    return Figure(name, events, time.perf_counter() - started)


@dataclass(frozen=True)
class Finished:
    """A query run to its end, and the events it read."""

    events: int
    query: Any


def timed_with_batches(name: str, run: Callable[[], Finished]) -> tuple[Figure, Figure]:
    """``run`` timed whole, and the same events over the time Spark spent in its batches
    (``addBatch``): what a running query sustains, without what each new query pays once — on
    2 cores about 1 s before its first batch, most of it Spark starting the source's Python
    runner."""
    started = time.perf_counter()
    finished = run()
    whole = Figure(name, finished.events, time.perf_counter() - started)
    in_batches = sum(p["durationMs"].get("addBatch", 0) for p in finished.query.recentProgress) / 1000
    short = re.sub(r" \([^)]*\)", "", name)  # without what the whole figure's name explains
    return whole, Figure(f"{short}, its batches alone", finished.events, in_batches)


def on_one_cpu(spark: Any, name: str, run: Callable[[], int]) -> Figure | None:
    """``run`` timed with this process, Spark's JVM and its workers pinned to one CPU (None on a
    machine that gives this process only one)."""
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        return None
    with pinned(spark.sparkContext._gateway.proc.pid, {min(allowed)}):
        return timed(name, run)


def published_history(bootstrap: str, factory: ChangeFactory, changes: int, **shape: Any) -> tuple[str, int]:
    """A random history of ``changes`` over ``changes / 5`` keys, a tenth of it sent again, in
    chunks of ``WATERMARK_EVERY`` with a watermark after each; the topics' prefix, and how many
    events it published."""
    prefix = unique_prefix("Bench")
    events = random_history(factory, changes, keys=max(10, changes // 5), **shape)
    published = events + random.Random(1).sample(events, changes // 10)
    for start in range(0, len(published), WATERMARK_EVERY):
        publish(bootstrap, prefix, published[start : start + WATERMARK_EVERY])
    return prefix, len(published)


def wide_figures(
    spark: Any, wide: ConsumerConfig, consumed: Callable[..., int], postgres_dsn: str
) -> tuple[Figure, list[Figure]]:
    """The wide table's topic (``wide``) read raw, then into each replica with whole transactions
    (``consumed``: a directory name, the topics' prefix and the consumer's settings)."""
    raw = timed(
        f"raw read on the executors, {WIDE_NAME}",
        lambda: raw_read(spark, wide, Path(wide.output_dir).parent / "wide-raw", into_noop).events,
    )
    replicas = [
        timed(
            f"replica {database}, whole transactions, {WIDE_NAME}",
            functools.partial(consumed, f"wide-{database}", wide.topic_prefix, sinks=("replica",), **options),
        )
        for database, options in (
            ("DuckDB", {}),
            ("PostgreSQL", {"replica": "postgres", "postgres_dsn": fresh_postgres_database(postgres_dsn)}),
        )
    ]
    return raw, replicas


def replica_figures(consumed: Callable[..., int], postgres_dsn: str) -> tuple[list[Figure], Figure]:
    """Each replica with whole transactions and without (``consumed``: a directory name and the
    consumer's settings), and — run just before PostgreSQL's with whole transactions, as its
    baseline — the same with the stage rows loaded by the driver."""

    def replica(database: str, grouping: str, whole: bool, **more: Any) -> Figure:
        options: dict[str, Any] = {"sinks": ("replica",), "whole_transactions": whole, **more}
        if database == "PostgreSQL":
            options |= {"replica": "postgres", "postgres_dsn": fresh_postgres_database(postgres_dsn)}
        name = f"replica {database}, {grouping}"
        directory = name.split(" (", maxsplit=1)[0].replace(" ", "-").replace(",", "")
        return timed(name, functools.partial(consumed, directory, **options))

    grouped, as_it_comes = "whole transactions", "batch as it comes"
    measured = " (decode, dedupe, order, merge)"
    duckdb = [replica("DuckDB", grouped + measured, True), replica("DuckDB", as_it_comes + measured, False)]
    loaded_by_driver = replica(
        "PostgreSQL", f"{grouped}, stage rows loaded by the driver", True, postgres_staging="driver"
    )
    postgres = [
        replica("PostgreSQL", grouped + measured, True),
        replica("PostgreSQL", as_it_comes + measured, False),
    ]
    return [*duckdb, *postgres], loaded_by_driver


def lakehouse_figures(consumed: Callable[..., int]) -> list[Figure]:
    """The Delta replica with whole transactions, in the default batches and in large ones."""
    name = "replica Delta, whole transactions"
    return [
        timed(f"{name} (decode, dedupe, order, MERGE)", functools.partial(consumed, "delta", **DELTA)),
        timed(
            f"{name}, batches of {LAKEHOUSE_LARGE_BATCH:,}",
            functools.partial(consumed, "delta-large", max_events_per_batch=LAKEHOUSE_LARGE_BATCH, **DELTA),
        ),
    ]


#: The consumer's settings of the Delta figures.
DELTA: dict[str, Any] = {"sinks": ("replica",), "replica": "delta"}


def consumer_figures(bootstrap: str, postgres_dsn: str, changes: int) -> ConsumerFigures:
    prefix, messages = published_history(bootstrap, ChangeFactory(), changes)
    wide_prefix, wide_messages = published_history(
        bootstrap, wide_table(WIDE_VALUE_COLUMNS), changes, updated_columns=WIDE_UPDATED_COLUMNS
    )
    work = Path(tempfile.mkdtemp(prefix="spanner-cdc-bench-"))
    logs = Path(tempfile.mkdtemp(prefix="spark-logs-"))
    base = consumer_config(bootstrap, prefix, work / "unused")

    warm_prefix, warm_messages = published_warm_up(bootstrap)
    published = {prefix: messages, wide_prefix: wide_messages, warm_prefix: warm_messages}

    def consumed(directory: str, topics: str = prefix, **overrides: Any) -> int:
        return consumed_query(directory, topics, **overrides).events

    def consumed_query(directory: str, topics: str = prefix, **overrides: Any) -> Finished:
        config = consumer_config(bootstrap, topics, work / directory, **overrides)
        return drained(spark, config, published[topics])

    def warm_up(name: str) -> None:
        """The JVM and the Python workers of the source and of the consumer's tasks started, and
        their imports done, before anything is timed (a real consumer pays that once per run)."""
        raw_read(spark, base, work / f"{name}-raw", into_noop)
        consumed(f"{name}-consumer", warm_prefix, sinks=("changelog", "replica"))

    writer = WriterSchema.from_schema(random_history(ChangeFactory(), 1)[0].table.event_schema)
    avro = {"spark.jars": ",".join(map(str, bench_jars("spark-avro")))}
    spark = spark_session("local[2]", "spanner-cdc-bench", avro, log_dir=logs, delta=True)
    try:
        warm_up("warm-up")
        raw_executors, raw_in_batches = timed_with_batches(
            "raw read on the executors (source → noop)",
            lambda: raw_read(spark, base, work / "raw-x", into_noop),
        )
        raw_driver = timed(
            "raw read to the driver (source → Arrow)",
            lambda: raw_read(spark, base, work / "raw-d", to_driver).events,
        )
        idle_worker, idle_worker_in_batches = timed_with_batches(
            "raw read handed to idle Python workers (source → mapInArrow, the consumer's batches)",
            lambda: raw_read(spark, base, work / "raw-w", through_idle_worker, consumer_batches=True),
        )
        changelog, changelog_in_batches = timed_with_batches(
            CHANGELOG, lambda: consumed_query("changelog", sinks=("changelog",))
        )
        in_the_jvm, in_the_jvm_in_batches = timed_with_batches(
            JVM_CHANGELOG,
            lambda: raw_read(
                spark,
                base,
                work / "jvm",
                decoded_in_the_jvm(writer, work / "jvm-changelog"),
                consumer_batches=True,
            ),
        )
        replicas, loaded_by_driver = replica_figures(consumed, postgres_dsn)
        lakehouse = lakehouse_figures(consumed)
        wide_raw, wide_replicas = wide_figures(
            spark, consumer_config(bootstrap, wide_prefix, work / "unused-wide"), consumed, postgres_dsn
        )
        rss = []
        for size in (10_000, 200_000):
            with PeakRss() as peak:
                consumed(f"rss-{size}", sinks=("changelog",), max_events_per_batch=size)
            rss.append(peak.peak_kib / 1024)
        warm = timed(f"{CHANGELOG} again, warm", lambda: consumed("changelog-warm", sinks=("changelog",)))
        one_cpu = on_one_cpu(
            spark, f"{CHANGELOG} warm, one CPU", lambda: consumed("changelog-one-cpu", sinks=("changelog",))
        )
    finally:
        spark.stop()
    spark = spark_session("local[1]", "spanner-cdc-bench-one-core", log_dir=logs)
    try:
        warm_up("warm-up-1")
        one_core, one_core_in_batches = timed_with_batches(
            f"{CHANGELOG} on local[1]", lambda: consumed_query("changelog-1", sinks=("changelog",))
        )
    finally:
        spark.stop()
    return ConsumerFigures(
        raw_executors,
        raw_in_batches,
        raw_driver,
        idle_worker,
        idle_worker_in_batches,
        changelog,
        changelog_in_batches,
        in_the_jvm,
        in_the_jvm_in_batches,
        replicas,
        loaded_by_driver,
        one_core,
        one_core_in_batches,
        warm,
        one_cpu,
        rss[0],
        rss[1],
        wide_raw,
        wide_replicas,
        lakehouse,
    )


def cluster_figures(bootstrap: str, changes: int) -> list[Figure]:
    """The changelog of one published history on a standalone cluster of one worker of one
    core, then of two: for each, whole (with the CPU the machine spent meanwhile) and in its
    batches alone."""
    history = published_history(bootstrap, ChangeFactory(), changes)
    warm = published_warm_up(bootstrap)
    work = Path(tempfile.mkdtemp(prefix="spanner-cdc-bench-cluster-"))
    return [
        figure
        for workers in (1, 2)
        for figure in changelog_on_cluster(bootstrap, workers, work / f"{workers}-workers", warm, history)
    ]


def changelog_on_cluster(
    bootstrap: str, workers: int, work: Path, warm: tuple[str, int], history: tuple[str, int]
) -> list[Figure]:
    """The changelog of ``history`` (topics' prefix, messages) on a new cluster of ``workers``
    workers of one core, after the same of ``warm``."""
    with spark_cluster(work / "cluster", workers=workers, cores=1) as cluster:
        spark = spark_session(
            cluster.master_url, f"spanner-cdc-bench-{workers}-workers", log_dir=work / "logs"
        )
        try:

            def changelog(topics: str, events: int) -> Finished:
                config = consumer_config(bootstrap, topics, work / topics, sinks=("changelog",))
                return drained(spark, config, events)

            changelog(*warm)
            cpu = CpuSeconds.now()
            whole, in_batches = timed_with_batches(
                f"{CHANGELOG} on {workers} worker(s) of 1 core", functools.partial(changelog, *history)
            )
            return [dataclasses.replace(whole, cpu=CpuSeconds.now() - cpu), in_batches]
        finally:
            spark.stop()


def published_warm_up(bootstrap: str) -> tuple[str, int]:
    """The warm-up's topics: ``WARM_UP_CHANGES`` changes, each sent twice; their prefix and
    how many messages they hold."""
    prefix = unique_prefix("BenchWarmUp")
    events = random_history(ChangeFactory(), WARM_UP_CHANGES)
    publish(bootstrap, prefix, events + events)
    return prefix, 2 * len(events)


def drained(spark: Any, config: ConsumerConfig, events: int) -> Finished:
    """The consumer with ``config`` run by one query of ``spark`` until Kafka is drained
    (``events``: the messages its topics hold)."""
    job = ConsumerJob.open(config)
    try:
        return Finished(events, drain(job, spark, StopRequest()))
    finally:
        job.close()
