"""Running the consumer on the test Spark session and reading back what its sinks hold."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
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


@contextmanager
def replica_connection(config: ConsumerConfig) -> Iterator[Any]:
    if config.replica == "postgres":
        assert config.postgres_dsn
        with psycopg.connect(config.postgres_dsn) as connection:
            yield connection
    else:
        embedded = duckdb.connect(str(config.duckdb_path), read_only=True)
        try:
            yield embedded
        finally:
            embedded.close()


def replica_rows(config: ConsumerConfig, table: str, columns: str) -> list[tuple[Any, ...]]:
    with replica_connection(config) as connection:
        return [
            tuple(row) for row in connection.execute(f'SELECT {columns} FROM "{table}" ORDER BY 1').fetchall()
        ]


def changelog_rows(config: ConsumerConfig, columns: str, table: str = "Accounts") -> list[tuple[Any, ...]]:
    pattern = config.changelog_dir / f"object={table}" / "*" / "*.parquet"
    query = (
        f"SELECT {columns} FROM read_parquet('{pattern}', hive_partitioning = true, union_by_name = true) "
        'ORDER BY "envelope$sort_keys"'
    )
    return [tuple(row) for row in duckdb.connect().execute(query).fetchall()]


def quarantine_rows(config: ConsumerConfig) -> list[tuple[Any, ...]]:
    pattern = config.quarantine_dir / "*.parquet"
    query = f"SELECT topic, reason, value FROM read_parquet('{pattern}')"
    return [tuple(row) for row in duckdb.connect().execute(query).fetchall()]


def checkpoint_query_id(config: ConsumerConfig) -> str:
    return str(json.loads((config.checkpoint_dir / "spark" / "metadata").read_text())["id"])
