"""The broker killed with SIGKILL mid-run and started again on its log directories, while the
producer and the consumer run: both ride it out, nothing is lost, nothing applied twice.

The broker is one of this test's own (the run's shared one serves other tests), a KRaft node on
disk as the embedded stack runs it (tests.support.broker), started again on the same ports and
data. ``make chaos`` kills it too, under load (tests/chaos).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from spanner_cdc.consumer.readers import changelog_rows, replica_rows
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from testkit.consumer_run import consume_command, consumer_config, fresh_postgres_database
from testkit.scrape import scrape
from testkit.spanner_db import create_database
from tests.support.broker import OwnBroker
from tests.support.churn import ACCOUNTS_DDL, produce_command
from tests.support.produce_process import upsert_account
from tests.support.stopping import stop_with_sigterm
from tests.support.waiting import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DOWN_SECONDS = 6.0


def test_a_broker_killed_and_started_again_loses_nothing_and_applies_nothing_twice(
    stack: EmbeddedStack, tmp_path: Path
) -> None:
    broker = OwnBroker(tmp_path / "kafka")
    producer = consumer = None
    try:
        bank = create_database(stack.endpoint("spanner"), ACCOUNTS_DDL)
        prefix = f"restart-{uuid.uuid4().hex[:6]}"
        port = free_port()
        producer = subprocess.Popen(
            produce_command(stack.endpoint("spanner"), broker.bootstrap, bank, "Bank", prefix,
                            "--metrics-port", str(port)),
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        scrape(port, "queries_started_total")
        config = consumer_config(
            broker.bootstrap,
            prefix,
            tmp_path / "out",
            "postgres",
            fresh_postgres_database(stack.endpoint("postgres")),
            available_now=False,
        )
        consumer = subprocess.Popen(
            consume_command(config, "--replica", "postgres", "--postgres-dsn", str(config.postgres_dsn)),
            stderr=subprocess.PIPE,
            text=True,
        )
        keys = [f"k{n:02d}" for n in range(30)]

        def replicated() -> set[str]:
            try:
                return {str(row[0]) for row in replica_rows(config, "Accounts", '"Id"')}
            except Exception:  # the replica table is created with the first batch
                return set()

        for key in keys[:10]:
            upsert_account(bank, key)
        assert eventually(lambda: set(keys[:10]) <= replicated(), 120), "nothing reached the replica"
        broker.kill()
        for key in keys[10:20]:
            upsert_account(bank, key)
        time.sleep(DOWN_SECONDS)
        broker.start_again()
        for key in keys[20:]:
            upsert_account(bank, key)
        assert eventually(lambda: set(keys) <= replicated(), 180), f"missing: {set(keys) - replicated()}"
    finally:
        stderrs = [stop_with_sigterm(process, 90) for process in (producer, consumer) if process is not None]
        broker.stop()
    for process, stderr in zip((producer, consumer), stderrs, strict=True):
        assert process is not None
        assert process.returncode == 0, stderr
        assert "Traceback" not in stderr, stderr
    with bank.snapshot() as snapshot:
        in_spanner = sorted(tuple(row) for row in snapshot.execute_sql("SELECT Id, Balance FROM Accounts"))
    assert replica_rows(config, "Accounts", '"Id", "Balance"') == in_spanner
    uuids = Counter(str(row[0]) for row in changelog_rows(config, "Accounts", '"envelope$uuid"'))
    assert len(uuids) == len(keys) and set(uuids.values()) == {1}, uuids.most_common(3)
