"""Reading the sinks back: the demo's verification report and the tests use these."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import psycopg

from spanner_cdc.consumer.config import ConsumerConfig
from spanner_cdc.consumer.locations import ConsumerLocations, Location
from spanner_cdc.consumer.sinks.changelog import ChangelogSink
from spanner_cdc.consumer.sinks.lakehouse.merge import LAKEHOUSE_DIR, lakehouse_table
from spanner_cdc.consumer.sinks.replica.names import ReplicaNames, quote


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
    """``columns`` (SQL, names in double quotes) of Spanner table ``table``, by the replica's
    name for it (names.py); of a Delta replica, read by this process's Spark session."""
    if config.replica == "delta":
        return lakehouse_rows(delta_table(config, table), columns)
    name = quote(ReplicaNames.for_dialect(config.replica).table(table))
    with replica_connection(config) as connection:
        return [
            tuple(row) for row in connection.execute(f"SELECT {columns} FROM {name} ORDER BY 1").fetchall()
        ]


def delta_table(config: ConsumerConfig, table: str) -> Location:
    """Where a Delta replica keeps the rows of Spanner table ``table``."""
    return lakehouse_table(ConsumerLocations.of(config).output / LAKEHOUSE_DIR, table, ()).rows


def lakehouse_rows(rows: Location, columns: str) -> list[tuple[Any, ...]]:
    """``columns`` of the Delta table at ``rows``, ordered by the first."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate().newSession()
    spark.conf.set("spark.sql.ansi.doubleQuotedIdentifiers", "true")
    spark.read.format("delta").load(rows.uri).createOrReplaceTempView("t")
    return [tuple(row) for row in spark.sql(f"SELECT {columns} FROM t ORDER BY 1").collect()]


def changelog_rows(config: ConsumerConfig, table: str, columns: str) -> list[tuple[Any, ...]]:
    changelog = ChangelogSink(ConsumerLocations.of(config).changelog)
    with on_disk(changelog.table_dir(table), "*/*.parquet") as directory:
        pattern = directory / "*" / "*.parquet"
        query = (
            f"SELECT {columns} FROM read_parquet('{pattern}', hive_partitioning = true, "
            'union_by_name = true) ORDER BY "envelope$sort_keys"'
        )
        return _query_files(query)


def quarantine_rows(config: ConsumerConfig) -> list[tuple[Any, ...]]:
    with on_disk(ConsumerLocations.of(config).quarantine, "*.parquet") as directory:
        return _query_files(f"SELECT topic, reason, value FROM read_parquet('{directory / '*.parquet'}')")


@contextmanager
def on_disk(directory: Location, pattern: str) -> Iterator[Path]:
    """``directory`` as a local one DuckDB can read: itself, or a temporary copy of its files
    that match ``pattern`` (DuckDB reads object stores only through an extension it would
    download at run time)."""
    if directory.is_local:
        yield Path(directory.path)
        return
    with tempfile.TemporaryDirectory(prefix="spanner-cdc-read-") as copy:
        for file in directory.files(pattern):
            target = Path(copy) / file.relative_to(directory)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(file.read_bytes())
        yield Path(copy)


def _query_files(query: str) -> list[tuple[Any, ...]]:
    """A query over Parquet files, on an in-memory DuckDB closed right after."""
    with duckdb.connect() as files:
        return [tuple(row) for row in files.execute(query).fetchall()]
