"""``make demo``: the whole pipeline, live, on the embedded stack, then a verification report.

The producer and the consumer run while the bank workload (spanner_cdc.bank) moves money,
records and deletes transfers and, halfway, adds a column to Transfers. A live line shows both
sides; when the workload stops, the demo waits until the replica's consistent cut passes the
last commit, stops both, and checks the result against Spanner.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import statistics
import tempfile
import threading
import time
from contextlib import closing, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer
from rich import box
from rich.console import Console
from rich.table import Table

from spanner_cdc.common.kafka_offsets import READER_SETTINGS, read_to_end
from spanner_cdc.common.progress import show_progress
from spanner_cdc.common.spanner_client import create_emulator_database
from spanner_cdc.consumer.config import ConsumerConfig
from spanner_cdc.consumer.decode.schema_topic import SchemaTopic
from spanner_cdc.consumer.main import ConsumerJob, wait_until_started
from spanner_cdc.consumer.readers import changelog_rows, replica_rows
from spanner_cdc.consumer.sinks.replica.sink import ReplicaCommit
from spanner_cdc.consumer.spark.graceful_stop import StopRequest
from spanner_cdc.consumer.spark.session import spark_session
from spanner_cdc.demo.bank import DDL, STREAM, TABLE_COLUMNS, TOTAL, BalanceWatch, BankWorkload
from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.producer.main import build_service
from spanner_cdc.producer.service import ProducerService
from spanner_cdc.producer.status import describe
from spanner_cdc.schemas.timestamps import timestamp_micros
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.services import EMULATOR_PROJECT

#: How long the replica may take to pass the last commit once the workload stopped.
CATCH_UP_SECONDS = 180
#: Latency settings (docs/consumer.md, "Latency"): a watermark round soon after the events it
#: covers, so both usually arrive in one micro-batch; micro-batches back to back (one takes
#: about 0.45 s at the demo's rate). The heartbeat stays at Spanner's minimum, 1 s.
DEMO_WATERMARK_INTERVAL = 0.1
DEMO_TRIGGER_SECONDS = 0.1
#: The report's width, on a terminal or not (off one rich would assume 80 columns and wrap).
REPORT_WIDTH = 100


@dataclass
class ReplicaWatch:
    """The consumer's side, seen after every committed replica batch."""

    balances: BalanceWatch = field(default_factory=BalanceWatch)
    latencies: list[float] = field(default_factory=list)
    cut_micros: int = 0
    held: int = 0

    def __call__(self, commit: ReplicaCommit) -> None:
        now = time.time()
        self.latencies += [now - micros / 1_000_000 for micros in commit.applied_commits]
        self.cut_micros = max(self.cut_micros, commit.cut_micros or 0)
        self.held = commit.held
        self.balances(commit)

    def describe(self) -> str:
        lag = f"{max(0.0, time.time() - self.cut_micros / 1e6):.1f}s" if self.cut_micros else "-"
        return f"replica: {len(self.latencies)} applied, cut lag {lag}, held {self.held}"


class ProducerThread:
    """The producer service on an event loop of its own, beside Spark's blocking calls.

    It also draws the live line (both sides), so one place owns the terminal.
    """

    def __init__(self, config: ProducerConfig, replica: ReplicaWatch) -> None:
        self.config = config
        self.replica = replica
        self.service: ProducerService | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def __enter__(self) -> ProducerService:
        self._thread.start()
        self._ready.wait()
        if self.service is None:
            raise RuntimeError("the producer did not start") from self._error
        return self.service

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._loop is not None and self.service is not None:
            # A producer that stopped on its own (an error) has closed its loop: nothing to stop,
            # and its error, not the closed loop's, is what the caller must see.
            with suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self.service.request_stop)
        self._thread.join()
        if self._error is not None and error is None:
            raise self._error

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # handed to the main thread by __exit__
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        service = await build_service(self.config)
        self.service, self._loop = service, asyncio.get_running_loop()
        self._ready.set()
        stop_progress = asyncio.Event()
        started_at = time.monotonic()
        progress = asyncio.create_task(
            show_progress(
                lambda: f"producer: {describe(service, started_at)} | {self.replica.describe()}",
                stop_progress,
            )
        )
        try:
            await service.run()
        finally:
            stop_progress.set()
            await progress


