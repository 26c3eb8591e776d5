"""The reliability suite: the pipeline under kills, stalls and outages, then checked end to end.

While accounts change continuously and the emulator's partitions split and merge every few
seconds, the producer is killed with SIGKILL at random moments and restarted, the consumer too
(its whole process group, Spark included), the broker is frozen (SIGSTOP) and so is the
emulator; in the long form the broker is also SIGKILLed and started again on its log
directories. At the end a last producer run reads to an end timestamp and a last consumer run
drains Kafka. Then:

- ``lost``: committed changes missing from Kafka (must be 0);
- ``twice_on_kafka``: changes a ``read_committed`` reader sees more than once (must be 0: each
  producer transaction carries the checkpoints of its own events);
- ``new_uuid``: changes Kafka holds more than once under different uuids (must be 0);
- ``dup_after_sinks``: changes the changelog holds more than once (must be 0);
- ``missing_after_sinks``: committed changes the changelog does not hold (must be 0);
- ``order_violations``: keys whose replica row is not their last committed value (must be 0);
- ``checkpoints_back``: checkpoint records lower than one committed before them, or after their
  partition's FINISHED one (must be 0).

``make chaos`` runs the long form (CHAOS_SCALE=full: ≥ 2 minutes of writes, ≥ 10 producer
kills, ≥ 5 consumer kills, a 30 s broker stall, the broker killed for 10 s) and prints the
summary line; ``make test`` runs the short form.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spanner_cdc.consumer.readers import changelog_rows, replica_rows
from spanner_cdc.schemas.timestamps import format_timestamp_micros
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack, stop_on_signals
from testkit.consumer_run import consume_command, consumer_config, on_disk, unique_prefix
from testkit.producer_run import checkpointed_partitions
from testkit.spanner_db import create_database
from tests.support.broker import OwnBroker
from tests.support.churn import (
    ACCOUNTS_DDL,
    RERUN_ON_EMULATOR_SKIP,
    bank_source_log,
    now_micros,
    produce_command,
)
from tests.support.freezing import frozen
from tests.support.kafka_read import Received, read_all, read_events
from tests.support.workload import AccountWriter

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.chaos]


@dataclasses.dataclass(frozen=True)
class Scale:
    write_seconds: float
    producer_life: tuple[float, float]  # seconds a producer runs before its SIGKILL
    consumer_kills: int
    broker_stall: float
    spanner_stall: float
    broker_down: float = 0.0  # seconds between the broker's SIGKILL and its start; 0: no kill


SCALES = {
    "short": Scale(write_seconds=45, producer_life=(4, 9), consumer_kills=2, broker_stall=8, spanner_stall=5),
    "full": Scale(
        write_seconds=150,
        producer_life=(4, 11),
        consumer_kills=6,
        broker_stall=30,
        spanner_stall=15,
        broker_down=10,
    ),
}


@pytest.fixture
def chaos_stack(tmp_path: Path) -> Iterator[tuple[EmbeddedStack, OwnBroker]]:
    """An emulator with fast partition churn and a broker of this test's own (they get frozen,
    the broker killed and started again)."""
    with stop_on_signals():
        stack = EmbeddedStack.start(names=("spanner",), churn_seconds=2)
        try:
            broker = OwnBroker(tmp_path / "kafka")
            try:
                yield stack, broker
            finally:
                broker.stop()
        finally:
            stack.stop()


class Restarts:
    """Runs a command again and again, SIGKILLing its process group after a random lifetime."""

    def __init__(self, command: list[str], lifetimes: Iterator[float], log: Path) -> None:
        self.command, self.lifetimes, self.log = command, lifetimes, log
        self.kills = 0
        self.mid_batch_kills = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        with self.log.open("a") as log:
            for lifetime in self.lifetimes:
                if self.stop.is_set():
                    return
                process = subprocess.Popen(
                    self.command, env=env, stdout=log, stderr=log, start_new_session=True
                )
                self.stop.wait(lifetime)
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(60)
                self.kills += 1
                self.after_kill()

    def after_kill(self) -> None:
        """Hook: what a kill left behind."""


class ConsumerRestarts(Restarts):
    def __init__(self, command: list[str], lifetimes: Iterator[float], log: Path, spark: Path) -> None:
        super().__init__(command, lifetimes, log)
        self.spark = spark

    def after_kill(self) -> None:
        """A planned batch (offsets/N) without its commit (commits/N): the kill was mid-batch."""
        if _last(self.spark / "offsets") > _last(self.spark / "commits"):
            self.mid_batch_kills += 1


def _last(directory: Path) -> int:
    return max((int(p.name) for p in directory.glob("[0-9]*") if p.name.isdigit()), default=-1)


def freeze(pgid: int, seconds: float) -> None:
    with frozen(pgid):
        time.sleep(seconds)


@RERUN_ON_EMULATOR_SKIP
def test_the_pipeline_loses_and_duplicates_nothing_under_kills_and_stalls(
    chaos_stack: tuple[EmbeddedStack, OwnBroker], tmp_path: Path
) -> None:
    scale = SCALES[os.environ.get("CHAOS_SCALE", "short")]
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "17")))
    stack, broker = chaos_stack
    spanner, kafka = stack.endpoint("spanner"), broker.bootstrap
    database = create_database(spanner, ACCOUNTS_DDL)
    prefix = unique_prefix("chaos")
    start = now_micros()
    producing = produce_command(
        spanner, kafka, database, "Bank", prefix, "--start-timestamp", _rfc3339(start), "--log-level", "debug"
    )
    consumer = consumer_config(kafka, prefix, tmp_path / "consumer")
    producers = Restarts(
        producing, iter(lambda: rng.uniform(*scale.producer_life), None), tmp_path / "producer.log"
    )
    consumers = ConsumerRestarts(
        consume_command(consumer),
        iter([rng.uniform(20, 35) for _ in range(scale.consumer_kills)]),
        tmp_path / "consumer.log",
        on_disk(consumer).spark_checkpoint,
    )
    writer = AccountWriter(database)
    writing = threading.Thread(target=writer.run, args=(scale.write_seconds,))
    for thread in (writing, producers.thread, consumers.thread):
        thread.start()
    try:
        time.sleep(scale.write_seconds * 0.25)
        freeze(broker.pgid, scale.broker_stall)
        time.sleep(scale.write_seconds * 0.15)
        freeze(_pgid(stack, "spanner"), scale.spanner_stall)
        if scale.broker_down:
            time.sleep(scale.write_seconds * 0.15)
            broker.kill()
            time.sleep(scale.broker_down)
            broker.start_again()
        writing.join()
    finally:
        writer.stop()
        producers.stop.set()
        producers.thread.join()
        consumers.thread.join()
    end = now_micros() + 1_000_000
    time.sleep(1.5)
    last_producer = subprocess.run(
        [*producing, "--end-timestamp", _rfc3339(end)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert last_producer.returncode == 0, last_producer.stderr[-3000:]
    source_log = bank_source_log(spanner, kafka, database, prefix, start)
    source_log.add((tmp_path / "producer.log").read_text() + last_producer.stderr)
    # What the killed runs left, in batches of any size (a batch a kill left planned is replayed
    # as planned: its size is Spark's offsets log's, not this option's).
    last_consumer = subprocess.run(
        consume_command(consumer, "--available-now", "true", max_events_per_batch=5000),
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert last_consumer.returncode == 0, last_consumer.stderr[-3000:]

    events = read_events(kafka, prefix, "Accounts")
    figures = outcome(events, consumer, writer, database)
    figures["checkpoints_back"] = checkpoints_back(kafka, prefix)
    merges = sum(1 for state in partition_states(kafka, prefix) if len(state["parents"]) > 1)
    summary = (
        f"producer_kills={producers.kills} consumer_kills={consumers.kills} "
        f"(mid-batch {consumers.mid_batch_kills}) stalls=2 broker_kills={int(bool(scale.broker_down))} "
        f"merges={merges} committed={len(writer.committed)} "
        + " ".join(f"{name}={value}" for name, value in figures.items())
    )
    print(f"\nchaos: {summary}")
    source_log.check_heard(events)
    with source_log.diagnosing():
        assert set(figures.values()) == {0}, summary + twice_report(events, tmp_path / "producer.log")
    assert producers.kills >= 3 and consumers.kills == scale.consumer_kills


def checkpoints_back(kafka: str, prefix: str) -> int:
    """Checkpoint records that set their partition back: lower than one committed before them,
    or after its FINISHED one (must be 0: a restart would resume from them and repeat changes)."""
    newest: dict[bytes, dict[str, Any]] = {}
    back = 0
    for _, _, key, value in read_all(kafka, Topics(prefix).checkpoints):
        assert key is not None and value is not None
        record = json.loads(value)
        before = newest.get(key)
        if before is not None and (
            before["state"] == "FINISHED" or record["checkpoint_micros"] < before["checkpoint_micros"]
        ):
            back += 1
        newest[key] = record
    return back


def partition_states(kafka: str, prefix: str) -> list[dict[str, Any]]:
    """The producer's partition table as its checkpoint topic holds it (merges have 2+ parents)."""
    return [partition.to_json() for partition in checkpointed_partitions(kafka, prefix)]


