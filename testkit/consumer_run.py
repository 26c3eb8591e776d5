"""Running the consumer on the test Spark session and reading back what its sinks hold."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from spanner_cdc.consumer.config import ConsumerConfig
from spanner_cdc.consumer.locations import ConsumerLocations, Location
from spanner_cdc.consumer.main import ConsumerJob, drain
from spanner_cdc.consumer.metrics import ConsumerMetrics
from spanner_cdc.consumer.readers import changelog_rows, replica_rows
from spanner_cdc.consumer.sinks.replica.sink import ReplicaCommit
from spanner_cdc.consumer.spark.graceful_stop import StopRequest
from spanner_cdc.consumer.spark.session import session_hadoop_settings
from spanner_cdc.schemas.events import Event
from testkit.synthetic import account_row, last_images

SQL_REPLICAS = ("duckdb", "postgres")
#: What ``spanner-cdc consume`` runs with as a process of a test: its Python workers are this one.
CONSUMER_ENVIRONMENT = {**os.environ, "PYSPARK_PYTHON": sys.executable}
#: The ``configure`` fixture: keyword overrides → a consumer configuration for this test.
ConfigFactory = Callable[..., ConsumerConfig]


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
    output: Path | str,
    replica: str = "duckdb",
    postgres_dsn: str | None = None,
    **overrides: Any,
) -> ConsumerConfig:
    options: dict[str, Any] = {
        "kafka_bootstrap": kafka,
        "topic_prefix": prefix,
        "output_dir": str(output),
        "available_now": True,
        "replica": replica,
        "postgres_dsn": postgres_dsn,
    }
    return ConsumerConfig(**{**options, **overrides})


def run_consumer(
    spark: Any, config: ConsumerConfig, on_replica_commit: Callable[[ReplicaCommit], None] | None = None
) -> ConsumerMetrics:
    """Process everything in Kafka now (Trigger.AvailableNow), then release the sinks; the
    run's metrics."""
    job = ConsumerJob.open(config, on_replica_commit, hadoop=session_hadoop_settings(spark))
    try:
        drain(job, spark, StopRequest())
    finally:
        job.close()
    return job.processor.metrics


def on_disk(config: ConsumerConfig) -> DiskLocations:
    """Where a test's consumer keeps its files, as paths (a test's locations are on the disk
    unless it is about an object store)."""
    return DiskLocations(ConsumerLocations.of(config))


@dataclass(frozen=True)
class DiskLocations:
    locations: ConsumerLocations

    def __getattr__(self, name: str) -> Path:
        location = getattr(self.locations, name)
        assert isinstance(location, Location) and location.is_local, name
        return Path(location.path)


def committed_batches(config: ConsumerConfig) -> int:
    """How many micro-batches Spark has committed in ``config``'s checkpoint."""
    return len((ConsumerLocations.of(config).spark_checkpoint / "commits").files("[0-9]*"))


def consume_command(config: ConsumerConfig, *extra: str, max_events_per_batch: int = 150) -> list[str]:
    """``spanner-cdc consume`` for ``config``'s topics and output, as a separate process
    (small batches by default, short trigger), for tests that kill it."""
    return [
        sys.executable,
        "-m",
        "spanner_cdc.cli",
        "consume",
        "--kafka-bootstrap",
        config.kafka_bootstrap,
        "--topic-prefix",
        config.topic_prefix,
        "--output-dir",
        str(config.output_dir),
        "--replica",
        config.replica,
        *(["--postgres-dsn", config.postgres_dsn] if config.postgres_dsn else []),
        *(["--checkpoint-dir", config.checkpoint_dir] if config.checkpoint_dir else []),
        *(["--local-dir", str(config.local_dir)] if config.local_dir else []),
        *[
            argument
            for key, value in config.spark_conf.items()
            for argument in ("--spark-conf", f"{key}={value}")
        ],
        "--max-events-per-batch",
        str(max_events_per_batch),
        "--trigger-seconds",
        "0.2",
        "--no-spark-ui",
        *extra,
    ]


def consumed_to_the_end(config: ConsumerConfig) -> None:
    """``spanner-cdc consume --available-now`` for ``config``, to Kafka's end, in its own process
    (and its own Spark): a test that runs it needs no Spark session of its own."""
    done = subprocess.run(
        consume_command(config, "--available-now", "true", max_events_per_batch=5000),
        env=CONSUMER_ENVIRONMENT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def account_sinks(config: ConsumerConfig) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """What ``config``'s sinks hold of the synthetic ``Accounts`` table: the replica's rows, and
    the changelog's uuid, key and change type, sorted (its files' order is not its content)."""
    return (
        replica_rows(config, "Accounts", '"Id", "Balance", "Note", "cdc$commit_micros"'),
        sorted(changelog_rows(config, "Accounts", '"envelope$uuid", "Id", "change$type"')),
    )


def expected_account_sinks(events: Sequence[Event]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """What :func:`account_sinks` reads once a consumer took ``events`` (a ``random_history``, in
    commit order) each once: every key's last image and its commit time, deleted keys left out;
    every change's uuid, key and change type."""
    replica = [(*account_row(e), e.commit_timestamp) for e in last_images(events)]
    changelog = [(e.uuid, e.key["Id"], e.change_type) for e in events]
    return replica, sorted(changelog)
