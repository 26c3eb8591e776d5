"""Writing records to a topic as a test's outside party would: plain, not in a transaction."""

from __future__ import annotations

from confluent_kafka import Producer


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """Keyed records as they are, acknowledged (the producer is gone when this returns)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        producer.produce(topic, value, key)
    assert producer.flush(30) == 0
