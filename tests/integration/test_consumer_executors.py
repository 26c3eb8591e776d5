"""The consumer's per-event work runs in Spark's executor tasks, not on the driver."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import duckdb
import pytest

from spanner_cdc.consumer.readers import changelog_rows
from spanner_cdc.consumer.sinks.changelog import ChangelogSink
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import consumer_config, run_consumer, unique_prefix
from testkit.synthetic import ChangeFactory, publish, random_history

pytestmark = [pytest.mark.integration, pytest.mark.spark]

#: Over the event topic's 3 partitions, about 3,000 offsets each: more than the source reads
#: in one task together (kafka_source.SMALL_RANGE_OFFSETS), so the batch has a task per partition.
CHANGES = 9_000


def test_decoding_and_the_changelog_run_in_one_task_per_share_of_the_batch(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    config = consumer_config(
        stack.endpoint("kafka"), unique_prefix("X"), tmp_path / "out", sinks=["changelog"]
    )
    events = random_history(ChangeFactory(), CHANGES, keys=600)
    publish(config.kafka_bootstrap, config.topic_prefix, events + events[:500])  # and duplicates

    metrics = run_consumer(spark, config)

    files = sorted((ChangelogSink(config.changelog_dir).table_dir("Accounts")).glob("*/*.parquet"))
    parts = {re.fullmatch(r"batch-(\d+)-part-(\d+)\.parquet", f.name) for f in files}
    assert None not in parts, [f.name for f in files]
    batch_parts = {(m.group(1), m.group(2)) for m in parts if m}
    assert len({part for _, part in batch_parts}) >= 3, f"written by the tasks {sorted(batch_parts)}"
    uuids = [row[0] for row in changelog_rows(config, "Accounts", '"envelope$uuid"')]
    assert uuids == [e.value["uuid"] for e in events]
    assert metrics.registry.get_sample_value("spanner_cdc_consumer_duplicates_total") == 500
    with duckdb.connect() as files_db:
        for file in files:  # each task's file in sort_keys order
            rows = files_db.execute(f"SELECT \"envelope$sort_keys\" FROM read_parquet('{file}')").fetchall()
            keys = [tuple(sort_keys.values()) for (sort_keys,) in rows]
            assert keys == sorted(keys)
