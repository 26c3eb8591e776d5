"""Producer and consumer together: after a churned run the replica equals the Spanner table."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from consumer.readers import replica_rows
from spanner_cdc.stack import EmbeddedStack
from tests.support.churn import run_churn
from tests.support.consumer_run import consumer_config, fresh_postgres_database, run_consumer

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_replica_equals_spanner_after_a_churned_run(
    spark: Any, churn_spanner: str, stack: EmbeddedStack, tmp_path: Path
) -> None:
    service, _, writer, database = asyncio.run(run_churn(churn_spanner, stack.endpoint("kafka"), 10, 60))
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
    assert replica_rows(config, "Accounts", '"Id", "Balance"') == source
