"""What decoding makes of a micro-batch's Kafka rows: events, watermarks and quarantine rows.

Shared by the decoder (consumer.decode.gate, run on the executors and on the driver) and the
sinks that take its results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spanner_cdc.consumer.decode.table_version import TableVersion
from spanner_cdc.schemas.watermark import Watermark
from spanner_cdc.schemas.wire import body_start, read_body


@dataclass(slots=True)
class DecodedEvent:
    """One event, where it came from, and its bytes (kept for transactions held back).

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
    #: The decoded Avro record, when the gate made one (consumer.decode.gate); None where the
    #: columnar gate read the event into columns only (consumer.decode.columnar): :attr:`record`.
    known_record: dict[str, Any] | None
    #: Where the columnar gate read the event to (consumer.decode.columnar): its row
    #: :attr:`read_row` of these columns, of ``change_rows.event_type`` over its writer schema's
    #: payload; the sinks take its columns from there rather than read its bytes again. None
    #: where the record gate read it.
    read_into: pa.StructArray | None = None
    read_row: int = 0

    @property
    def record(self) -> dict[str, Any]:
        """The decoded Avro record; its timestamps and dates are numbers (consumer.decode.gate).
        Read from the bytes when first asked if the gate made none: the gate read them without
        error, with the same schema."""
        if self.known_record is None:
            writer = self.version.writer
            self.known_record = read_body(writer, self.value, body_start(self.value), calendar_numbers=True)
        return self.known_record

    @property
    def commit_micros(self) -> int:
        return self.sort_key[0]


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
    #: In their messages' order: those the columnar gate read (consumer.decode.columnar), then
    #: those the record gate read.
    events: list[DecodedEvent]
    watermarks: list[WatermarkSeen]
    quarantined: list[Quarantined]
    #: Keyed messages without a value: a producer's --delete-tombstones, for compaction; skipped.
    tombstones: int = 0
    #: Outline rows (consumer.decode.outline_rows) of the first :attr:`outlined_events` of
    #: :attr:`events`: the columnar gate made them from its columns (consumer.decode.columnar).
    outlined: tuple[pa.RecordBatch, ...] = ()

    @property
    def outlined_events(self) -> int:
        """How many of :attr:`events`, from the first, :attr:`outlined` has a row of (one each)."""
        return sum(rows.num_rows for rows in self.outlined)


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
