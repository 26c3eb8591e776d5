"""A producer run under partition churn, shared by the producer and end-to-end consumer tests."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any

from producer.config import ProducerConfig
from producer.main import build_service
from producer.partitions import ROOT, PartitionScheduler
from producer.service import ProducerService
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


async def run_churn(
    spanner: str, kafka: str, min_seconds: float, max_seconds: float
) -> tuple[ProducerService, list[Received], AccountWriter, Any]:
    """Writes while partitions churn until a merge and lineage depth 4 were seen; the producer's
    service, the events on Kafka, the writer and the database."""
    database = create_database(spanner, ACCOUNTS_DDL)
    config = producer_config(spanner, kafka, database, "Bank")
    service = await build_service(config)
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
    return service, events, writer, database


async def produce_until_end(config: ProducerConfig) -> ProducerService:
    """Run the producer to its end timestamp (it returns once every partition finished)."""
    service = await build_service(config)
    await asyncio.wait_for(service.run(), 120)
    return service


def wait_past(micros: int) -> None:
    """Change streams are read up to an end timestamp that must be in the past to finish."""
    time.sleep(max(0.0, (micros - now_micros()) / 1_000_000) + 0.2)


def produce_since(
    stack: EmbeddedStack, database: Any, stream: str, start: int, **overrides: Any
) -> ProducerConfig:
    """Produce everything committed from ``start`` until now, to the end timestamp."""
    end = now_micros() + 500_000
    wait_past(end)
    config = producer_config(
        stack.endpoint("spanner"), stack.endpoint("kafka"), database, stream,
        start_timestamp_micros=start, end_timestamp_micros=end, **overrides,
    )  # fmt: skip
    asyncio.run(produce_until_end(config))
    return config