@dataclass(frozen=True)
class BankRun:
    """One run of the bank workload through the whole pipeline, for the report (or a benchmark)."""

    database: Any
    consumer: ConsumerConfig
    workload: BankWorkload
    watch: ReplicaWatch


def run_demo(seconds: float, rate: float, replica: str) -> int:
    """Returns the exit code: 0 when every check holds."""
    stack = EmbeddedStack.start()
    try:
        started = time.monotonic()
        run = run_bank(stack, Path(tempfile.mkdtemp(prefix="spanner-cdc-demo-")), seconds, rate, replica)
        print(f"[4/4] producer and consumer stopped after {time.monotonic() - started:.0f} s")
        return report(run.database, run.consumer, run.workload, run.watch)
    finally:
        stack.stop()


def run_bank(stack: EmbeddedStack, workdir: Path, seconds: float, rate: float, replica: str) -> BankRun:
    """A bank database on ``stack``'s emulator, and the workload through producer and consumer
    (writing to ``workdir``) until the replica has every change."""
    spanner, kafka = stack.endpoint("spanner"), stack.endpoint("kafka")
    database_id = f"bank-{dt.datetime.now(dt.UTC):%H%M%S}"
    database = create_emulator_database(spanner, EMULATOR_PROJECT, "demo", database_id, DDL)
    print(f"[1/4] database {database_id}: Accounts, Transfers, change stream {STREAM} → {database_id}.*")
    producer = ProducerConfig(
        project=EMULATOR_PROJECT,
        instance="demo",
        database=database_id,
        change_stream=STREAM,
        # Topics (and so the producer's checkpoint) of this database's own: a second run on the
        # same broker must neither resume the first's partitions nor mix its changes in.
        topic_prefix=database_id,
        kafka_bootstrap=kafka,
        emulator_host=spanner,
        start_timestamp_micros=timestamp_micros(dt.datetime.now(dt.UTC)),
        heartbeat_ms=1000,
        watermark_interval=DEMO_WATERMARK_INTERVAL,
    )
    consumer = ConsumerConfig(
        kafka_bootstrap=kafka,
        topic_prefix=database_id,
        output_dir=str(workdir),
        replica=replica,
        postgres_dsn=stack.endpoint("postgres") if replica == "postgres" else None,
        trigger_seconds=DEMO_TRIGGER_SECONDS,
    )
    watch = ReplicaWatch()
    workload = BankWorkload(database)
    run_pipeline(producer, consumer, watch, workload, seconds=seconds, rate=rate)
    return BankRun(database, consumer, workload, watch)


def run_pipeline(
    producer: ProducerConfig,
    consumer: ConsumerConfig,
    watch: ReplicaWatch,
    workload: BankWorkload,
    *,
    seconds: float,
    rate: float,
) -> None:
    """Producer and consumer running while the workload writes; returns once the replica's
    consistent cut has passed the workload's last commit and both stopped."""
    job = ConsumerJob.open(consumer, watch)
    spark = spark_session(
        consumer.spark_master,
        "spanner-cdc-demo",
        consumer.spark_conf,
        log_dir=consumer.local_directory / "logs",
        delta=consumer.replica == "delta",
    )
    try:
        with ProducerThread(producer, watch):
            query = job.start(spark)
            wait_until_started(query, CATCH_UP_SECONDS)  # latency figures without Spark's start-up
            print(
                f"[2/4] producer and consumer ({consumer.replica} replica) running: {seconds:.0f} s of writes"
            )
            workload.open_accounts()
            workload.run(seconds / 2, rate)
            workload.add_memo_column()
            workload.run(seconds / 2, rate)
            last_commit = timestamp_micros(dt.datetime.now(dt.UTC))
            print(
                f"[3/4] committed {workload.changes} changes ({workload.transfers} transfers, "
                "Transfers.Memo added halfway); waiting for the replica to catch up"
            )
            deadline = time.monotonic() + CATCH_UP_SECONDS
            while watch.cut_micros < last_commit and query.isActive and time.monotonic() < deadline:
                time.sleep(0.5)
            job.run_until_stopped(query, StopRequest.already())
    finally:
        job.close()
        spark.stop()


