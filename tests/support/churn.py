"""A producer run under partition churn, shared by the producer and end-to-end consumer tests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.producer.lineage.partitions import ROOT, PartitionScheduler
from spanner_cdc.producer.main import build_service
from spanner_cdc.producer.service import ProducerService
from spanner_cdc.producer.spanner.change_stream import log_returned
from spanner_cdc.schemas.identity import change_uuid
from spanner_cdc.schemas.timestamps import timestamp_micros
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.services import EMULATOR_PROJECT
from testkit.producer_run import running, wait_until
from testkit.spanner_db import INSTANCE, create_database
from tests.support.hang_report import HANG_REPORT
from tests.support.kafka_read import Received, read_events
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
        sys.executable, *HANG_REPORT, "spanner_cdc.cli", "produce",
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


def merges(scheduler: PartitionScheduler) -> list[str]:
    """Tokens of partitions with more than one parent."""
    return [p.token for p in scheduler.partitions.values() if len(p.parents) > 1]


class EmulatorSkipError(AssertionError):
    """A test failed on the emulator's skipped change (docs/facts.md), not on the pipeline.

    Tests that can hit it are marked to re-run once on exactly this error.
    """


#: The marker for them: one re-run, only when the failure was diagnosed as the emulator's skip.
RERUN_ON_EMULATOR_SKIP = pytest.mark.flaky(reruns=2, only_rerun=[EmulatorSkipError.__name__])


#: The producer's debug line for each data change record Spanner returned (`log_returned`).
RETURNED_LINE = re.compile(r"returned tx=(?P<tx>\S+) seq=(?P<seq>\S+) mods=(?P<mods>\d+) ")


class SourceLog:
    """The uuid of every change the emulator's live queries returned to the producer, read from
    its debug lines (`producer.spanner.change_stream.log_returned`), to tell whose fault a failed test was.

    The emulator's live partition queries can skip a committed change (docs/facts.md): no live
    query returned it, while a historical query of the same stream does. `diagnosing` names the
    cause of a failure: a change a query returned and Kafka lacks is the producer's (a plain
    failure); a change no live query returned but a historical read does is the emulator's
    (`EmulatorSkipError`, which re-runs the test); neither leaves the failure as it was.
    In-process producers are heard through `recording`; a subprocess run with
    ``--log-level debug`` through `add` of its log.
    """

    def __init__(self, config: ProducerConfig, tables: Iterable[str] = ("Accounts",)) -> None:
        self.config = config
        self.tables = tuple(tables)
        self.returned: set[str] = set()

    def add(self, log_text: str) -> None:
        """Take in producer log text; lines other than `log_returned`'s are ignored."""
        for line in RETURNED_LINE.finditer(log_text):
            self.returned.update(
                change_uuid(self.config.stream_name, line["tx"], line["seq"], mod_index)
                for mod_index in range(int(line["mods"]))
            )

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Hear the debug lines of the producers this process runs meanwhile (and keep them out
        of the test's captured log, which they would flood)."""
        logger = logging.getLogger(log_returned.__module__)
        level = logger.level

        def take(record: logging.LogRecord) -> bool:
            if record.levelno != logging.DEBUG:
                return True
            self.add(record.getMessage())
            return False

        logger.addFilter(take)
        logger.setLevel(logging.DEBUG)
        try:
            yield
        finally:
            logger.removeFilter(take)
            logger.setLevel(level)

    def check_heard(self, events: Iterable[Received]) -> None:
        """The debug log named every published change: what `diagnosing` relies on."""
        unheard = {event.value["uuid"] for event in events} - self.returned
        assert not unheard, f"{len(unheard)} published changes the producer's debug log never named"

    @contextlib.contextmanager
    def diagnosing(self) -> Iterator[None]:
        """Run assertions; if one fails, blame the producer or the emulator when the evidence says so."""
        try:
            yield
        except AssertionError as failure:
            unpublished = self.returned - self.uuids_on_kafka(self.config)
            assert not unpublished, (
                f"Spanner returned {len(unpublished)} changes the producer did not publish "
                f"(e.g. uuid {min(unpublished)}); the failure: {failure}"
            )
            skipped = self.uuids_on_kafka(self.read_again()) - self.returned
            if skipped:
                raise EmulatorSkipError(
                    f"no live query returned {len(skipped)} committed changes that a historical read "
                    f"returns (e.g. uuid {min(skipped)}): the emulator's skip; the failure: {failure}"
                ) from failure
            raise

    def uuids_on_kafka(self, config: ProducerConfig) -> set[str]:
        return {
            event.value["uuid"]
            for table in self.tables
            for event in read_events(config.kafka_bootstrap, config.topic_prefix, table)
        }

    def read_again(self) -> ProducerConfig:
        """The stream from the run's start until now, read historically into a new prefix."""
        return produce_to_now(
            dataclasses.replace(self.config, topic_prefix=f"{self.config.topic_prefix}-again")
        )


def bank_source_log(spanner: str, kafka: str, database: Any, prefix: str, start: int) -> SourceLog:
    """The SourceLog for ``produce_command`` runs of the Bank stream from ``start`` into ``prefix``
    (give it their logs, written with ``--log-level debug``)."""
    return SourceLog(
        producer_config(spanner, kafka, database, "Bank", start_timestamp_micros=start, topic_prefix=prefix)
    )


Change = tuple[str, int, int]


def change_of(event: Received) -> Change:
    """An Accounts event as the change it carries: (Id, Balance, commit µs)."""
    payload = event.value["payload"]
    commit = timestamp_micros(event.value["source_metadata"]["commit_timestamp"])
    return payload["Id"], payload["Balance"], commit


async def run_churn(
    spanner: str, kafka: str, min_seconds: float, max_seconds: float, **overrides: Any
) -> tuple[ProducerService, list[Received], AccountWriter, Any, SourceLog]:
    """Writes while partitions churn until a merge and lineage depth 4 were seen; the producer's
    service, the events on Kafka, the writer, the database and what the emulator returned.
    ``overrides`` are producer options."""
    database = create_database(spanner, ACCOUNTS_DDL)
    config = producer_config(spanner, kafka, database, "Bank", **overrides)
    service = await build_service(config)
    source_log = SourceLog(config)
    writer = AccountWriter(database)
    with source_log.recording():
        await churn_while_writing(service, writer, min_seconds, max_seconds)
    events = read_events(kafka, config.topic_prefix, "Accounts")
    return service, events, writer, database, source_log


async def churn_while_writing(
    service: ProducerService, writer: AccountWriter, min_seconds: float, max_seconds: float
) -> None:
    async with running(service):
        writing = asyncio.create_task(asyncio.to_thread(writer.run, max_seconds))
        started = time.monotonic()
        while not writing.done():
            await asyncio.sleep(0.5)
            churned = merges(service.scheduler) and lineage_depth(service.scheduler) >= 4
            if time.monotonic() - started >= min_seconds and churned:
                writer.stop()
        await writing
        last_commit = max(c.commit_micros for c in writer.committed)
        await wait_until(service, lambda: (service.scheduler.low_watermark_micros() or 0) > last_commit, 120)


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
