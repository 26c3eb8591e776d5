"""Events decoded by the consumer from the bytes the producer would write: no broker, no Spark."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from spanner_cdc.consumer.decode.decoded import DecodedBatch, DecodedEvent
from spanner_cdc.consumer.decode.driver import BatchDecoder
from spanner_cdc.consumer.decode.outline_rows import outline_batch
from spanner_cdc.schemas.events import Event
from spanner_cdc.schemas.wire import WriterSchema, body_start, encode, read_body
from testkit.synthetic import ChangeFactory


def decoded_events(
    decoder: BatchDecoder,
    records: list[dict[str, Any]],
    topic: str,
    partition: int = 0,
    first_offset: int = 0,
) -> list[DecodedEvent]:
    """``records`` (data change records) as the producer's events, encoded, then decoded as one
    partition's messages from ``first_offset`` on (:func:`decoded_from_events`)."""
    return decoded_from_events(decoder, ChangeFactory().events(*records), topic, partition, first_offset)


def decoded_from_events(
    decoder: BatchDecoder, events: list[Event], topic: str, partition: int = 0, first_offset: int = 0
) -> list[DecodedEvent]:
    """``events`` encoded, then decoded as one partition's messages from ``first_offset`` on. The
    decoder's schema store is filled directly, so it needs no schema topic."""
    keys, values = [], []
    writers: dict[str, WriterSchema] = {}  # a writer schema's fingerprint and reader, once each

    def published(schema: dict[str, Any]) -> WriterSchema:
        text = json.dumps(schema, sort_keys=True)
        writer = writers.get(text)
        if writer is None:  # as the producer publishes a table version's schemas: event and key
            writer = writers[text] = WriterSchema.from_schema(schema)
            decoder.schemas.accept(writer.fingerprint_hex.encode(), writer.schema_json.encode())
        return writer

    for event in events:
        values.append(encode(published(event.table.event_schema), event.fields))
        keys.append(encode(published(event.table.key_schema), event.key))
    rows = pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": [topic] * len(values),
            "partition": pa.array([partition] * len(values), pa.int32()),
            "offset": pa.array(range(first_offset, first_offset + len(values)), pa.int64()),
        }
    )
    return decoder.decode(rows).events


def record_of(event: DecodedEvent) -> dict[str, Any]:
    """The Avro record of an event decoded from Avro (single-object or registry-framed), read
    by the record reader: what the columns it was read into hold, timestamps and dates as the
    numbers written."""
    return read_body(event.version.writer, event.value, body_start(event.value), calendar_numbers=True)


def event_rows(events: list[DecodedEvent]) -> pa.Table:
    """The outline rows (consumer.decode.outline_rows) the tasks would send the driver for ``events``."""
    return pa.Table.from_batches([outline_batch(DecodedBatch(events, [], []))])
