"""The schema topic under a flood of garbage, on the real broker: read one record at a
time, refusals remembered and logged up to a bound, the real schemas behind the flood still found;
a read that stops early resumes where it stopped instead of losing what it had read."""

from __future__ import annotations

import logging
from contextlib import closing

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from spanner_cdc.common.kafka_offsets import READER_SETTINGS, read_to_end
from spanner_cdc.consumer.decode.schema_topic import MAX_REFUSED_SCHEMAS, MAX_SCHEMA_WARNINGS, SchemaTopic
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import unique_prefix
from testkit.synthetic import ChangeFactory, publish
from tests.support.kafka_read import read_all

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        producer.produce(topic, value, key)
        producer.poll(0)
    assert producer.flush(60) == 0


def test_a_flood_of_refused_schema_records_is_bounded(
    stack: EmbeddedStack, caplog: pytest.LogCaptureFixture
) -> None:
    bootstrap = stack.endpoint("kafka")
    topics = Topics(unique_prefix("F"))
    flood = [(f"{n:016x}".encode(), b"not a schema") for n in range(1, MAX_REFUSED_SCHEMAS + 300)]
    flood += [(b"not a fingerprint", b"{}")] * 50
    produce(bootstrap, topics.schemas, flood)
    accounts = ChangeFactory()
    publish(
        bootstrap, topics.prefix, accounts.events(accounts.record("INSERT", {"Id": "a"}, {"Balance": "1"}))
    )

    schemas = SchemaTopic({"bootstrap.servers": bootstrap}, topics.prefix)
    with caplog.at_level(logging.WARNING, logger="spanner_cdc"):
        schemas.refresh()

    event = next(value for _, _, key, value in read_all(bootstrap, topics.event("Accounts")) if key and value)
    assert schemas.store().decode(event)["payload"]["Id"] == "a"  # the real schema, published after the flood
    assert len(schemas.refused) == MAX_REFUSED_SCHEMAS
    assert len([r for r in caplog.records if r.name.startswith("spanner_cdc")]) == MAX_SCHEMA_WARNINGS + 1


def test_a_read_stopped_early_resumes_where_it_stopped(stack: EmbeddedStack) -> None:
    bootstrap = stack.endpoint("kafka")
    topic = f"{unique_prefix('R')}.records"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures die with it
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    produce(bootstrap, topic, [(b"k", str(n).encode()) for n in range(30)])
    consumer = Consumer({**READER_SETTINGS, "bootstrap.servers": bootstrap, "group.id": "tests"})
    try:
        positions: dict[int, int] = {}
        with closing(read_to_end(consumer, topic, positions)) as records:
            first = [next(records)[3] for _ in range(10)]
        assert positions == {0: 10}
        rest = [value for _, _, _, value in read_to_end(consumer, topic, positions)]
    finally:
        consumer.close()
    assert first + rest == [str(n).encode() for n in range(30)]