def outcome(events: list[Received], consumer: Any, writer: AccountWriter, database: Any) -> dict[str, int]:
    committed = collections.Counter((c.key, c.balance) for c in writer.committed)
    on_kafka = collections.Counter(event.value["uuid"] for event in events)
    uuids: dict[tuple[str, int], set[str]] = collections.defaultdict(set)
    for event in events:
        uuids[(event.value["payload"]["Id"], event.value["payload"]["Balance"])].add(event.value["uuid"])
    changelog = collections.Counter(
        (key, balance)
        for _, key, balance in changelog_rows(consumer, "Accounts", '"envelope$uuid", "Id", "Balance"')
    )
    last: dict[str, int] = {}
    for change in sorted(writer.committed, key=lambda c: c.commit_micros):
        last[change.key] = change.balance
    replica = dict(replica_rows(consumer, "Accounts", '"Id", "Balance"'))
    with database.snapshot() as snapshot:
        source = dict(tuple(row) for row in snapshot.execute_sql("SELECT Id, Balance FROM Accounts"))
    assert source == last, "the writer's record of its commits disagrees with Spanner"
    return {
        "lost": sum(1 for change in committed if change not in uuids),
        "twice_on_kafka": sum(count - 1 for count in on_kafka.values() if count > 1),
        "new_uuid": sum(1 for found in uuids.values() if len(found) > 1),
        "dup_after_sinks": sum(count - 1 for count in changelog.values() if count > 1),
        "missing_after_sinks": sum(1 for change in committed if change not in changelog),
        "order_violations": sum(1 for key, balance in last.items() if replica.get(key) != balance),
    }


