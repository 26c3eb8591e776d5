"""The Schema Registry wire format: what the producer writes, confluent-kafka's own
deserializer reads; what confluent-kafka's own serializer writes, the consumer reads.

No registry server can be installed on this machine (Confluent's and Apicurio's need Maven or
Docker, Karapace is not on PyPI); the registry is confluent-kafka's in-memory
``MockSchemaRegistryClient`` (``mock://``), behind the project's own ``SchemaRegistry`` wrapper, and every
message goes through the real broker.
"""

from __future__ import annotations

import functools

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from spanner_cdc.common.schema_registry import SchemaRegistry, SchemaRegistryUnreachableError
from spanner_cdc.consumer.decode.driver import BatchDecoder, BrokerPartitions, partition_counts
from spanner_cdc.consumer.decode.kafka_rows import DECODE_SCHEMA
from spanner_cdc.consumer.decode.schema_topic import SchemaTopic
from spanner_cdc.producer.publish.framing import RegistryFraming
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import WATERMARK_WRITER, Watermark
from spanner_cdc.schemas.wire import REGISTRY_HEADER_LENGTH, WriterSchema, read_body
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from testkit.consumer_run import unique_prefix
from testkit.decoding import record_of
from testkit.synthetic import ChangeFactory, publish, random_history
from tests.support.kafka_read import read_all

pytestmark = pytest.mark.integration


def registry() -> SchemaRegistry:
    """confluent-kafka's in-memory registry (its client's answer to a ``mock://`` URL)."""
    return SchemaRegistry(SchemaRegistryClient.new_client({"url": "mock://tests"}), "mock://tests")


def decoder(kafka: str, prefix: str, schema_registry: SchemaRegistry | None) -> BatchDecoder:
    config = {"bootstrap.servers": kafka}
    partitions = BrokerPartitions(functools.partial(partition_counts, config))
    return BatchDecoder(SchemaTopic(config, prefix), Topics(prefix), partitions, schema_registry)


def rows(topic: str, messages: list[tuple[int, int, bytes | None, bytes | None]]) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"key": key, "value": value, "topic": topic, "partition": partition, "offset": offset}
            for partition, offset, key, value in messages
        ],
        schema=DECODE_SCHEMA,
    )


def test_the_producer_writes_what_confluents_deserializer_reads(stack: EmbeddedStack) -> None:
    kafka, prefix = stack.endpoint("kafka"), unique_prefix("registry")
    topic = f"{prefix}.Accounts"
    schema_registry = registry()
    events = random_history(ChangeFactory(), 60)
    publish(kafka, prefix, events, framing=RegistryFraming(schema_registry))

    client = schema_registry.client
    assert sorted(client.get_subjects()) == sorted(
        [f"{topic}-key", f"{topic}-value", f"{topic}-spanner_cdc.Watermark"]
    )
    value_id = client.get_latest_version(f"{topic}-value").schema_id
    key_id = client.get_latest_version(f"{topic}-key").schema_id
    watermark_id = client.get_latest_version(f"{topic}-spanner_cdc.Watermark").schema_id

    messages = read_all(kafka, topic)
    values, keys = AvroDeserializer(client), AvroDeserializer(client)
    ours = decoder(kafka, prefix, schema_registry).decode(rows(topic, messages))
    assert not ours.quarantined
    assert len(ours.events) == len(events) and len(ours.watermarks) == 3  # one per partition
    by_offset = {(e.partition, e.offset): e for e in ours.events}
    watermarks = 0
    for partition, offset, key, value in messages:
        assert value is not None and value[:1] == b"\x00"
        schema_id = int.from_bytes(value[1:5], "big")
        theirs = values(value, SerializationContext(topic, MessageField.VALUE))
        if key is None:  # a watermark record: its own subject, the record the producer meant
            assert schema_id == watermark_id
            assert Watermark.from_record(theirs) == ours.watermarks[0].watermark
            watermarks += 1
            continue
        assert schema_id == value_id and key[:1] == b"\x00" and int.from_bytes(key[1:5], "big") == key_id
        event = by_offset[(partition, offset)]
        # the consumer's gate holds timestamps as numbers; as fastavro reads them, the record is theirs
        assert record_of(event) == read_body(
            event.version.writer, value, REGISTRY_HEADER_LENGTH, calendar_numbers=True
        )
        assert theirs == read_body(event.version.writer, value, REGISTRY_HEADER_LENGTH)
        assert keys(key, SerializationContext(topic, MessageField.KEY)) == {
            "Id": record_of(event)["payload"]["Id"]
        }
    assert watermarks == 3


def test_the_consumer_reads_what_confluents_serializer_writes(stack: EmbeddedStack) -> None:
    """Messages framed by confluent-kafka's ``AvroSerializer`` decode to exactly what the same
    events decode to in single-object encoding; a registry id the registry lacks, and a framed
    message reaching a consumer without a registry, are quarantined with their reason."""
    kafka, prefix = stack.endpoint("kafka"), unique_prefix("registry-in")
    topic = f"{prefix}.Accounts"
    events = random_history(ChangeFactory(), 30)
    publish(kafka, prefix, events)  # single-object, and the writer schemas on the schema topic
    single_object = read_all(kafka, topic)
    expected = decoder(kafka, prefix, None).decode(rows(topic, single_object))
    assert len(expected.events) == len(events)

    schema_registry = registry()
    writer = WriterSchema.from_schema(events[0].table.event_schema)
    serialize = AvroSerializer(
        schema_registry.client, writer.schema_json, conf={"auto.register.schemas": True}
    )
    context = SerializationContext(topic, MessageField.VALUE)
    framed = [serialize(event.value, context) for event in events]
    unknown = b"\x00" + (4242).to_bytes(4, "big") + framed[0][5:]
    batch = rows(
        topic,
        [(0, offset, b"k", value) for offset, value in enumerate([*framed, unknown])],
    )

    decoded = decoder(kafka, prefix, schema_registry).decode(batch)
    by_uuid = {record_of(e)["uuid"]: record_of(e) for e in expected.events}
    assert [record_of(e) for e in decoded.events] == [by_uuid[e.value["uuid"]] for e in events]
    assert [(q.offset, q.reason) for q in decoded.quarantined] == [(len(framed), "unknown-schema-id")]

    without_registry = decoder(kafka, prefix, None).decode(batch)
    assert not without_registry.events
    assert {q.reason for q in without_registry.quarantined} == {"registry-framed"}
    assert "--schema-registry-url" in without_registry.quarantined[0].detail
    assert len(without_registry.quarantined) == len(framed) + 1


def test_a_registry_that_does_not_answer_stops_the_work_not_the_messages(stack: EmbeddedStack) -> None:
    """Producing: a retryable one-line error. Consuming: the batch fails (Spark tries it again),
    nothing is quarantined for the registry's absence."""
    port = free_port()
    unreachable = SchemaRegistry.connect(f"http://user:secret@127.0.0.1:{port}", {})
    with pytest.raises(SchemaRegistryUnreachableError) as raised:
        unreachable.register("t-value", WATERMARK_WRITER)
    message = str(raised.value)
    assert f"127.0.0.1:{port}" in message and "secret" not in message and "\n" not in message

    framed = b"\x00" + (1).to_bytes(4, "big") + b"\x02"
    batch = rows("P.Accounts", [(0, 0, b"k", framed)])
    with pytest.raises(SchemaRegistryUnreachableError):
        decoder(stack.endpoint("kafka"), "P", unreachable).decode(batch)
