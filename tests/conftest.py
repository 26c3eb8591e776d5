"""Session fixtures: one embedded stack per test run, stopped also when tests fail or on SIGTERM."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consumer.config import ConsumerConfig
from spanner_cdc.stack import EmbeddedStack, stop_on_signals
from tests.support.consumer_run import (
    REPLICAS,
    ConfigFactory,
    consumer_config,
    fresh_postgres_database,
    unique_prefix,
)


@pytest.fixture(scope="session")
def stack() -> Iterator[EmbeddedStack]:
    with stop_on_signals():
        started = EmbeddedStack.start()
        try:
            yield started
        finally:
            started.stop()


@pytest.fixture(scope="session")
def churn_spanner() -> Iterator[str]:
    """A second emulator whose partition tokens live 2-4 s: splits and merges within seconds."""
    with stop_on_signals():
        started = EmbeddedStack.start(names=("spanner",), churn_seconds=2)
        try:
            yield started.endpoint("spanner")
        finally:
            started.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] Spark session per test run, with the project's Kafka source registered."""
    from consumer.main import spark_session

    session = spark_session("local[2]", "spanner-cdc-tests")
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


@pytest.fixture(params=REPLICAS)
def configure(request: pytest.FixtureRequest, stack: EmbeddedStack, tmp_path: Path) -> ConfigFactory:
    """A consumer configuration per test and replica: its own topics, output directory and
    replica database."""
    replica = str(request.param)
    dsn = fresh_postgres_database(stack.endpoint("postgres")) if replica == "postgres" else None
    prefix = unique_prefix("T")

    def make(**overrides: Any) -> ConsumerConfig:
        return consumer_config(stack.endpoint("kafka"), prefix, tmp_path / "out", replica, dsn, **overrides)

    return make
