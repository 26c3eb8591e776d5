"""Where partitions end, on the embedded Apache Kafka: every partition's end, of one topic or
several, right on every call, and the consumer still usable afterwards; a read_committed reader's
end and records around open and aborted transactions."""

from __future__ import annotations

import uuid
from contextlib import closing

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from spanner_cdc.common.kafka_offsets import READER_SETTINGS, end_offsets, read_to_end
from spanner_cdc.stack import EmbeddedStack
from tests.support.waiting import eventually

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
        # Two topics in one call.
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


def test_a_reader_reads_committed_records_only_and_ends_where_a_transaction_is_open(
    stack: EmbeddedStack,
) -> None:
    """Every reader of the project reads committed records: the records of an aborted
    transaction are never handed over, and while a transaction is open a partition ends at its
    first record (the last stable offset), after the commit past the commit's marker."""
    bootstrap = stack.endpoint("kafka")
    topic = f"committed-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    writer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"t-{topic}"})
    writer.init_transactions(30)

    def transaction(values: list[bytes], commit: bool) -> None:
        writer.begin_transaction()
        for value in values:
            writer.produce(topic, value, partition=0)
        assert writer.flush(30) == 0
        if commit:
            writer.commit_transaction(30)
        else:
            writer.abort_transaction(30)

    transaction([b"a", b"b"], commit=True)  # offsets 0, 1, marker 2
    transaction([b"x", b"y", b"z"], commit=False)  # 3-5, marker 6
    transaction([b"c"], commit=True)  # 7, marker 8
    writer.begin_transaction()
    writer.produce(topic, b"open", partition=0)  # 9, not committed yet
    assert writer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "committed", **READER_SETTINGS})
    try:
        assert end_offsets(consumer, [(topic, 0)]) == {(topic, 0): 9}
        with closing(read_to_end(consumer, topic, {})) as messages:
            assert [value for _, _, _, value in messages] == [b"a", b"b", b"c"]
        writer.commit_transaction(30)
        # The commit's markers are written to the partition just after the commit returns.
        assert eventually(lambda: end_offsets(consumer, [(topic, 0)]) == {(topic, 0): 11}, 10)
        with closing(read_to_end(consumer, topic, {0: 9})) as messages:
            assert [value for _, _, _, value in messages] == [b"open"]
    finally:
        consumer.close()
