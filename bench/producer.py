"""Producer benchmarks: figures beside raw baselines measured in the same run.

(a) pipeline from recorded change records: conversion, envelope, Avro, produce until Kafka
    acknowledged, through EventPublisher.publish — beside fastavro encoding alone and
    confluent-kafka producing the same bytes alone from a started client, on a broker warmed by
    the same work first (:data:`BROKER_WARM_UP_PASSES`);
(b) emulator → Kafka: rows committed first, then read and published to the end timestamp —
    beside the Spanner client reading the same backlog alone, decoding its rows as the client
    does and as the producer reads them (``bench.backlog``);
(c) commit → ack latency percentiles under a steady write rate;
(d) backfill: a table's rows at a snapshot → Kafka, beside the Spanner client reading the same
    rows at the same snapshot alone; (e) the same rows found by one poll of their commit
    timestamps, beside the poll's query alone; both on a broker warmed by the same work first;
(f) peak RSS with 1 and with 1,000 partitions running (``bench.many_partitions``);
peak RSS is printed by the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import itertools
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import fastavro
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from google.cloud import spanner as spanner_lib
from google.cloud.spanner_v1 import KeySet

from bench.backlog import CLIENT_DECODING, UNDECODED, read_backlog_alone
from bench.cpu_time import CpuSeconds
from spanner_cdc.common.heap import settle_heap
from spanner_cdc.common.kafka_offsets import READER_SETTINGS
from spanner_cdc.producer.change_stream_rules import GOOGLE_STANDARD_SQL
from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.producer.lineage.acks import AckTracker
from spanner_cdc.producer.main import build_service
from spanner_cdc.producer.metrics import AcknowledgedEvents, ProducerMetrics
from spanner_cdc.producer.poll.config import PollConfig
from spanner_cdc.producer.poll.main import build_poller
from spanner_cdc.producer.publish.kafka import GUARANTEED_SETTINGS, TUNED_DEFAULTS, KafkaClient
from spanner_cdc.producer.publish.publisher import EventPublisher, EventSender
from spanner_cdc.producer.spanner.catalog import CatalogColumn, TableCatalog
from spanner_cdc.producer.spanner.snapshot_read import rows_stamped_since
from spanner_cdc.schemas.events import EventBuilder
from spanner_cdc.schemas.records import DataChangeRecord
from spanner_cdc.schemas.timestamps import (
    datetime_from_micros,
    format_timestamp_micros,
    micros_from_datetime,
    parse_timestamp_micros,
)
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import KIND_HEADER, WATERMARK_KIND
from spanner_cdc.schemas.wire import WriterSchema, encode
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.services import EMULATOR_PROJECT
from testkit.producer_run import running
from testkit.records import STREAM_NAME, account_transfer_records
from testkit.spanner_db import INSTANCE, create_database

#: Untimed passes of (a)'s work before its figures: a fresh broker's CPU per event falls over
#: its first passes while its JVM compiles (docs/performance.md).
BROKER_WARM_UP_PASSES = 2


@dataclass(frozen=True)
class Figure:
    name: str
    events: int
    seconds: float
    #: The CPU spent meanwhile, when it was measured (:func:`timed`).
    cpu: CpuSeconds | None = None

    @property
    def per_second(self) -> float:
        return self.events / self.seconds


def synthetic_records(count: int) -> list[dict[str, Any]]:
    """``count`` one-mod UPDATE records shaped like a transfer between two accounts, each its own transaction:
    distinct keys, values, transaction ids and commit timestamps (37 µs apart, as at a busy
    database), ``LastUpdate`` set to the commit time and its old value a day before."""
    template = account_transfer_records()[0]
    first_commit = parse_timestamp_micros(template["commit_timestamp"])
    records = []
    for index in range(count):
        commit = format_timestamp_micros(first_commit + 37 * index)
        day_before = format_timestamp_micros(first_commit + 37 * index - 86_400_000_000)
        records.append(
            {
                **template,
                "commit_timestamp": commit,
                "server_transaction_id": f"tx-{index:09d}",
                "mods": [
                    {
                        "keys": {"AccountId": f"acct-{index:07d}"},
                        "new_values": {"LastUpdate": commit, "Balance": str(index)},
                        "old_values": {"LastUpdate": day_before, "Balance": str(index + 1)},
                    }
                ],
            }
        )
    return records


@contextlib.contextmanager
def as_the_command_runs() -> Iterator[None]:
    """The heap as ``spanner-cdc produce`` and ``poll`` run with it: what exists now frozen, as
    the command freezes what its start-up made, and the collector's thresholds the command's
    (``common.heap``); both as they were afterwards, for the next part. What exists now includes
    a part's input records, which a command never holds all at once."""
    thresholds = gc.get_threshold()
    settle_heap()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def timed(name: str, events: int, work: Callable[[], object]) -> Figure:
    cpu, started = CpuSeconds.now(), time.perf_counter()
    work()
    return Figure(name, events, time.perf_counter() - started, CpuSeconds.now() - cpu)


