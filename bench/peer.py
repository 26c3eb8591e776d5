"""The peer part: the producer beside Debezium's Spanner connector, same emulator database shape,
same workload, same broker, one run.

Debezium runs as Kafka Connect standalone (``bench/debezium/pom.xml``'s jars, of the broker's
Kafka version), its JSON converter without schemas, one task; the producer as
``spanner-cdc produce``. Each is a process of its own, started the same way:

- (a) backlog: ``rows`` changes committed (1,000 a transaction) before either starts; each reads
  them from a start timestamp before the first commit and is timed from its process's start
  until every change is on Kafka for a ``read_committed`` reader. The rate between the first and
  the last record's arrival is printed too (what it sustains, without its start).
- (b) latency: a writer commits ``rate`` transactions/s for ``seconds`` while one of them runs; a
  ``read_committed`` reader notes when each change arrives; commit → arrival p50/p99.

Each run has a database of its own (the emulator's change-stream answers slow down as a
database's transactions pile up).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from bench.jars import bench_jars
from bench.producer import Figure, percentile
from spanner_cdc.common.jars import java_binary, log4j2_to_file
from spanner_cdc.schemas.timestamps import format_timestamp_micros, micros_from_datetime
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.services import EMULATOR_PROJECT
from testkit.spanner_db import INSTANCE, create_database

DDL = [
    "CREATE TABLE Accounts (Id STRING(36) NOT NULL, Balance INT64) PRIMARY KEY (Id)",
    "CREATE CHANGE STREAM Bank FOR Accounts OPTIONS (value_capture_type='NEW_ROW')",
]
#: A change's row id; both systems' messages hold it as plain text (Avro strings, JSON).
ROW_ID = re.compile(rb"r-(\d{9})")
PER_COMMIT = 1_000
DONE_TIMEOUT_SECONDS = 600.0


@dataclass(frozen=True)
class Arrivals:
    """Row number → when a ``read_committed`` reader saw its change first (time.time())."""

    seen: dict[int, float]
    #: time.time() when the system's process was started.
    started: float


@dataclass(frozen=True)
class PeerFigures:
    ours_backlog: Figure
    ours_backlog_steady: Figure
    debezium_backlog: Figure
    debezium_backlog_steady: Figure
    #: (name, p50 ms, p99 ms, changes) of each system's commit → arrival.
    latencies: list[tuple[str, float, float, int]]


def write_rows(database: Any, first: int, count: int) -> int:
    """Rows ``r-<n>`` for n in [first, first + count), 1,000 a commit; the last commit's time."""
    committed = 0
    for start in range(first, first + count, PER_COMMIT):
        with database.batch() as batch:
            batch.insert_or_update(
                "Accounts",
                columns=["Id", "Balance"],
                values=[[f"r-{n:09d}", n] for n in range(start, min(first + count, start + PER_COMMIT))],
            )
        committed = micros_from_datetime(batch.committed)
    return committed


@contextmanager
def watching(bootstrap: str, pattern: str) -> Iterator[dict[int, float]]:
    """Arrival times of every row's first change on the topics matching ``pattern``, noted by a
    ``read_committed`` reader on a thread of its own while the block runs."""
    seen: dict[int, float] = {}
    stop = threading.Event()
    reader = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"peer-{uuid.uuid4().hex[:6]}",
         "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.wait.max.ms": 20,
         "topic.metadata.refresh.interval.ms": 1000}
    )  # fmt: skip
    reader.subscribe([pattern])

    def watch() -> None:
        while not stop.is_set():
            for message in reader.consume(10_000, 0.1):
                if message.error() is None and message.value():
                    now = time.time()
                    for found in ROW_ID.finditer(message.value() or b""):
                        seen.setdefault(int(found[1]), now)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
        reader.close()


