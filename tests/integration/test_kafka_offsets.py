"""Where partitions end, on the real broker (Tansu lists the wrong end: docs/facts.md): every
partition's end, of one topic or several, at once, right on every call, and the consumer still
usable afterwards; and the offsets of many partitions listed in one request, as the source does."""

from __future__ import annotations

import uuid
from contextlib import closing

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from spanner_cdc.common.kafka_offsets import (
    READER_SETTINGS,
    end_offsets,
    listed_offsets,
    proven_ends,
    read_to_end,
)
from spanner_cdc.stack import EmbeddedStack

pytestmark = pytest.mark.integration
PARTITIONS = 12


def test_every_partition_end_is_found_together_and_again(stack: EmbeddedStack) -> None:
    bootstrap = stack.endpoint("kafka")
    topic = f"ends-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    # Several record batches per partition (lingering producer, three flushes); the last stays empty.
    expected = dict.fromkeys(range(PARTITIONS), 0)

    def delivered(error: KafkaError | None, message: Message) -> None:
        partition, offset = message.partition(), message.offset()
        assert error is None and partition is not None and offset is not None
        expected[partition] = max(expected[partition], offset + 1)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for round_ in range(3):
        for index in range(300):
            producer.produce(
                topic, f"{round_}-{index}".encode(), partition=index % (PARTITIONS - 1), on_delivery=delivered
            )
            producer.poll(0)
        assert producer.flush(30) == 0
    assert expected[0] > 1

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends", **READER_SETTINGS})
    try:
        places = [(topic, partition) for partition in range(PARTITIONS)]
        wanted = {(topic, partition): end for partition, end in expected.items()}
        # Twice on one consumer: a partition paused by the first call must not stall the second.
        assert end_offsets(consumer, places) == wanted
        assert end_offsets(consumer, places) == wanted
        # Two topics in one call (the source asks for every subscribed topic at once).
        other = f"ends-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(other, 2, 1)])[other].result(30)
        producer.produce(other, b"x", partition=1)
        assert producer.flush(30) == 0
        both = end_offsets(consumer, [*places, (other, 0), (other, 1)])
        assert both == {**wanted, (other, 0): 0, (other, 1): 1}
        with closing(read_to_end(consumer, topic, {})) as messages:
            assert sum(1 for _ in messages) == 900
    finally:
        consumer.close()


def test_offsets_of_many_partitions_listed_at_once_and_ends_proven(stack: EmbeddedStack) -> None:
    """The source's way (kafka_source._current): earliest and latest of every partition of every
    topic in one listing each, the latest proven by a fetch. Three topics of 20 partitions, each
    written in several record batches (Tansu lists such a partition's end short), but one
    left empty and one written in a transaction (its end is past the commit marker, which no
    fetch hands over)."""
    bootstrap = stack.endpoint("kafka")
    topics = [f"listed-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 20, 1) for topic in topics]).values():
        future.result(30)
    places = [(topic, partition) for topic in topics for partition in range(20)]
    expected = dict.fromkeys(places, 0)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for _ in range(3):
        for topic, partition in places[:-1]:
            for _ in range(4):
                producer.produce(topic, b"x", partition=partition)
            expected[topic, partition] += 4
        assert producer.flush(30) == 0
    in_transaction = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"listed-{topics[0]}"})
    in_transaction.init_transactions(30)
    in_transaction.begin_transaction()
    for _ in range(5):
        in_transaction.produce(topics[0], b"t", partition=0)
    in_transaction.commit_transaction(30)
    expected[topics[0], 0] += 5 + 1  # and the marker

    assert listed_offsets(admin, places, "earliest") == dict.fromkeys(places, 0)
    listed = listed_offsets(admin, places, "latest")
    assert set(listed) == set(places)
    assert all(listed[place] <= expected[place] for place in places)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "listed", **READER_SETTINGS})
    try:
        assert proven_ends(consumer, listed) == expected
        assert end_offsets(consumer, places) == expected  # one partition at a time: the same
    finally:
        consumer.close()
    assert listed_offsets(admin, [], "latest") == {}
