"""Producer and consumer together, under partition churn: the replica equals Spanner — at the
end, and with whole transactions at every batch's consistent cut."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
from pathlib import Path
from typing import Any

import pytest

from spanner_cdc.consumer.readers import changelog_rows, replica_rows
from spanner_cdc.consumer.sinks.replica.sink import ReplicaCommit
from spanner_cdc.demo import bank
from spanner_cdc.producer.main import build_service
from spanner_cdc.producer.service import ProducerService
from spanner_cdc.schemas.timestamps import datetime_from_micros
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import consumer_config, fresh_postgres_database, run_consumer
from testkit.producer_run import running, wait_until
from testkit.spanner_db import create_database
from tests.support.churn import (
    RERUN_ON_EMULATOR_SKIP,
    SourceLog,
    now_micros,
    produce_since,
    producer_config,
    run_churn,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@RERUN_ON_EMULATOR_SKIP
def test_replica_equals_spanner_after_a_churned_run(
    spark: Any, churn_spanner: str, stack: EmbeddedStack, tmp_path: Path
) -> None:
    service, _, writer, database, source_log = asyncio.run(
        run_churn(churn_spanner, stack.endpoint("kafka"), 10, 60)
    )
    config = consumer_config(
        stack.endpoint("kafka"),
        service.config.topic_prefix,
        tmp_path,
        replica="postgres",
        postgres_dsn=fresh_postgres_database(stack.endpoint("postgres")),
        max_events_per_batch=2000,
    )
    run_consumer(spark, config)

    with database.snapshot() as snapshot:
        source = sorted(tuple(row) for row in snapshot.execute_sql("SELECT Id, Balance FROM Accounts"))
    assert len(source) == writer.accounts
    with source_log.diagnosing():
        assert replica_rows(config, "Accounts", '"Id", "Balance"') == source


def watermark_past(service: ProducerService, micros: int) -> bool:
    return (service.scheduler.low_watermark_micros() or 0) > micros


@RERUN_ON_EMULATOR_SKIP
@pytest.mark.parametrize(
    "options",
    [
        {"release_order": "commit"},
        {"release_order": "partition"},
        {"release_order": "commit", "group": "two"},
        {"release_order": "commit", "replica": "delta"},
    ],
    ids=["commit-order", "partition-order", "two-producers", "delta-replica"],
)
def test_bank_transfers_leave_every_replica_batch_a_consistent_cut_of_spanner(
    spark: Any, churn_spanner: str, stack: EmbeddedStack, tmp_path: Path, options: dict[str, str]
) -> None:
    """Transfers (two Accounts updates and a Transfers row per transaction) while partitions
    churn; the consumer runs with small batches. After every committed replica batch the sum
    of balances is the opening total and the replica equals Spanner read at the recorded cut.
    With ``--release-order partition`` changes reach Kafka before the other partitions have read
    past them, and the watermark records must still promise only what is there. With a group,
    two producers share the stream, each writing watermark records of the whole group's. A
    Delta replica is checked the same way, its tables read by Spark after each batch."""
    database = create_database(churn_spanner, bank.DDL)
    options = dict(options)
    replica = options.pop("replica", "postgres")
    # A Delta batch costs seconds whatever its size: half the transfers, in fewer, larger batches
    # (each still splits transactions).
    seconds, batch_events, least_batches = (8, 20, 10) if replica == "postgres" else (4, 100, 3)
    group = options.get("group")
    config = producer_config(
        churn_spanner, stack.endpoint("kafka"), database, bank.STREAM, **options,
        group_shards=4, group_session_timeout=6,
    )  # fmt: skip
    workload = bank.BankWorkload(database)

    async def produce_while_transferring() -> None:
        services = [await build_service(config) for _ in range(1 if group is None else 2)]
        async with contextlib.AsyncExitStack() as producers:
            for service in services:
                await producers.enter_async_context(running(service))
            await asyncio.to_thread(workload.open_accounts)
            # The transfers start once every producer's watermark passed the opening: a group's
            # first watermark records wait for its members' shards, and a batch before the first
            # cut is not checked.
            opened = now_micros()
            for service in services:
                await wait_until(service, functools.partial(watermark_past, service, opened), 120)
            await asyncio.to_thread(workload.run, seconds, 25)
            # A loaded emulator commits slower than asked: top up until the transfers' events
            # (three each) fill the batches the check needs half again.
            while workload.transfers < least_batches * batch_events // 2:
                await asyncio.to_thread(workload.run, 1, 25)
            last = now_micros()
            for service in services:
                await wait_until(service, functools.partial(watermark_past, service, last), 120)
        read = [any(p.starts for p in service.scheduler.partitions.values()) for service in services]
        assert all(read), "a producer of the group read no partition"

    source_log = SourceLog(config, bank.TABLE_COLUMNS)
    with source_log.recording():
        asyncio.run(produce_while_transferring())
    consumer = consumer_config(
        stack.endpoint("kafka"),
        config.topic_prefix,
        tmp_path,
        replica=replica,
        postgres_dsn=fresh_postgres_database(stack.endpoint("postgres")) if replica == "postgres" else None,
        max_events_per_batch=batch_events,
    )
    checked: list[int] = []
    differences: list[str] = []
    balances = bank.BalanceWatch()

    def compare_with_spanner(commit: ReplicaCommit) -> None:
        if commit.cut_micros is None:
            return
        at_cut = datetime_from_micros(commit.cut_micros)
        for table, columns in bank.TABLE_COLUMNS.items():
            with database.snapshot(read_timestamp=at_cut) as snapshot:
                source = sorted(
                    tuple(r) for r in snapshot.execute_sql(f"SELECT {', '.join(columns)} FROM {table}")
                )
            names = ", ".join(f'"{c}"' for c in columns)
            replica = (
                sorted(commit.query(f'SELECT {names} FROM "{table}"')) if commit.has_table(table) else []
            )
            if replica != source:
                differences.append(f"batch {commit.batch_id}: {table} differs from Spanner at the cut")
        balances(commit)
        checked.append(commit.batch_id)

    run_consumer(spark, consumer, compare_with_spanner)

    assert len(checked) >= least_batches, "too few batches to split transactions"
    with database.snapshot() as snapshot:
        source = sorted(tuple(r) for r in snapshot.execute_sql("SELECT Id, Balance FROM Accounts"))
    with source_log.diagnosing():
        assert not differences, differences[:3]
        assert set(balances.sums) == {bank.TOTAL}
        assert replica_rows(consumer, "Accounts", '"Id", "Balance"') == source


def test_a_table_dropped_mid_stream_keeps_what_it_had_and_the_rest_flows(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """Audit is dropped between changes: its changes before the drop reach every sink (the
    producer reads them after the drop, when the catalog no longer has the table), the replica
    keeps its last rows, and Accounts' changes after the drop flow as before."""
    database = create_database(
        stack.endpoint("spanner"),
        [
            "CREATE TABLE Accounts (Id STRING(36) NOT NULL, Balance INT64) PRIMARY KEY (Id)",
            "CREATE TABLE Audit (Id INT64 NOT NULL, Note STRING(MAX)) PRIMARY KEY (Id)",
            "CREATE CHANGE STREAM Everything FOR ALL OPTIONS (value_capture_type='NEW_ROW')",
        ],
    )
    start = now_micros()
    with database.batch() as batch:
        batch.insert("Accounts", columns=["Id", "Balance"], values=[["a", 1]])
        batch.insert("Audit", columns=["Id", "Note"], values=[[1, "opened a"], [2, "kept"]])
    database.update_ddl(["DROP TABLE Audit"]).result(120)
    with database.batch() as batch:
        batch.insert_or_update("Accounts", columns=["Id", "Balance"], values=[["a", 2], ["b", 3]])
    produced = produce_since(stack, database, "Everything", start)
    consumer = consumer_config(stack.endpoint("kafka"), produced.topic_prefix, tmp_path)
    run_consumer(spark, consumer)

    assert replica_rows(consumer, "Audit", '"Id", "Note"') == [(1, "opened a"), (2, "kept")]
    assert replica_rows(consumer, "Accounts", '"Id", "Balance"') == [("a", 2), ("b", 3)]
    assert len(changelog_rows(consumer, "Audit", '"envelope$uuid"')) == 2