def save_sample_event(config: ConsumerConfig, table: str) -> Path:
    """The newest event of ``table``'s topic, decoded, as JSON in the output directory (the
    example event of docs/guarantees.md comes from here)."""
    schemas = SchemaTopic(config.client_config, config.topic_prefix)
    schemas.refresh()
    reader = Consumer({**READER_SETTINGS, **config.client_config, "group.id": "spanner-cdc-demo"})
    try:
        with closing(read_to_end(reader, config.topics.event(table), {})) as messages:
            store = schemas.store()
            events = (store.decode(value) for _, _, key, value in messages if key is not None and value)
            newest = max(events, key=lambda event: tuple(event["sort_keys"]))
    finally:
        reader.close()
    path = config.local_directory / "sample-event.json"
    path.write_text(json.dumps(newest, indent=2, default=str) + "\n")
    return path


@dataclass(frozen=True)
class Check:
    """One line of the demo's report: what Spanner (or the workload) says, what the pipeline has."""

    what: str
    expected: object
    found: object
    held: bool


def report(database: Any, config: ConsumerConfig, workload: BankWorkload, watch: ReplicaWatch) -> int:
    """Print the checks as one table, then the latency; 0 when all checks hold."""
    compared = {**TABLE_COLUMNS, "Transfers": (*TABLE_COLUMNS["Transfers"], "Memo")}
    checks: list[Check] = []
    changelog = 0
    for table, columns in compared.items():
        with database.snapshot() as snapshot:
            source = sorted(
                tuple(r) for r in snapshot.execute_sql(f"SELECT {', '.join(columns)} FROM {table}")
            )
        replica = replica_rows(config, table, ", ".join(f'"{c}"' for c in columns))
        checks.append(Check(f"{table} rows, row for row", len(source), len(replica), source == replica))
        changelog += len(changelog_rows(config, table, '"envelope$uuid"'))
    checks.append(
        Check(
            "changelog rows = changes committed", workload.changes, changelog, changelog == workload.changes
        )
    )
    sums = watch.balances.sums
    checks.append(
        Check(
            "sum of balances at every replica commit",
            TOTAL,
            f"{sum(1 for s in sums if s == TOTAL)} of {len(sums)} commits",
            watch.balances.held,
        )
    )
    total = sum(int(row[1]) for row in replica_rows(config, "Accounts", '"Id", "Balance"'))
    checks.append(Check("sum of balances in the replica at the end", TOTAL, total, total == TOTAL))
    shown = Table("check", "Spanner", "pipeline", "result", box=box.SIMPLE_HEAD, padding=(0, 1))
    for check in checks:
        shown.add_row(check.what, str(check.expected), str(check.found), "ok" if check.held else "FAIL")
    Console(width=REPORT_WIDTH).print(shown)
    if len(watch.latencies) >= 2:
        cuts = statistics.quantiles(watch.latencies, n=100)
        print(
            f"  commit → replica latency p50 {cuts[49] * 1000:,.0f} ms, p99 {cuts[98] * 1000:,.0f} ms "
            f"over {len(watch.latencies)} changes"
        )
    sample = save_sample_event(config, "Transfers")
    print(f"  outputs: {config.output_dir} (changelog/, replica, quarantine/, {sample.name})")
    return 0 if all(check.held for check in checks) else 1
