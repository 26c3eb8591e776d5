"""Several producer processes on one change stream, on an emulator whose partition
tokens live 2-4 s (so a backlog is spread over many of them):

(g) the backlog of committed rows → Kafka by 1, 2 and 3 ``spanner-cdc produce --group``
    processes to the end timestamp, in the same run, beside the Spanner client reading the same
    backlog alone; each figure from the processes' start to their exit (joining the group
    included);
(h) a process of two killed with SIGKILL while rows are written: seconds from the kill to the
    first event on Kafka of a partition token of its shards, published by the other.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from bench.backlog import UNDECODED, read_backlog_alone
from bench.producer import Figure, accounts_database, bench_config, produced_span, timed
from spanner_cdc.common.kafka_offsets import READER_SETTINGS
from spanner_cdc.producer.lineage.partitions import shard_of
from spanner_cdc.schemas.timestamps import format_timestamp_micros
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack.services import EMULATOR_PROJECT
from testkit.producer_group import ProducerProcess
from testkit.spanner_db import INSTANCE

SHARDS = 6
GROUP = ("--group", "bench", "--group-shards", str(SHARDS))
#: The group's session timeout in (h): the default of ``--group-session-timeout``.
SESSION_SECONDS = 10


def command(spanner: str, kafka: str, database: Any, prefix: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "spanner_cdc.cli", "produce", "--project", EMULATOR_PROJECT,
        "--instance", INSTANCE, "--database", database.database_id, "--change-stream", "Bank",
        "--emulator-host", spanner, "--kafka-bootstrap", kafka, "--topic-prefix", prefix,
        "--heartbeat-ms", "1000", "--progress", "false", *extra,
    ]  # fmt: skip


def write_rows(database: Any, rows: int, seconds: float) -> None:
    """``rows`` rows in commits of 500 spread over ``seconds``: many partition tokens."""
    commits = max(1, rows // 500)
    for index in range(commits):
        with database.batch() as batch:
            batch.insert_or_update(
                "Accounts",
                columns=["Id", "Balance"],
                values=[[f"a{i}", i] for i in range(index * 500, min(rows, (index + 1) * 500))],
            )
        time.sleep(seconds / commits)


def backlog_figures(spanner: str, kafka: str, rows: int) -> tuple[list[Figure], list[Figure]]:
    """(g): the Spanner client alone, then 1, 2 and 3 processes, each into a prefix of its own;
    each run from its start to its end, and (the second list, the processes' runs only) from
    its first event to its last."""
    database = accounts_database(spanner)
    start = int(time.time() * 1_000_000)
    write_rows(database, rows, 10)
    end = int(time.time() * 1_000_000) + 200_000
    time.sleep(0.5)
    config = bench_config(
        spanner, kafka, database.database_id, start_timestamp_micros=start, end_timestamp_micros=end
    )
    figures = [
        timed(
            "(g) baseline: Spanner client reading the backlog alone, as the producer reads rows",
            rows,
            lambda: read_backlog_alone(database, config, rows, UNDECODED),
        )
    ]
    steady: list[Figure] = []
    span = (
        "--start-timestamp",
        format_timestamp_micros(start),
        "--end-timestamp",
        format_timestamp_micros(end),
    )
    runs = [
        ("1 process without --group", 1, ()),
        *((f"{n} process(es) of a group", n, GROUP) for n in (1, 2, 3)),
    ]
    with tempfile.TemporaryDirectory() as directory:
        for name, count, grouping in runs:
            prefix = f"bench-group-{uuid.uuid4().hex[:6]}"
            run = command(spanner, kafka, database, prefix, *span, *grouping)

            def produce(run: list[str] = run, count: int = count) -> None:
                processes = [
                    ProducerProcess.start(f"p{i}", run, Path(directory) / f"{uuid.uuid4().hex[:6]}.log")
                    for i in range(count)
                ]
                for member in processes:
                    if member.process.wait(600) != 0:
                        log = member.log.read_text()[-2000:]
                        raise RuntimeError(f"{member.name} exited {member.process.returncode}: {log}")

            figures.append(timed(f"(g) {name}, backlog → Kafka", rows, produce))
            first_to_last = produced_span(kafka, Topics(prefix).event("Accounts"), rows)
            steady.append(Figure(f"(g) {name}, first to last event", rows, first_to_last))
    return figures, steady


def first_event_of(kafka: str, topic: str, shards: set[int], after_ms: float, timeout: float) -> float:
    """Kafka timestamp (ms) of the first event after ``after_ms`` whose partition token is in
    ``shards`` (JSON events name it in source_metadata)."""
    consumer = Consumer(
        {
            **READER_SETTINGS,
            "bootstrap.servers": kafka,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout
    first = float("inf")
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None and first < float("inf"):
                return first  # caught up with every partition: nothing earlier is left to read
            value = None if message is None or message.error() is not None else message.value()
            if message is None or value is None:
                continue
            at = float(message.timestamp()[1])
            document = json.loads(value)
            token = document.get("source_metadata", {}).get("partition_token")
            if at > after_ms and token and shard_of(token, SHARDS) in shards:
                first = min(first, at)
    finally:
        consumer.close()
    raise TimeoutError("no event of the killed process's shards reached Kafka")


@dataclass(frozen=True)
class Takeover:
    """(h): the killed process's shards, and seconds from the SIGKILL until the other owned
    them and until its first event of a token in them."""

    shards: set[int]
    owned_seconds: float
    first_event_seconds: float


def takeover(spanner: str, kafka: str) -> Takeover:
    """(h), with rows written every 50 ms meanwhile."""
    database = accounts_database(spanner)
    prefix = f"bench-kill-{uuid.uuid4().hex[:6]}"
    run = command(
        spanner,
        kafka,
        database,
        prefix,
        *GROUP,
        "--format",
        "json",
        "--group-session-timeout",
        str(SESSION_SECONDS),
    )
    stop = threading.Event()

    def write() -> None:
        counter = 0
        while not stop.is_set():
            counter += 1
            with database.batch() as batch:
                batch.insert_or_update(
                    "Accounts", columns=["Id", "Balance"], values=[[f"a{counter % 40}", counter]]
                )
            time.sleep(0.05)

    writing = threading.Thread(target=write)
    with tempfile.TemporaryDirectory() as directory:
        victim, survivor = (
            ProducerProcess.start(name, run, Path(directory) / f"{name}.log")
            for name in ("victim", "survivor")
        )
        try:
            deadline = time.monotonic() + 120
            while not (
                victim.shards() and survivor.shards() and victim.shards() + survivor.shards() == SHARDS
            ):
                if time.monotonic() > deadline:
                    raise TimeoutError("the two processes did not share the shards")
                time.sleep(0.5)
            writing.start()
            time.sleep(5)
            shards = victim.owned_shards()
            os.kill(victim.process.pid, signal.SIGKILL)
            killed_ms = time.time() * 1000
            first_ms = first_event_of(kafka, f"{prefix}.Accounts", shards, killed_ms, 120)
            owned_at = min(at for at, moved, taken in survivor.shard_moves() if taken and moved & shards)
        finally:
            stop.set()
            if writing.is_alive():
                writing.join()
            for member in (victim, survivor):
                if member.process.poll() is None:
                    member.process.send_signal(signal.SIGTERM)
                    member.process.wait(60)
    return Takeover(shards, owned_at - killed_ms / 1000, (first_ms - killed_ms) / 1000)