def test_columns_spanner_changes_from_string_to_bytes_reach_every_sink(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """``ALTER COLUMN … BYTES(MAX)`` of the key and a value column between changes, in the
    emulator, the consumer run before and after: the producer writes the changes after it with
    the new writer schema, and the replica's STRING columns become BYTES, the older texts as
    their UTF-8 beside bytes that are not UTF-8 — the row written before the change updated by
    its key's bytes, not a second row; the changelog's files of both types read back as bytes."""
    database = create_database(
        stack.endpoint("spanner"),
        [
            "CREATE TABLE Notes (Code STRING(MAX) NOT NULL, Note STRING(MAX)) PRIMARY KEY (Code)",
            "CREATE CHANGE STREAM Everything FOR ALL OPTIONS (value_capture_type='NEW_ROW')",
        ],
    )
    start = now_micros()
    with database.batch() as batch:
        batch.insert("Notes", columns=["Code", "Note"], values=[["a", "é"], ["b", "kept"]])
    produced = produce_since(stack, database, "Everything", start)
    consumer = consumer_config(stack.endpoint("kafka"), produced.topic_prefix, tmp_path)
    run_consumer(spark, consumer)
    assert replica_rows(consumer, "Notes", '"Code", "Note"') == [("a", "é"), ("b", "kept")]
    database.update_ddl(
        [
            "ALTER TABLE Notes ALTER COLUMN Code BYTES(MAX) NOT NULL",
            "ALTER TABLE Notes ALTER COLUMN Note BYTES(MAX)",
        ]
    ).result(120)
    with database.batch() as batch:
        written = [(b"a", b"\xff\x00"), (b"c", b"new")]  # the client takes BYTES in base64
        batch.insert_or_update(
            "Notes", columns=["Code", "Note"], values=[[base64.b64encode(v) for v in row] for row in written]
        )
    produce_since(stack, database, "Everything", start, topic_prefix=produced.topic_prefix)
    run_consumer(spark, consumer)

    expected = [(b"a", b"\xff\x00"), (b"b", b"kept"), (b"c", b"new")]
    assert replica_rows(consumer, "Notes", '"Code", "Note"') == expected
    assert changelog_rows(consumer, "Notes", '"Code", "Note"') == [
        (b"a", "é".encode()),
        (b"b", b"kept"),
        *expected[::2],
    ]
