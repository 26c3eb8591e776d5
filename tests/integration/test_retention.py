"""Records removed by Kafka's retention while the consumer was down: the consumer stops in one
line (``--fail-on-data-loss``, the default), or is told to go on from what Kafka still has and
counts what it skipped.

Retention here is the broker's own: the topic's ``retention.ms`` and ``segment.ms`` made short,
a watermark record rolling each partition's segment, the embedded broker deleting the old
segments (it checks every second); then the topic's retention back to the broker's default."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from spanner_cdc.consumer.errors import ConsumerError
from spanner_cdc.consumer.readers import changelog_rows, replica_rows
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import ConfigFactory, run_consumer
from testkit.synthetic import ChangeFactory, publish

pytestmark = [pytest.mark.integration, pytest.mark.spark]
#: How long the broker gets to delete the old segments (it looks every second).
DELETION_SECONDS = 60.0


def set_retention(bootstrap: str, topic: str, short: bool) -> None:
    """The topic's retention (and segments) made short, or back to the broker's defaults."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    operation = AlterConfigOpType.SET if short else AlterConfigOpType.DELETE
    settings = [
        ConfigEntry(name, value, incremental_operation=operation)
        for name, value in (("segment.ms", "100"), ("retention.ms", "300"))
    ]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=settings)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def wait_until_deleted(bootstrap: str, topic: str, below: dict[int, int]) -> None:
    """Until every partition's earliest offset is at or past ``below`` (partition → offset)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "retention-check"})
    try:
        deadline = time.monotonic() + DELETION_SECONDS
        while time.monotonic() < deadline:
            earliest = {
                p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0] for p in below
            }
            if all(earliest[p] >= offset for p, offset in below.items()):
                return
            time.sleep(0.5)
        raise AssertionError(f"retention did not remove {topic}'s records below {below}: {earliest}")
    finally:
        reader.close()


def ends(bootstrap: str, topic: str) -> dict[int, int]:
    return {p: high for p, (_, high) in offsets(bootstrap, topic).items()}


def earliest_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    return {p: low for p, (low, _) in offsets(bootstrap, topic).items()}


def offsets(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """Partition → (earliest offset, end) of ``topic`` now."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "retention-check"})
    try:
        partitions = reader.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in partitions}
    finally:
        reader.close()


@pytest.mark.parametrize("configure", ["duckdb"], indirect=True)
def test_records_removed_by_retention_while_the_consumer_was_down(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    config = configure()
    kafka, prefix, topic = config.kafka_bootstrap, config.topic_prefix, config.topics.event("Accounts")
    factory = ChangeFactory()
    read = [factory.record("INSERT", {"Id": f"read{i}"}, {"Balance": str(i)}) for i in range(5)]
    publish(kafka, prefix, factory.events(*read))
    run_consumer(spark, config)
    read_up_to = ends(kafka, topic)

    unread = [factory.record("INSERT", {"Id": f"lost{i}"}, {"Balance": str(i)}) for i in range(5)]
    publish(kafka, prefix, factory.events(*unread))
    removed = ends(kafka, topic)
    set_retention(kafka, topic, short=True)
    time.sleep(0.5)
    # A watermark appended after the segments aged rolls every partition's segment.
    publish(kafka, prefix, [], watermark=int(unread[-1]["commit_timestamp"]))
    wait_until_deleted(kafka, topic, removed)
    set_retention(kafka, topic, short=False)  # or the broker deletes what comes next as well
    publish(kafka, prefix, factory.events(factory.record("INSERT", {"Id": "kept"}, {"Balance": "7"})))

    with pytest.raises(ConsumerError, match="lost"):
        run_consumer(spark, config)
    assert replica_rows(config, "Accounts", '"Id"') == [(f"read{i}",) for i in range(5)]

    earliest = earliest_offsets(kafka, topic)
    metrics = run_consumer(spark, replace(config, fail_on_data_loss=False))
    lost = metrics.registry.get_sample_value("spanner_cdc_consumer_lost_offsets_total")
    assert lost == sum(earliest[p] - read_up_to[p] for p in read_up_to) >= len(unread)
    assert replica_rows(config, "Accounts", '"Id"') == sorted([("kept",), *((f"read{i}",) for i in range(5))])
    ids = [row[0] for row in changelog_rows(config, "Accounts", '"Id"')]
    assert sorted(ids) == sorted(["kept", *(f"read{i}" for i in range(5))])
