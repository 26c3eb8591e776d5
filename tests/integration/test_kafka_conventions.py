"""Topics for generic Kafka readers: a tombstone after each delete so that compacted
topics forget deleted rows, and no watermark records — produced from the emulator, then read by
the consumer, which skips the tombstones and, without watermarks, applies batches as they come."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException

from spanner_cdc.consumer.readers import changelog_rows, replica_rows
from spanner_cdc.schemas.watermark import is_watermark
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import consumer_config, on_disk, run_consumer, unique_prefix
from testkit.spanner_db import create_database
from tests.support.churn import ACCOUNTS_DDL
from tests.support.kafka_read import read_all, schema_store
from tests.support.produce_process import delete_account, run_producer_while, upsert_account

pytestmark = pytest.mark.integration


def test_tombstones_after_deletes_and_no_watermark_records(
    stack: EmbeddedStack, spark: Any, tmp_path: Path
) -> None:
    kafka = stack.endpoint("kafka")
    database = create_database(stack.endpoint("spanner"), ACCOUNTS_DDL)
    prefix = unique_prefix("conv")
    topic = f"{prefix}.Accounts"

    def act() -> None:
        upsert_account(database, "gone")
        upsert_account(database, "kept")
        delete_account(database, "gone")

    def tombstone_written() -> bool:
        try:
            return any(value is None for _, _, _, value in read_all(kafka, topic))
        except (KafkaException, KeyError):  # the topic is not there yet
            return False

    options = ("--delete-tombstones", "--no-watermark-records")
    run_producer_while(stack, database, prefix, act, tombstone_written, *options)

    messages = sorted(read_all(kafka, topic), key=lambda m: (m[0], m[1]))
    store = schema_store(kafka, prefix)
    records = [(p, o, k, store.read(v)) for p, o, k, v in messages if v is not None]
    assert not [r for r in records if is_watermark(r[3][1])], "watermark records were written"
    deletes = [
        (p, o, k) for p, o, k, (record, _) in records if record["source_metadata"]["change_type"] == "DELETE"
    ]
    tombstones = [(p, o, k) for p, o, k, v in messages if v is None]
    assert len(deletes) == len(tombstones) == 1
    (delete_partition, delete_offset, delete_key), (partition, offset, key) = deletes[0], tombstones[0]
    assert (partition, key) == (delete_partition, delete_key) and offset > delete_offset

    config = consumer_config(kafka, prefix, tmp_path / "out", whole_transactions=False)
    metrics = run_consumer(spark, config)
    assert replica_rows(config, "Accounts", '"Id"') == [("kept",)]
    assert sorted(row[0] for row in changelog_rows(config, "Accounts", '"Id"')) == ["gone", "gone", "kept"]
    assert not on_disk(config).quarantine.exists(), "a tombstone was quarantined"
    assert metrics.registry.get_sample_value("spanner_cdc_consumer_tombstones_total") == 1
