"""A producer transaction that aborts: none of its records reaches a sink.

The records are written to the broker — flushed and acknowledged inside the transaction — and
then the transaction is aborted, as when a producer is fenced or fails a commit. A reader of
uncommitted records would hand them to the consumer; Spark's source reads committed ones only.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer

from spanner_cdc.consumer.readers import changelog_rows, replica_rows
from spanner_cdc.schemas.events import Event
from spanner_cdc.schemas.wire import WriterSchema, encode
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import ConfigFactory, on_disk, run_consumer
from testkit.synthetic import ChangeFactory, publish

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def write_and_abort(bootstrap: str, topic: str, events: list[Event]) -> None:
    """``events`` encoded as the producer encodes them, flushed inside a transaction that is
    then aborted."""
    table = events[0].table
    writer, key_writer = (
        WriterSchema.from_schema(table.event_schema),
        WriterSchema.from_schema(table.key_schema),
    )
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"aborting-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for event in events:
        producer.produce(topic, key=encode(key_writer, event.key), value=encode(writer, event.value))
    assert producer.flush(30) == 0
    producer.abort_transaction(30)


def test_the_records_of_an_aborted_transaction_are_never_applied(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    config = configure()
    factory = ChangeFactory()
    before = factory.events(
        factory.record("INSERT", {"Id": "a"}, {"Balance": "1", "Note": "x"}),
        factory.record("INSERT", {"Id": "b"}, {"Balance": "2", "Note": "y"}),
    )
    aborted = factory.events(
        factory.record("UPDATE", {"Id": "a"}, {"Balance": "100", "Note": "aborted"}),
        factory.record("INSERT", {"Id": "c"}, {"Balance": "3", "Note": "aborted"}),
        factory.record("DELETE", {"Id": "b"}, {}),
    )
    after = factory.events(factory.record("UPDATE", {"Id": "a"}, {"Balance": "5", "Note": "x"}))
    publish(config.kafka_bootstrap, config.topic_prefix, before)
    write_and_abort(config.kafka_bootstrap, config.topics.event("Accounts"), aborted)
    publish(config.kafka_bootstrap, config.topic_prefix, after)

    run_consumer(spark, config)

    uuids = [row[0] for row in changelog_rows(config, "Accounts", '"envelope$uuid"')]
    assert uuids == [e.value["uuid"] for e in before + after]
    assert replica_rows(config, "Accounts", '"Id", "Balance", "Note"') == [("a", 5, "x"), ("b", 2, "y")]
    assert not on_disk(config).quarantine.exists(), "a message was quarantined"
