"""A producer run under partition churn, shared by the producer and end-to-end consumer tests."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from producer.config import ProducerConfig
from producer.main import build_service
from producer.partitions import ROOT, PartitionScheduler
from producer.query import ChangeStreamQuery
from producer.records import ChangeStreamRecord, timestamp_micros
from producer.service import ProducerService
from schemas.events import DataChangeRecord
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.services import EMULATOR_PROJECT
from tests.support.kafka_read import Received, read_events
from tests.support.spanner_db import INSTANCE, create_database
from tests.support.workload import AccountWriter

ACCOUNTS_DDL = [
    "CREATE TABLE Accounts (Id STRING(36) NOT NULL, Balance INT64, "
    "LastUpdate TIMESTAMP OPTIONS (allow_commit_timestamp=true)) PRIMARY KEY (Id)",
    "CREATE CHANGE STREAM Bank FOR Accounts OPTIONS (value_capture_type='NEW_ROW_AND_OLD_VALUES')",
]


def now_micros() -> int:
    return int(time.time() * 1_000_000)


def producer_config(spanner: str, kafka: str, database: Any, stream: str, **overrides: Any) -> ProducerConfig:
    options: dict[str, Any] = {
        "project": EMULATOR_PROJECT,
        "instance": INSTANCE,
        "database": database.database_id,
        "change_stream": stream,
        "kafka_bootstrap": kafka,
        "emulator_host": spanner,
        "start_timestamp_micros": now_micros(),
        "heartbeat_ms": 1000,
        "topic_prefix": f"{stream}-{uuid.uuid4().hex[:8]}",
        "progress": False,
        "checkpoint_interval": 0.2,
    }
    return ProducerConfig(**{**options, **overrides})


def produce_command(
    spanner: str, kafka: str, database: Any, stream: str, prefix: str, *extra: str
) -> list[str]:
    return [
        sys.executable, "-m", "spanner_cdc.cli", "produce",
        "--project", EMULATOR_PROJECT, "--instance", INSTANCE, "--database", database.database_id,
        "--change-stream", stream, "--emulator-host", spanner, "--kafka-bootstrap", kafka,
        "--topic-prefix", prefix, "--heartbeat-ms", "1000", "--progress", "false",
        "--checkpoint-interval", "0.2", *extra,
    ]  # fmt: skip


def lineage_depth(scheduler: PartitionScheduler) -> int:
    """Generations below the initial query: how many churn cycles the run went through."""
    depth: dict[str, int] = {ROOT: 0}

    def of(token: str) -> int:
        if token not in depth:
            parents = scheduler.partitions[token].parents
            depth[token] = 1 + max(of(parent) for parent in parents)
        return depth[token]

    return max(of(token) for token in scheduler.partitions)


#: More skipped changes than this in one run is not the emulator's rare boundary case.
MAX_EMULATOR_SKIPS = 3
Change = tuple[str, int, int]


class SourceLog:
    """Every Accounts change (Id, Balance, commit µs) the emulator's queries returned to one
    in-process producer.

    The emulator's live partition queries can skip a committed change (docs/facts.md): in a
    churn run no live query returned it, while a historical query of the same stream did. So
    "every committed change reached Kafka" has two failure modes to tell apart: a change a
    query returned and the producer did not publish (the producer's fault: always a failure),
    and a change no live query returned (the emulator's: accepted only when a historical read
    of the stream returns it, and only a few times per run).
    """

    def __init__(self, service: ProducerService) -> None:
        self.config = service.config
        self.returned: set[Change] = set()
        read = service.source.read

        def recording(
            query: ChangeStreamQuery, token: str | None, start_micros: int
        ) -> Iterator[list[ChangeStreamRecord]]:
            for records in read(query, token, start_micros):
                self.returned.update(changes_in(records))
                yield records

        setattr(service.source, "read", recording)  # noqa: B010 - wraps the instance's real method

    def explain_missing(self, missing: Iterable[Change]) -> None:
        """Fail unless every missing change is one the emulator's live queries skipped."""
        missing = set(missing)
        dropped = sorted(missing & self.returned)
        assert not dropped, (
            f"Spanner returned {len(dropped)} changes the producer did not publish: {dropped[:3]}"
        )
        assert len(missing) <= MAX_EMULATOR_SKIPS, (
            f"{len(missing)} committed changes missing: {sorted(missing)[:3]}"
        )
        unexplained = sorted(missing - self.read_again())
        assert not unexplained, f"committed changes no query of the stream returns: {unexplained[:3]}"

    def read_again(self) -> set[Change]:
        """The stream from the run's start until now, read historically into a new prefix."""
        again = produce_to_now(
            dataclasses.replace(self.config, topic_prefix=f"{self.config.topic_prefix}-again")
        )
        return {change_of(e) for e in read_events(again.kafka_bootstrap, again.topic_prefix, "Accounts")}


def change_of(event: Received) -> Change:
    """An Accounts event as the change it carries: (Id, Balance, commit µs)."""
    payload = event.value["payload"]
    commit = timestamp_micros(event.value["source_metadata"]["commit_timestamp"])
    return payload["Id"], payload["Balance"], commit


def changes_in(records: list[ChangeStreamRecord]) -> Iterator[Change]:
    for record in records:
        if isinstance(record, DataChangeRecord):
            for mod in record.mods:
                balance = mod.new_values.get("Balance")
                if balance is not None:
                    yield str(mod.keys["Id"]), int(balance), record.commit_timestamp_micros


async def run_churn(
    spanner: str, kafka: str, min_seconds: float, max_seconds: float
) -> tuple[ProducerService, list[Received], AccountWriter, Any, SourceLog]:
    """Writes while partitions churn until a merge and lineage depth 4 were seen; the producer's
    service, the events on Kafka, the writer, the database and what the emulator returned."""
    database = create_database(spanner, ACCOUNTS_DDL)
    config = producer_config(spanner, kafka, database, "Bank")
    service = await build_service(config)
    source_log = SourceLog(service)
    writer = AccountWriter(database)
    async with service.running():
        writing = asyncio.create_task(asyncio.to_thread(writer.run, max_seconds))
        started = time.monotonic()
        while not writing.done():
            await asyncio.sleep(0.5)
            churned = service.scheduler.merges_seen and lineage_depth(service.scheduler) >= 4
            if time.monotonic() - started >= min_seconds and churned:
                writer.stop()
        await writing
        last_commit = max(c.commit_micros for c in writer.committed)
        await service.wait_until(lambda: (service.scheduler.low_watermark_micros() or 0) > last_commit, 120)
    events = read_events(kafka, config.topic_prefix, "Accounts")
    return service, events, writer, database, source_log


async def produce_until_end(config: ProducerConfig) -> ProducerService:
    """Run the producer to its end timestamp (it returns once every partition finished)."""
    service = await build_service(config)
    await asyncio.wait_for(service.run(), 120)
    return service


def wait_past(micros: int) -> None:
    """Change streams are read up to an end timestamp that must be in the past to finish."""
    time.sleep(max(0.0, (micros - now_micros()) / 1_000_000) + 0.2)


def produce_to_now(config: ProducerConfig) -> ProducerConfig:
    """Run ``config`` from its start until now (its end timestamp), once that is past; the
    config that ran."""
    end = now_micros() + 500_000
    wait_past(end)
    ran = dataclasses.replace(config, end_timestamp_micros=end)
    asyncio.run(produce_until_end(ran))
    return ran


def produce_since(
    stack: EmbeddedStack, database: Any, stream: str, start: int, **overrides: Any
) -> ProducerConfig:
    """Produce everything committed from ``start`` until now, to the end timestamp."""
    config = producer_config(
        stack.endpoint("spanner"), stack.endpoint("kafka"), database, stream,
        start_timestamp_micros=start, **overrides,
    )  # fmt: skip
    return produce_to_now(config)
