"""What decoding makes of a micro-batch's Kafka rows: events, watermarks and quarantine rows.

Shared by the decoder (consumer.decode.gate, run on the executors and on the driver) and the
sinks that take its results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import pyarrow as pa

from spanner_cdc.consumer.decode.table_version import TableVersion
from spanner_cdc.schemas.watermark import Watermark

#: The Kafka coordinates of an event, added to the columns it is read into (the outline takes
#: them there). ``$`` cannot occur in an Avro name, so they never meet the event's own fields.
TOPIC, PARTITION, OFFSET = "kafka$topic", "kafka$partition", "kafka$offset"


@dataclass(slots=True)
class DecodedEvent:
    """One event, where it came from, its bytes (kept for transactions held back), and its row
    of the columns it was read into (consumer.decode.events): no Python record of it is made.

    Not frozen: nothing changes an event once the gate made it, and a frozen dataclass sets each
    field through ``object.__setattr__``, several times slower, for every event a task reads."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    version: TableVersion
    #: The record's ``object``: its table's name.
    table: str
    #: ``sort_keys`` as a comparable tuple: (commit micros, tx id, record sequence, mod index).
    sort_key: tuple[int, str, str, int]
    #: The columns the event was read into (``events.gate_type`` over its writer schema, and its
    #: coordinates: :data:`TOPIC`, :data:`PARTITION`, :data:`OFFSET`), and its row of them: the
    #: sinks and the outline take its columns from there rather than read its bytes again.
    read_into: pa.StructArray
    read_row: int

    @property
    def commit_micros(self) -> int:
        return self.sort_key[0]


def read_columns(events: Sequence[DecodedEvent]) -> pa.StructArray:
    """The events' rows of the columns they were read into, in the events' order, as one
    struct array (of the first event's columns' type: the events share a writer schema's)."""
    first = events[0].read_into
    if all(event.read_into is first for event in events):
        rows = [event.read_row for event in events]
        if len(rows) == len(first) and rows == list(range(len(rows))):
            return first  # a share's events, all of them in their order: the common case
        return cast(pa.StructArray, first.take(pa.array(rows, pa.int64())))
    starts: dict[int, int] = {}  # where each array read begins among them laid end to end
    parts: list[pa.StructArray] = []
    rows = []
    for event in events:
        start = starts.get(id(event.read_into))
        if start is None:
            start = starts[id(event.read_into)] = sum(map(len, parts))
            parts.append(event.read_into)
        rows.append(start + event.read_row)
    return cast(pa.StructArray, pa.concat_arrays(parts).take(pa.array(rows, pa.int64())))


@dataclass(frozen=True)
class WatermarkSeen:
    """A watermark record and the partition it was read from."""

    topic: str
    partition: int
    offset: int
    watermark: Watermark
    #: Its bytes, for the quarantine if the broker refutes it (consumer.decode.driver).
    value: bytes


@dataclass(frozen=True)
class DecodedBatch:
    #: In their messages' order.
    events: list[DecodedEvent]
    watermarks: list[WatermarkSeen]
    quarantined: list[Quarantined]
    #: Keyed messages without a value: a producer's --delete-tombstones, for compaction; skipped.
    tombstones: int = 0


@dataclass(frozen=True)
class Unknown:
    """What a message names that its batch's context did not know, and the driver may learn
    before the batch is read again (consumer.decode.driver): one of a writer schema's fingerprint, a
    Schema Registry id or a JSON event's (table, schema_key). A few bytes, whatever the
    message's size: the driver learns from the name, never from the message."""

    fingerprint: int | None = None
    schema_id: int | None = None
    table_version: tuple[str, str] | None = None


@dataclass(frozen=True)
class Quarantined:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    detail: str
    #: Set when the reason is one the driver can do something about (consumer.decode.gate).
    unknown: Unknown | None = None
