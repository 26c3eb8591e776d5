"""The Delta Lake replica (``--replica delta``) against real Spark and real Delta tables: the
same rows as the SQL replicas for the same topics, read by a reader outside the consumer."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import account_sinks, consumer_config, run_consumer, unique_prefix
from testkit.synthetic import ChangeFactory, publish, random_history
from tests.support.command_line import spanner_cdc

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_a_delta_replica_holds_what_a_duckdb_replica_holds(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """Inserts, updates, deletes and re-inserts in random order, with duplicates, in small
    batches: the Delta tables end equal to the DuckDB replica of the same topics, also read at
    the versions ``replica status`` names; streams are refused in one line; every commit carries
    its batch and cut; the change data feed has the changes."""
    prefix = unique_prefix("D")
    kafka = stack.endpoint("kafka")
    events = random_history(ChangeFactory(), 600)
    publish(kafka, prefix, events + random.Random(7).sample(events, 60))

    delta = consumer_config(kafka, prefix, tmp_path / "delta", replica="delta", max_events_per_batch=200)
    run_consumer(spark, delta)
    duckdb = consumer_config(kafka, prefix, tmp_path / "duckdb")
    run_consumer(spark, duckdb)

    assert account_sinks(delta) == account_sinks(duckdb)
    where = ("--replica", "delta", "--output-dir", str(tmp_path / "delta"))
    status = spanner_cdc("replica", "status", "--format", "json", *where)
    assert status.returncode == 0, status.stderr
    accounts = next(r for r in map(json.loads, status.stdout.splitlines()) if r["table"] == "Accounts")
    at_cut = spark.read.format("delta").load(accounts["replica_table"])  # <location>@v<version>
    assert sorted(tuple(r) for r in at_cut.select("Id", "Balance").collect()) == sorted(
        (row[0], row[1]) for row in account_sinks(duckdb)[0]
    )
    refused = spanner_cdc("stream", "show", *where)
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    table = (tmp_path / "delta" / "lakehouse" / "Accounts").as_posix()
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    merges = [json.loads(row["userMetadata"]) for row in history if row["operation"] == "MERGE"]
    assert merges and all({"batch", "slice", "cut_micros"} <= m.keys() for m in merges)
    changes = (
        spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(table)
    )
    assert changes.filter("_change_type = 'delete'").count() > 0


def test_a_batch_replayed_after_its_tables_committed_commits_nothing_twice(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """The window a crash leaves: the batch's Delta tables committed, its ledger and Spark's
    commit not. The checkpoint is put back as it was before the batch (Spark plans it again, the
    ledger and the dedupe memory are as before it); the replay commits nothing twice — one MERGE
    per table, batch and slice — and the replica still equals DuckDB's."""
    prefix = unique_prefix("R")
    kafka = stack.endpoint("kafka")
    events = random_history(ChangeFactory(), 500)
    publish(kafka, prefix, events[:250])
    delta = consumer_config(kafka, prefix, tmp_path / "delta", replica="delta", max_events_per_batch=150)
    run_consumer(spark, delta)
    checkpoint = tmp_path / "delta" / "checkpoint"
    before = tmp_path / "checkpoint-before"
    shutil.copytree(checkpoint, before)

    publish(kafka, prefix, events[250:])
    run_consumer(spark, delta)
    shutil.rmtree(checkpoint)
    shutil.copytree(before, checkpoint)
    run_consumer(spark, delta)

    duckdb = consumer_config(kafka, prefix, tmp_path / "duckdb")
    run_consumer(spark, duckdb)
    assert account_sinks(delta)[0] == account_sinks(duckdb)[0]
    lakehouse = tmp_path / "delta" / "lakehouse"
    for path in (lakehouse / "Accounts", lakehouse / "_tombstones" / "Accounts"):
        slices = merged_slices(spark, path)
        assert len(slices) == len(set(slices)), sorted(slices)
    assert len({batch for batch, _ in merged_slices(spark, lakehouse / "Accounts")}) >= 2


def merged_slices(spark: Any, table: Path) -> list[tuple[int, int]]:
    """(batch, slice) of each MERGE in a Delta table's history, by its commit's metadata."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table.as_posix()}`").collect()
    metadata = [json.loads(row["userMetadata"]) for row in history if row["operation"] == "MERGE"]
    return [(m["batch"], m["slice"]) for m in metadata]