def pipeline_figures(bootstrap: str, count: int) -> list[Figure]:
    """(a): the per-record path of the producer against its two raw baselines."""
    records = [DataChangeRecord.from_json(r) for r in synthetic_records(count)]
    builder = EventBuilder(STREAM_NAME, "bank")
    events = [e for r in records for e in builder.build(r, "p", 0)]
    writer = WriterSchema.from_schema(events[0].table.event_schema)
    values = [e.value for e in events]  # by field name, what fastavro takes
    encoded = [fastavro_bytes(writer, value) for value in values]

    def fastavro_alone() -> None:
        buffer = io.BytesIO()
        for value in values:
            fastavro.schemaless_writer(buffer, writer.parsed, value)

    def encoder_alone() -> None:
        for event in events:
            encode(writer, event.fields)  # as the producer hands it over

    topic = f"bench-raw-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(30)

    def started_client() -> Producer:
        """A client already connected, its producer id granted: started, as (a) is timed."""
        producer = Producer({**TUNED_DEFAULTS, "bootstrap.servers": bootstrap, **GUARANTEED_SETTINGS})
        producer.produce(topic, value=encoded[0], key=b"warm-up")
        producer.flush(30)
        return producer

    def kafka_alone(producer: Producer) -> Callable[[], None]:
        def produce_all() -> None:
            for index, value in enumerate(encoded):
                while True:
                    try:
                        producer.produce(topic, value=value, key=str(index).encode())
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.flush(120)

        return produce_all

    def through_producer(name: str, json_events: bool, started: bool) -> Figure:
        kafka = KafkaClient(bootstrap, f"bench-{uuid.uuid4().hex[:6]}", {}, 6, 1)
        publisher = offline_publisher(kafka, json_events=json_events)
        warm_up = 1 if started else 0
        with as_the_command_runs():
            seconds, cpu = asyncio.run(publish_all(publisher, records, warm_up))
        return Figure(name, count - warm_up, seconds, cpu)

    # A broker in service has run for a while; a fresh one's JVM compiles its hot paths under
    # the first load it meets, and spends several times the CPU per event meanwhile, on the
    # cores the producer shares with it. Each part starts its own broker: this one is warmed
    # first, by the same work, untimed.
    for _ in range(BROKER_WARM_UP_PASSES):
        through_producer("warm-up", False, started=True)
        kafka_alone(started_client())()
    return [
        timed("(a) baseline: fastavro encode alone", count, fastavro_alone),
        timed("(a) the producer's Avro encoder alone", count, encoder_alone),
        timed("(a) baseline: confluent-kafka produce alone", count, kafka_alone(started_client())),
        through_producer("(a) producer: record → event → Avro → Kafka ack", False, started=True),
        through_producer("(a) the same from a cold start", False, started=False),
        through_producer("(a) producer --format json: record → event → JSON", True, started=True),
    ]