def wait_for(seen: dict[int, float], rows: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + DONE_TIMEOUT_SECONDS
    while len(seen) < rows:
        if process.poll() not in (None, 0):
            raise RuntimeError(f"the process stopped ({process.returncode}): see {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(seen)} of {rows} changes after {DONE_TIMEOUT_SECONDS:.0f} s: see {log}")
        time.sleep(0.2)


@dataclass(frozen=True)
class Target:
    """What a system reads (a database of the emulator, from ``start`` to ``end``), where it
    writes, and a directory of its own."""

    spanner: str
    kafka: str
    database: str
    start: int
    end: int | None
    work: Path


def ours(target: Target) -> tuple[list[str], str]:
    """``spanner-cdc produce`` over the target, and its topics' pattern."""
    spanner, kafka, database, start, end = (
        target.spanner, target.kafka, target.database, target.start, target.end
    )  # fmt: skip
    prefix = f"peer-{uuid.uuid4().hex[:6]}"
    command = [
        sys.executable, "-m", "spanner_cdc.cli", "produce", "--project", EMULATOR_PROJECT,
        "--instance", INSTANCE, "--database", database, "--change-stream", "Bank",
        "--emulator-host", spanner, "--kafka-bootstrap", kafka, "--topic-prefix", prefix,
        "--start-timestamp", format_timestamp_micros(start), "--progress", "false",
    ]  # fmt: skip
    if end is not None:
        command += ["--end-timestamp", format_timestamp_micros(end)]
    return command, f"^{re.escape(prefix)}\\..*"


def debezium(target: Target) -> tuple[list[str], str]:
    """Kafka Connect standalone running Debezium's Spanner connector over the target."""
    spanner, kafka, database, start, end, work = (
        target.spanner, target.kafka, target.database, target.start, target.end, target.work
    )  # fmt: skip
    name = f"dbz-{uuid.uuid4().hex[:6]}"
    worker = work / "worker.properties"
    worker.write_text(
        f"bootstrap.servers={kafka}\n"
        "key.converter=org.apache.kafka.connect.json.JsonConverter\n"
        "value.converter=org.apache.kafka.connect.json.JsonConverter\n"
        "key.converter.schemas.enable=false\nvalue.converter.schemas.enable=false\n"
        f"offset.storage.file.filename={work / 'offsets'}\noffset.flush.interval.ms=1000\n"
    )
    connector = work / "connector.properties"
    settings = {
        "name": name,
        "connector.class": "io.debezium.connector.spanner.SpannerConnector",
        "tasks.max": "1",
        "gcp.spanner.change.stream": "Bank",
        "gcp.spanner.project.id": EMULATOR_PROJECT,
        "gcp.spanner.instance.id": INSTANCE,
        "gcp.spanner.database.id": database,
        "gcp.spanner.emulator.host": f"http://{spanner}",
        "gcp.spanner.start.time": format_timestamp_micros(start),
        "connector.spanner.sync.kafka.bootstrap.servers": kafka,
        "topic.prefix": name,
    }
    if end is not None:
        settings["gcp.spanner.end.time"] = format_timestamp_micros(end)
    connector.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    log4j = log4j2_to_file(work / "log4j2.properties", work / "connect.log")
    classpath = ":".join(str(jar) for jar in bench_jars("debezium"))
    command = [java_binary(), "-Xmx1g", log4j, "-cp", classpath,
               "org.apache.kafka.connect.cli.ConnectStandalone", str(worker), str(connector)]  # fmt: skip
    return command, f"^{re.escape(name)}\\.Accounts$"


System = Callable[[Target], tuple[list[str], str]]
SYSTEMS: dict[str, System] = {"spanner-cdc produce": ours, "Debezium Spanner connector": debezium}


def run_system(system: System, target: Target, act: Callable[[], int]) -> Arrivals:
    """``system`` started over ``target``; ``act`` runs once it started and says how many rows
    to wait for."""
    kafka, work = target.kafka, target.work
    command, pattern = system(target)
    log = work / "process.log"
    with log.open("wb") as output, watching(kafka, pattern) as seen:
        started = time.time()
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=work)
        try:
            rows = act()
            wait_for(seen, rows, process, log)
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    shutil.rmtree(work, ignore_errors=True)
    return Arrivals(dict(seen), started)


def target(stack: EmbeddedStack, database: Any, start: int, end: int | None) -> Target:
    work = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    return Target(stack.endpoint("spanner"), stack.endpoint("kafka"), database.database_id, start, end, work)


def backlog(system: System, name: str, stack: EmbeddedStack, rows: int) -> tuple[Figure, Figure]:
    database = create_database(stack.endpoint("spanner"), DDL)
    start = write_rows(database, 0, 1) - 1  # row 0 opens the window; the rest is the backlog
    end = write_rows(database, 1, rows) + 1
    arrivals = run_system(system, target(stack, database, start, end), lambda: rows + 1)
    times = sorted(arrivals.seen.values())
    whole = Figure(f"(a) {name}: backlog → Kafka, from its start", rows + 1, times[-1] - arrivals.started)
    steady = Figure(f"(a) {name}: first to last change on Kafka", rows, max(times[-1] - times[0], 1e-6))
    return whole, steady


def latency(
    system: System, name: str, stack: EmbeddedStack, rate: float, seconds: float
) -> tuple[str, float, float, int]:
    database = create_database(stack.endpoint("spanner"), DDL)
    start = write_rows(database, 0, 1)
    commits: dict[int, int] = {}

    def write() -> int:
        time.sleep(15.0)  # both start and read the first row before the clock runs
        interval, next_at, row = 1.0 / rate, time.monotonic(), 1
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            commits[row] = write_rows(database, row, 1)
            row += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        return row

    arrivals = run_system(system, target(stack, database, start, None), write)
    samples = [arrivals.seen[row] - micros / 1e6 for row, micros in commits.items() if row in arrivals.seen]
    return name, percentile(samples, 0.5) * 1000, percentile(samples, 0.99) * 1000, len(samples)


def peer_figures(stack: EmbeddedStack, rows: int, rate: float, seconds: float) -> PeerFigures:
    (ours_whole, ours_steady), (dbz_whole, dbz_steady) = (
        backlog(system, name, stack, rows) for name, system in SYSTEMS.items()
    )
    latencies = [latency(system, name, stack, rate, seconds) for name, system in SYSTEMS.items()]
    return PeerFigures(ours_whole, ours_steady, dbz_whole, dbz_steady, latencies)
