"""Running the consumer on the test Spark session and reading back what its sinks hold."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from consumer.config import ConsumerConfig
from consumer.main import ConsumerJob, drain

REPLICAS = ("duckdb", "postgres")


def unique_prefix(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def fresh_postgres_database(dsn: str) -> str:
    """An empty database on the test server, so each test has its own replica tables."""
    name = f"replica_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return make_conninfo(dsn, dbname=name)


def consumer_config(
    kafka: str,
    prefix: str,
    output: Path,
    replica: str = "duckdb",
    postgres_dsn: str | None = None,
    **overrides: Any,
) -> ConsumerConfig:
    options: dict[str, Any] = {
        "kafka_bootstrap": kafka,
        "topic_prefix": prefix,
        "output_dir": output,
        "checkpoint_dir": output / "checkpoint",
        "available_now": True,
        "replica": replica,
        "postgres_dsn": postgres_dsn,
        "source": "spanner_cdc_kafka",
    }
    return ConsumerConfig(**{**options, **overrides})


def run_consumer(spark: Any, config: ConsumerConfig) -> None:
    """Process everything in Kafka now (Trigger.AvailableNow), then release the sinks."""
    job = ConsumerJob.open(config)
    try:
        drain(job, spark, threading.Event())
    finally:
        job.close()