def fastavro_bytes(writer: WriterSchema, value: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, writer.parsed, value)
    return buffer.getvalue()


def offline_publisher(
    kafka: KafkaClient, stream_name: str = STREAM_NAME, json_events: bool = False
) -> EventPublisher:
    """The producer's publisher with a catalog of the recorded table: no Spanner needed."""
    shape = (("AccountId", 1, "STRING(MAX)"), ("LastUpdate", 2, "TIMESTAMP"), ("Balance", 3, "INT64"))
    columns = [CatalogColumn.parse(n, p, t, "GOOGLE_STANDARD_SQL", "AccountBalance") for n, p, t in shape]
    catalog = TableCatalog("GOOGLE_STANDARD_SQL", lambda: ({"AccountBalance": columns}, {}))
    catalog.refresh()
    sender = EventSender(kafka, ProducerMetrics(), json_events=json_events)
    return EventPublisher(sender, catalog, EventBuilder(stream_name, "bank"))


async def publish_all(
    publisher: EventPublisher, records: list[DataChangeRecord], warm_up: int = 0
) -> tuple[float, CpuSeconds]:
    """Every record through EventPublisher.publish, until Kafka acknowledged all events; the
    seconds and CPU that took, the first ``warm_up`` records left out: they are published and
    acknowledged before the clock starts, so the rest runs as in a producer already started —
    its table's topic made, the writer schemas published, the transactional id taken over
    (which the first record otherwise waits for: a fixed cost, not a rate)."""
    tracker = AckTracker()
    async with publisher.kafka.serving():  # acknowledgements, as the service has them
        for record in records[:warm_up]:
            await publisher.publish(record, "bench", tracker)
        await tracker.drained()
        cpu, started = CpuSeconds.now(), time.perf_counter()
        for record in records[warm_up:]:
            await publisher.publish(record, "bench", tracker)
        await tracker.drained()
        seconds, cpu = time.perf_counter() - started, CpuSeconds.now() - cpu
    return seconds, cpu


def emulator_figures(
    stack: EmbeddedStack,
    rows: int,
    *,
    rates: list[float],
    heartbeats_ms: list[int],
    seconds: float,
    release_orders: list[str],
) -> tuple[tuple[Figure, Figure], Figure, tuple[Figure, Figure], list[LatencyRun]]:
    """(b) backlog read throughput beside its baselines (``bench.backlog``: the client decoding,
    then reading undecoded rows as the producer does), each whole, then from its first row (or
    event on Kafka) to its last, beside the second; and (c) latency samples under each of
    ``rates`` transactions/s with each heartbeat interval and release order."""
    spanner, kafka = stack.endpoint("spanner"), stack.endpoint("kafka")
    database = accounts_database(spanner)
    start = int(time.time() * 1_000_000)
    for first in range(0, rows, 1000):
        with database.batch() as batch:
            batch.insert_or_update(
                "Accounts",
                columns=["Id", "Balance"],
                values=[[f"a{i}", i] for i in range(first, first + 1000)],
            )
    end = int(time.time() * 1_000_000) + 200_000
    time.sleep(0.5)
    config = bench_config(
        spanner, kafka, database.database_id, start_timestamp_micros=start, end_timestamp_micros=end
    )
    decoding = timed(
        "(b) baseline: Spanner client reading the backlog alone",
        rows,
        lambda: read_backlog_alone(database, config, rows, CLIENT_DECODING),
    )
    alone_spans: list[float] = []
    undecoded = timed(
        "(b) baseline: the same, reading as the producer does",
        rows,
        lambda: alone_spans.append(read_backlog_alone(database, config, rows, UNDECODED)),
    )
    service = asyncio.run(build_service(config))
    with as_the_command_runs():
        backlog = timed(
            "(b) emulator → Kafka, backlog of committed rows", rows, lambda: asyncio.run(service.run())
        )
    spans = (
        Figure("(b) the client alone, first to last row", rows, alone_spans[0]),
        Figure(
            "(b) emulator → Kafka, first to last event on Kafka",
            rows,
            produced_span(kafka, Topics(config.topic_prefix).event("Accounts"), rows),
        ),
    )
    # Each in a database of its own: on the emulator, change-stream answers slow down as a
    # database's committed transactions pile up (after 3,000 of them, p50 at a 1 s heartbeat went
    # from about 550 ms to 4 s), so a shared one would make the order of the runs the result.
    latencies = [
        asyncio.run(
            steady_latency(
                accounts_database(spanner),
                spanner,
                kafka,
                rate=rate,
                seconds=seconds,
                heartbeat_ms=heartbeat,
                release_order=order,
            )
        )
        for order in release_orders
        for heartbeat in heartbeats_ms
        for rate in rates
    ]
    return (decoding, undecoded), backlog, spans, latencies