def twice_report(events: list[Received], producer_log: Path) -> str:
    """For changes Kafka holds twice: per partition token, how many, their commit times, when
    each copy was read, and the producer's query starts of that token (its debug lines)."""
    copies: dict[str, list[Received]] = collections.defaultdict(list)
    for event in events:
        copies[event.value["uuid"]].append(event)
    by_token: dict[str, list[list[Received]]] = collections.defaultdict(list)
    for found in copies.values():
        if len(found) > 1:
            by_token[token_of(found[0])].append(found)
    log_lines = producer_log.read_text().splitlines() if producer_log.exists() else []
    lines = []
    for token, twice in sorted(by_token.items(), key=lambda item: -len(item[1]))[:5]:
        commits = sorted(str(found[0].value["source_timestamp"]) for found in twice)
        reads = sorted({tuple(str(e.value["read_timestamp"]) for e in found) for found in twice})
        tokens = sorted({tuple(token_of(e)[-10:] for e in found) for found in twice})
        starts = [line for line in log_lines if f"partition {token}: query started" in line]
        lines.append(
            f"\n  {token[:24]}: {len(twice)} twice, commits {commits[0]}..{commits[-1]}, "
            f"reads {reads[0]}..{reads[-1]}, copies' tokens {tokens[:3]}, starts: {starts[-8:]}"
        )
    return "".join(lines)


def token_of(event: Received) -> str:
    return str(event.value["source_metadata"]["partition_token"])


def _pgid(stack: EmbeddedStack, name: str) -> int:
    pgid = stack.services[name].pgid
    assert pgid is not None, f"{name} is not a local process"
    return pgid


def _rfc3339(micros: int) -> str:
    return format_timestamp_micros(micros)
