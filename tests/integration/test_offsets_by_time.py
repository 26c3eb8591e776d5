"""The first offset at or after a time, against the real broker — which answers ListOffsets by
timestamp with offset 0 for every time, so both the confirmed answer and the bisection run."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from spanner_cdc.common.kafka_offsets import READER_SETTINGS
from spanner_cdc.consumer.offsets_by_time import offsets_at
from spanner_cdc.stack import EmbeddedStack

pytestmark = pytest.mark.integration

#: Partition 0: offsets 0-14 at 1,000 ms … 15,000 ms (10-14 in a transaction, whose commit
#: marker takes offset 15), offsets 16-20 at 16,000 … 20,000 ms. Partition 1: empty.
RECORDS = 20


@pytest.fixture(scope="module")
def timed_topic(stack: EmbeddedStack) -> tuple[str, str]:
    bootstrap = stack.endpoint("kafka")
    topic = f"times-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    plain = Producer({"bootstrap.servers": bootstrap})
    for second in range(1, 11):
        plain.produce(topic, value=b"p", partition=0, timestamp=second * 1000)
    assert plain.flush(30) == 0
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx"})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    for second in range(11, 16):
        transactional.produce(topic, value=b"t", partition=0, timestamp=second * 1000)
    transactional.commit_transaction(30)
    for second in range(16, 21):
        plain.produce(topic, value=b"p", partition=0, timestamp=second * 1000)
    assert plain.flush(30) == 0
    return bootstrap, topic


def first_offsets(bootstrap: str, topic: str, times: dict[int, int]) -> dict[int, int | None]:
    consumer: Any = Consumer(
        {**READER_SETTINGS, "bootstrap.servers": bootstrap, "group.id": "times", "enable.auto.commit": False}
    )
    try:
        found = offsets_at(
            consumer,
            {(topic, 0): times[0], (topic, 1): times[1]},
            {(topic, 0): (0, 21), (topic, 1): (0, 0)},
        )
    finally:
        consumer.close()
    return {partition: offset for (_, partition), offset in found.items()}


@pytest.mark.parametrize(
    ("millis", "offset"),
    [
        (0, 0),  # before the first record: the broker's answer (0) is confirmed
        (1000, 0),
        (1001, 1),  # between records: bisection
        (10500, 10),
        (15000, 14),
        (15001, 16),  # past the transaction's marker at offset 15
        (20000, 20),
        (20001, None),  # after the last record: none
    ],
)
def test_the_first_offset_at_or_after_a_time(
    timed_topic: tuple[str, str], millis: int, offset: int | None
) -> None:
    bootstrap, topic = timed_topic
    assert first_offsets(bootstrap, topic, {0: millis, 1: millis}) == {0: offset, 1: None}