def accounts_database(spanner: str) -> Any:
    """A new emulator database with the Accounts table and its change stream Bank."""
    return create_database(
        spanner,
        [
            "CREATE TABLE Accounts (Id STRING(36) NOT NULL, Balance INT64) PRIMARY KEY (Id)",
            "CREATE CHANGE STREAM Bank FOR Accounts OPTIONS (value_capture_type='NEW_ROW')",
        ],
    )


def produced_span(bootstrap: str, topic: str, events: int) -> float:
    """Seconds from the first of the ``events`` committed to ``topic`` to its last, by the times
    the producer handed each to its Kafka client (the messages' create times, to the
    millisecond). Watermark records (their kind header) are not events: the producer writes
    them from its start on."""
    consumer = Consumer(
        {**READER_SETTINGS, "bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
         "enable.auto.commit": False, "isolation.level": "read_committed"}
    )  # fmt: skip
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, partition, 0) for partition in partitions])
        stamps: list[int] = []
        while len(stamps) < events:
            message = consumer.poll(30)
            if message is None:
                raise TimeoutError(f"{topic}: {len(stamps)} of {events} events, then none for 30 s")
            if message.error() is None and (KIND_HEADER, WATERMARK_KIND) not in (message.headers() or []):
                stamps.append(message.timestamp()[1])
        return (max(stamps) - min(stamps)) / 1000
    finally:
        consumer.close()


def filled_accounts(spanner: str, rows: int) -> tuple[Any, int]:
    """A database whose Accounts table holds ``rows`` rows, written in commits of 5,000 (each
    row's ``Stamp`` its commit timestamp), with a change stream over it; and the last commit's
    timestamp, the snapshot at which every row is there (the machine's clock can be behind the
    emulator's: a snapshot taken from it once read 45,000 of 50,000 rows)."""
    database = create_database(
        spanner,
        [
            "CREATE TABLE Accounts (Id STRING(36) NOT NULL, Balance INT64, Note STRING(MAX), "
            "Stamp TIMESTAMP OPTIONS (allow_commit_timestamp=true)) PRIMARY KEY (Id)",
            "CREATE CHANGE STREAM Bank FOR Accounts OPTIONS (value_capture_type='NEW_ROW_AND_OLD_VALUES')",
        ],
    )
    last_commit = 0
    for first in range(0, rows, 5000):
        with database.batch() as batch:
            batch.insert(
                "Accounts",
                columns=["Id", "Balance", "Note", "Stamp"],
                values=[
                    [f"a{i:08d}", i, f"note {i}", spanner_lib.COMMIT_TIMESTAMP]
                    for i in range(first, min(rows, first + 5000))
                ],
            )
        last_commit = micros_from_datetime(batch.committed)
    return database, last_commit


