"""Session fixtures: one embedded stack per test run, stopped also when tests fail or on SIGTERM."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from spanner_cdc.stack import EmbeddedStack, stop_on_signals


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
    from pyspark.sql import SparkSession

    from consumer.kafka_source import KafkaSource

    # Python workers must run this virtualenv's interpreter (pyarrow, confluent-kafka, the project).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("spanner-cdc-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.dataSource.register(KafkaSource)
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()
