"""Upgrading from 0.1, whose control topics were ``{prefix}._schemas`` and ``{prefix}._checkpoints``:
the producer moves them to ``_spanner-cdc.{prefix}.…`` and resumes from the moved checkpoints; a
consumer started before that refuses with one line instead of quarantining every event."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from spanner_cdc.consumer.errors import ConsumerError
from spanner_cdc.consumer.main import check_kafka
from spanner_cdc.consumer.readers import replica_rows
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import consumer_config, run_consumer, unique_prefix
from testkit.spanner_db import create_database
from tests.support.churn import ACCOUNTS_DDL
from tests.support.kafka_read import read_all, read_events
from tests.support.produce_process import run_until_published, upsert_account

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def copy_topic(bootstrap: str, source: str, target: str) -> int:
    """Every record of ``source`` to the same partition of ``target`` (created alike)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = len(admin.list_topics(timeout=10).topics[source].partitions)
    admin.create_topics([NewTopic(target, partitions, -1)])[target].result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    messages = read_all(bootstrap, source)
    for partition, _, key, value in sorted(messages, key=lambda m: (m[0], m[1])):
        producer.produce(target, value=value, key=key, partition=partition)
    assert producer.flush(30) == 0
    return len(messages)


def test_a_0_1_deployment_is_moved_and_resumes_where_it_stood(
    stack: EmbeddedStack, spark: Any, tmp_path: Path
) -> None:
    kafka = stack.endpoint("kafka")
    database = create_database(stack.endpoint("spanner"), ACCOUNTS_DDL)
    current, old = unique_prefix("new"), unique_prefix("old")
    run_until_published(stack, database, current, "before")
    # What a 0.1 producer would have left: the same records under the old names.
    copy_topic(kafka, f"{current}.Accounts", f"{old}.Accounts")
    schemas = copy_topic(kafka, Topics(current).schemas, f"{old}._schemas")
    checkpoints = copy_topic(kafka, Topics(current).checkpoints, f"{old}._checkpoints")
    assert schemas and checkpoints

    config = consumer_config(kafka, old, tmp_path / "out")
    with pytest.raises(ConsumerError, match="start this version's producer once"):
        check_kafka(config)

    upsert_account(database, "after")  # while no producer runs: only a resumed producer reads it
    run_until_published(stack, database, old, "unrelated")
    published = sorted(e.value["payload"]["Id"] for e in read_events(kafka, old, "Accounts"))
    assert published == ["after", "before", "unrelated"]  # "before" not read again
    moved = Topics(old)
    assert {key for _, _, key, _ in read_all(kafka, f"{old}._schemas")} <= {
        key for _, _, key, _ in read_all(kafka, moved.schemas)
    }
    assert {key for _, _, key, _ in read_all(kafka, f"{old}._checkpoints")} <= {
        key for _, _, key, _ in read_all(kafka, moved.checkpoints)
    }

    run_consumer(spark, config)
    assert replica_rows(config, "Accounts", '"Id"') == [("after",), ("before",), ("unrelated",)]
