"""Reading whole topics back for assertions: assign every partition, read to the high watermark."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer

from spanner_cdc.common.kafka_offsets import READER_SETTINGS, read_to_end
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import Watermark, is_watermark
from spanner_cdc.schemas.wire import SchemaStore


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
    consumer = Consumer(
        {**READER_SETTINGS, "bootstrap.servers": bootstrap, "group.id": "tests", "enable.auto.commit": False}
    )
    try:
        return list(read_to_end(consumer, topic, {}, timeout))
    finally:
        consumer.close()


def schema_store(bootstrap: str, prefix: str) -> SchemaStore:
    store = SchemaStore()
    for _, _, _, value in read_all(bootstrap, Topics(prefix).schemas):
        assert value is not None
        store.add(value.decode())
    return store


def read_events(bootstrap: str, prefix: str, table: str) -> list[Received]:
    """Every event of ``table``, decoded, in (partition, offset) order; watermarks skipped."""
    return read_topic(bootstrap, prefix, table)[0]


def read_topic(
    bootstrap: str, prefix: str, table: str
) -> tuple[list[Received], list[tuple[int, int, Watermark]]]:
    """Events and watermark records (partition, offset, watermark) of ``table``'s topic, in
    (partition, offset) order, told apart the way schemas.watermark says readers should.

    The topic is read before the schemas: the producer publishes a schema before the first event
    that uses it, so every event read is then decodable (read the other way round, an event
    published between the two reads named a schema not yet seen)."""
    topic = f"{prefix}.{table}"
    messages = sorted(read_all(bootstrap, topic), key=lambda m: (m[0], m[1]))
    store = schema_store(bootstrap, prefix)
    events, watermarks = [], []
    for partition, offset, key, value in messages:
        assert value is not None
        record, writer = store.read(value)
        if is_watermark(writer):
            assert key is None, "a watermark record with a key"
            watermarks.append((partition, offset, Watermark.from_record(record)))
            continue
        assert key is not None
        events.append(Received(topic, partition, offset, store.decode(key), record))
    return events, watermarks
