"""Reading whole topics back for assertions: assign every partition, read to the high watermark."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from schemas.wire import SchemaStore
from spanner_cdc.kafka_offsets import end_offsets


@dataclass(frozen=True)
class Received:
    topic: str
    partition: int
    offset: int
    key: dict[str, Any]
    value: dict[str, Any]


def read_all(
    bootstrap: str, topic: str, timeout: float = 60.0
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every message now in ``topic``."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    partitions = sorted(metadata.topics[topic].partitions)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tests", "enable.auto.commit": False})
    try:
        highs = end_offsets(consumer, topic, partitions)
        wanted = {p for p, high in highs.items() if high > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in wanted])
        out = []
        positions = dict.fromkeys(wanted, 0)
        deadline = time.monotonic() + timeout
        while any(positions[p] < highs[p] for p in wanted):
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {positions} of {highs} in {topic}")
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            positions[partition] = offset + 1
            out.append((partition, offset, message.key(), message.value()))
        return out
    finally:
        consumer.close()


def schema_store(bootstrap: str, prefix: str) -> SchemaStore:
    store = SchemaStore()
    for _, _, _, value in read_all(bootstrap, f"{prefix}._schemas"):
        assert value is not None
        store.add(value.decode())
    return store


def read_events(bootstrap: str, prefix: str, table: str) -> list[Received]:
    """Every event of ``table``, decoded, in (partition, offset) order."""
    store = schema_store(bootstrap, prefix)
    topic = f"{prefix}.{table}"
    received = []
    for partition, offset, key, value in sorted(read_all(bootstrap, topic), key=lambda m: (m[0], m[1])):
        assert key is not None and value is not None
        received.append(Received(topic, partition, offset, store.decode(key), store.decode(value)))
    return received
