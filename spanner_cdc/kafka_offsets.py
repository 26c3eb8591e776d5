"""End offsets of topic partitions that are right on every Kafka-protocol broker we run on.

Tansu (the embedded broker) answers ListOffsets(latest) with the base offset of the last record
batch + 1, not the offset after the last record: a batch of 20 records at offsets 0-19 reports
1. The high watermark in a Fetch response is right, so the end is read from there: fetch the
last batch and take the broker's high watermark. On Apache Kafka both agree; the fetch costs
one round trip per non-empty partition.
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import Consumer, TopicPartition


def end_offsets(
    consumer: Consumer, topic: str, partitions: Iterable[int], timeout: float = 10.0
) -> dict[int, int]:
    """partition → offset after its last record. Changes the consumer's assignment."""
    ends = {}
    for partition in partitions:
        _, listed = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
        ends[partition] = listed
        if listed <= 0:
            continue
        consumer.assign([TopicPartition(topic, partition, listed - 1)])
        message = consumer.poll(timeout)
        if message is not None and message.error() is None:
            _, fetched = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
            ends[partition] = max(listed, fetched)
    consumer.unassign()
    return ends
