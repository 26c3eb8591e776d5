"""Whole transactions and the consistent cut (consumer.sinks.replica.cut), on real Spark and replicas.

Transactions are built as the producer would publish them (tests/support/synthetic.py), so a
test can stop one halfway: some records on Kafka, the rest and the watermark that covers them
only later, with micro-batches of a few messages in between.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from spanner_cdc.consumer.readers import changelog_rows, replica_rows
from spanner_cdc.consumer.sinks.replica.cut import PENDING
from spanner_cdc.consumer.sinks.replica.sink import ReplicaCommit
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import (
    ConfigFactory,
    consume_command,
    consumer_config,
    fresh_postgres_database,
    run_consumer,
    unique_prefix,
)
from testkit.synthetic import ChangeFactory, publish

pytestmark = [pytest.mark.integration, pytest.mark.spark]
TRANSFER_COLUMNS = (("Id", "INT64", True), ("Amount", "INT64", False))
OPENING_BALANCE = 100
BALANCES = '"Id", "Balance"'


def opening(accounts: ChangeFactory) -> list[dict[str, Any]]:
    return [
        accounts.record("INSERT", {"Id": name}, {"Balance": str(OPENING_BALANCE), "Note": ""})
        for name in ("a", "b", "c")
    ]


def transfer(accounts: ChangeFactory, transfers: ChangeFactory) -> list[dict[str, Any]]:
    """30 from a to b, recorded in Transfers: three records over two tables, one transaction."""
    return accounts.transaction(
        accounts.record("UPDATE", {"Id": "a"}, {"Balance": "70", "Note": "sent"}),
        accounts.record("UPDATE", {"Id": "b"}, {"Balance": "130", "Note": "got"}),
        transfers.record("INSERT", {"Id": "1"}, {"Amount": "30"}),
    )


class CommitLog:
    """The observer: after every committed replica batch, its cut, held events and balances."""

    def __init__(self) -> None:
        self.seen: list[tuple[int | None, int, list[tuple[Any, ...]]]] = []

    def __call__(self, commit: ReplicaCommit) -> None:
        balances = sorted(commit.query(f'SELECT {BALANCES} FROM "Accounts"')) if commit.cut_micros else []
        self.seen.append((commit.cut_micros, commit.held, balances))

    def sums(self) -> set[int]:
        return {sum(balance for _, balance in rows) for _, _, rows in self.seen if rows}


def test_a_transaction_over_two_tables_lands_whole_when_the_watermark_passes_it(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    config = configure(max_events_per_batch=1)  # every batch is one message: transactions split
    accounts, transfers = ChangeFactory(), ChangeFactory("Transfers", TRANSFER_COLUMNS)
    kafka, prefix = config.kafka_bootstrap, config.topic_prefix
    publish(kafka, prefix, accounts.events(*opening(accounts)))
    records = transfer(accounts, transfers)
    commit = int(records[0]["commit_timestamp"])
    observed = CommitLog()

    publish(kafka, prefix, accounts.events(*records[:2]), watermark=commit - 1)
    run_consumer(spark, config, observed)
    assert observed.seen[-1][:2] == (commit - 1, 2), "the two Accounts records wait, nothing else"
    assert replica_rows(config, "Accounts", BALANCES) == [("a", 100), ("b", 100), ("c", 100)]

    publish(kafka, prefix, transfers.events(records[2]), watermark=commit)
    run_consumer(spark, config, observed)
    assert observed.seen[-1][:2] == (commit, 0)
    assert replica_rows(config, "Accounts", BALANCES) == [("a", 70), ("b", 130), ("c", 100)]
    assert replica_rows(config, "Transfers", '"Id", "Amount"') == [(1, 30)]
    assert observed.sums() == {300}, "a committed batch showed the transfer half-applied"
    # Spark's source takes at least one offset of each partition with new records a batch.
    assert len(observed.seen) >= 10, "the batches were not small enough to split the transaction"
    assert len(changelog_rows(config, "Accounts", '"envelope$uuid"')) == 5


def test_an_incomplete_transaction_is_applied_once_the_cut_passes_and_counted(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    config = consumer_config(stack.endpoint("kafka"), unique_prefix("I"), tmp_path)
    accounts, transfers = ChangeFactory(), ChangeFactory("Transfers", TRANSFER_COLUMNS)
    opened = opening(accounts)
    records = transfer(accounts, transfers)
    # The Transfers record never comes (as if the producer's --exclude-tables left it out).
    publish(config.kafka_bootstrap, config.topic_prefix, accounts.events(*opened, *records[:2]))
    metrics = run_consumer(spark, config)

    assert replica_rows(config, "Accounts", BALANCES) == [("a", 70), ("b", 130), ("c", 100)]
    assert metrics.registry.get_sample_value("spanner_cdc_consumer_incomplete_transactions_total") == 1
    assert metrics.registry.get_sample_value("spanner_cdc_consumer_held_events") == 0


def test_without_whole_transactions_each_batch_is_applied_as_it_comes(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    config = consumer_config(stack.endpoint("kafka"), unique_prefix("O"), tmp_path, whole_transactions=False)
    accounts, transfers = ChangeFactory(), ChangeFactory("Transfers", TRANSFER_COLUMNS)
    opened = opening(accounts)
    records = transfer(accounts, transfers)
    events = accounts.events(*opened, *records[:2])
    publish(config.kafka_bootstrap, config.topic_prefix, events, watermark=False)
    run_consumer(spark, config)

    assert replica_rows(config, "Accounts", BALANCES) == [("a", 70), ("b", 130), ("c", 100)]


def test_a_consumer_killed_with_a_transaction_half_held_applies_it_once_whole_after_restart(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    dsn = fresh_postgres_database(stack.endpoint("postgres"))
    config = consumer_config(
        stack.endpoint("kafka"), unique_prefix("H"), tmp_path, replica="postgres", postgres_dsn=dsn
    )
    accounts, transfers = ChangeFactory(), ChangeFactory("Transfers", TRANSFER_COLUMNS)
    publish(config.kafka_bootstrap, config.topic_prefix, accounts.events(*opening(accounts)))
    records = transfer(accounts, transfers)
    commit = int(records[0]["commit_timestamp"])
    publish(config.kafka_bootstrap, config.topic_prefix, accounts.events(*records[:2]), watermark=commit - 1)

    process = subprocess.Popen(
        consume_command(config, "--replica", "postgres", "--postgres-dsn", dsn),
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_held_events(dsn, 2, timeout=180)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    assert replica_rows(config, "Accounts", BALANCES) == [("a", 100), ("b", 100), ("c", 100)]

    publish(config.kafka_bootstrap, config.topic_prefix, transfers.events(records[2]), watermark=commit)
    run_consumer(spark, config)

    assert replica_rows(config, "Accounts", BALANCES) == [("a", 70), ("b", 130), ("c", 100)]
    assert replica_rows(config, "Transfers", '"Id", "Amount"') == [(1, 30)]
    assert replica_rows(config, PENDING, "count(*)") == [(0,)]
    uuids = [row[0] for row in changelog_rows(config, "Accounts", '"envelope$uuid"')]
    assert len(uuids) == len(set(uuids)) == 5


def wait_for_held_events(dsn: str, count: int, timeout: float) -> None:
    """Poll the replica until ``count`` events are held (the consumer buffered the half)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with psycopg.connect(dsn) as connection:
            exists = connection.execute("SELECT to_regclass(%s)", [f'"{PENDING}"']).fetchone()
            if exists and exists[0] is not None:
                held = connection.execute(f'SELECT count(*) FROM "{PENDING}"').fetchone()
                if held and held[0] == count:
                    return
        time.sleep(0.5)
    raise AssertionError(f"the consumer did not hold {count} events within {timeout:.0f} s")