def backfill_figures(stack: EmbeddedStack, rows: int) -> list[Figure]:
    """(d) ``rows`` rows of one table: read alone at a snapshot, then backfilled to Kafka; each
    whole, then from its first row (or event on Kafka) to its last."""
    spanner, kafka = stack.endpoint("spanner"), stack.endpoint("kafka")
    database, snapshot = filled_accounts(spanner, rows)

    def read_alone() -> float:
        with database.snapshot(read_timestamp=datetime_from_micros(snapshot)) as reading:
            everything = KeySet(all_=True)  # type: ignore[no-untyped-call]
            read, first = 0, 0.0
            for _ in reading.read("Accounts", ["Id", "Balance", "Note", "Stamp"], everything):
                read += 1
                first = first or time.perf_counter()
            last = time.perf_counter()
        assert read == rows, f"read {read} of {rows} rows"
        return last - first

    alone_spans: list[float] = []
    alone = timed("Spanner client reading the rows alone", rows, lambda: alone_spans.append(read_alone()))

    def backfill_config() -> ProducerConfig:
        """From just after the last commit: the change stream then carries nothing, and the run
        is the backfill alone (from the commit itself, the stream also carried the last commit's
        5,000 changes, which the figure does not count). A topic prefix of its own each time."""
        return bench_config(
            spanner,
            kafka,
            database.database_id,
            start_timestamp_micros=snapshot + 1,
            end_timestamp_micros=snapshot + 2,
            backfill=True,
        )

    for _ in range(BROKER_WARM_UP_PASSES):  # on a warm broker, as (a)
        asyncio.run(asyncio.run(build_service(backfill_config())).run())
    config = backfill_config()
    service = asyncio.run(build_service(config))
    with as_the_command_runs():
        backfill = timed("(d) backfill: rows at a snapshot → Kafka", rows, lambda: asyncio.run(service.run()))
    assert service.backfill is not None and service.backfill.rows_published == rows
    produced = produced_span(kafka, Topics(config.topic_prefix).event("Accounts"), rows)
    return [
        alone,
        backfill,
        Figure("the client alone, first to last row", rows, alone_spans[0]),
        Figure("(d) backfill, first to last event on Kafka", rows, produced),
    ]


def poll_figures(stack: EmbeddedStack, rows: int) -> tuple[Figure, Figure]:
    """(e) ``rows`` rows of one table without a change stream's help: the poll's query run alone,
    then one ``spanner-cdc poll`` poll of all of them to Kafka."""
    spanner, kafka = stack.endpoint("spanner"), stack.endpoint("kafka")
    database, now = filled_accounts(spanner, rows)
    columns = ["Id", "Balance", "Note", "Stamp"]

    def query_alone() -> None:
        chunks = rows_stamped_since(
            database,
            dialect=GOOGLE_STANDARD_SQL,
            snapshot_micros=now,
            table="Accounts",
            columns=columns,
            stamp_column="Stamp",
            key=["Id"],
            since_micros=0,
        )
        read = sum(len(chunk) for chunk in chunks)
        assert read == rows, f"read {read} of {rows} rows"

    alone = timed("Spanner client running the poll's query alone", rows, query_alone)

    async def one_poll() -> Figure:
        """A poll of every row by a started poller, under a topic prefix of its own."""
        config = PollConfig(
            project=EMULATOR_PROJECT,
            instance=INSTANCE,
            database=database.database_id,
            table="Accounts",
            commit_timestamp_column="Stamp",
            kafka_bootstrap=kafka,
            emulator_host=spanner,
            topic_prefix=f"bench-poll-{uuid.uuid4().hex[:6]}",
            progress=False,
        )
        poller = await build_poller(config, ProducerMetrics())
        async with poller.sender.kafka.serving():
            with as_the_command_runs():
                cpu, started = CpuSeconds.now(), time.perf_counter()
                await poller.poll()
                seconds, cpu = time.perf_counter() - started, CpuSeconds.now() - cpu
        assert poller.rows_published == rows, f"published {poller.rows_published} of {rows} rows"
        return Figure("(e) poll: rows stamped since the start → Kafka", rows, seconds, cpu)

    for _ in range(BROKER_WARM_UP_PASSES):  # on a warm broker, as (a)
        asyncio.run(one_poll())
    return alone, asyncio.run(one_poll())


def many_partitions(bootstrap: str, partitions: int, seconds: float) -> dict[str, Any]:
    """(f): ``bench.many_partitions`` in a fresh process (memory a process once used is seldom
    given back, so this process's own RSS says nothing after (a)-(c))."""
    command = [sys.executable, "-m", "bench.many_partitions", "--bootstrap", bootstrap]
    command += ["--partitions", str(partitions), "--seconds", str(seconds)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def bench_config(spanner: str, kafka: str, database: str, **overrides: Any) -> ProducerConfig:
    options: dict[str, Any] = {
        "project": EMULATOR_PROJECT, "instance": INSTANCE, "database": database, "change_stream": "Bank",
        "kafka_bootstrap": kafka, "emulator_host": spanner, "start_timestamp_micros": int(time.time() * 1e6),
        "heartbeat_ms": 1000, "topic_prefix": f"bench-{uuid.uuid4().hex[:6]}", "progress": False,
    }  # fmt: skip
    return ProducerConfig(**{**options, **overrides})


@dataclass(frozen=True)
class LatencyRun:
    """(c) at one rate, heartbeat interval and release order: every event's commit → ack seconds,
    and the rate the writer reached."""

    rate: float
    heartbeat_ms: int
    release_order: str
    samples: list[float]
    achieved_rate: float


async def steady_latency(
    database: Any,
    spanner: str,
    kafka: str,
    *,
    rate: float,
    seconds: float,
    heartbeat_ms: int,
    release_order: str,
) -> LatencyRun:
    """Transactions at up to ``rate`` per second for ``seconds`` while a producer reads them. One
    writer: the emulator runs one transaction at a time (it aborts a second one), so the rate it
    reaches is reported beside the rate asked for."""
    metrics = SampledMetrics()
    config = bench_config(
        spanner, kafka, database.database_id, heartbeat_ms=heartbeat_ms, release_order=release_order
    )
    service = await build_service(config, metrics)
    stop = threading.Event()
    committed = 0

    def write() -> None:
        nonlocal committed
        interval = 1.0 / rate
        next_at = time.monotonic()
        while not stop.is_set():
            with database.batch() as batch:
                batch.insert_or_update(
                    "Accounts", columns=["Id", "Balance"], values=[[f"s{committed % 500}", committed]]
                )
            committed += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    async with running(service):
        await asyncio.sleep(1.0)
        writer = threading.Thread(target=write)
        began = time.monotonic()
        writer.start()
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.to_thread(writer.join)
        writing = time.monotonic() - began
        await asyncio.sleep(2.0)
    return LatencyRun(rate, heartbeat_ms, release_order, metrics.samples, committed / writing)


class SampledMetrics(ProducerMetrics):
    """The producer's metrics, keeping every commit → ack latency for exact percentiles (the
    histogram's buckets are too coarse for a p99)."""

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[float] = []
        self.registry.unregister(self.acknowledged)
        self.acknowledged = SampledEvents(self.samples)
        self.registry.register(self.acknowledged)


class SampledEvents(AcknowledgedEvents):
    """The acknowledged-event metrics, each latency also appended to ``samples``."""

    def __init__(self, samples: list[float]) -> None:
        super().__init__()
        self.samples = samples

    def count(self, table: str, change_type: str, lag_seconds: float | None, events: int = 1) -> None:
        super().count(table, change_type, lag_seconds, events)
        if lag_seconds is not None:
            self.samples.extend(itertools.repeat(lag_seconds, events))


def percentile(samples: list[float], fraction: float) -> float:
    return (
        statistics.quantiles(samples, n=1000)[int(fraction * 1000) - 1] if len(samples) > 1 else float("nan")
    )
