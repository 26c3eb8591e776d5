"""Watermark records: the producer's promise that a commit timestamp is complete on Kafka.

A watermark record with value ``W``, read on partition ``p`` of topic ``t``, means: every event
of a change committed at or before ``W`` that belongs on ``t``/``p`` is at a lower offset. The
producer writes one to every partition of every event topic each time its safe low watermark
advances (every change read at or before it was acknowledged by Kafka). A reader that has seen
``W`` or more on every partition of every topic the record lists has therefore read every
change committed at or before ``W`` — the basis of a consistent cut across tables.

They travel on the event topics (like Debezium's watermark stamps), so their position relative
to events is exact. Readers that want only events skip them by any of:

* the Kafka header ``spanner-cdc-kind: watermark`` (events have no such header);
* a null key (events always have a key);
* the writer schema, ``spanner_cdc.Watermark``, published on ``_spanner-cdc.{prefix}.schemas`` like every
  event schema (fingerprint :data:`WATERMARK_WRITER`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spanner_cdc.schemas.table import load_avsc
from spanner_cdc.schemas.timestamps import micros_from_datetime
from spanner_cdc.schemas.wire import WriterSchema, encode

#: The Kafka header that marks a watermark record, and its value (events carry no such header).
KIND_HEADER = "spanner-cdc-kind"
WATERMARK_KIND = b"watermark"
WATERMARK_SCHEMA: dict[str, Any] = load_avsc("watermark.avsc")
WATERMARK_WRITER = WriterSchema.from_schema(WATERMARK_SCHEMA)


@dataclass(frozen=True)
class Watermark:
    """One decoded watermark record."""

    stream_name: str
    watermark_micros: int
    topics: Mapping[str, int]

    def encode(self, emitted_at_millis: int, header: bytes | None = None) -> bytes:
        """The record, behind ``header`` (schemas.wire; single-object unless given)."""
        return encode(
            WATERMARK_WRITER,
            {
                "stream_name": self.stream_name,
                "watermark": self.watermark_micros,
                "emitted_at": emitted_at_millis,
                "topics": dict(self.topics),
            },
            header,
        )

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Watermark:
        """From the record fastavro decoded (it turns timestamp-micros into a datetime)."""
        return cls(str(record["stream_name"]), _micros(record["watermark"]), dict(record["topics"]))


def is_watermark(writer: WriterSchema) -> bool:
    """Whether a message written with ``writer`` is a watermark record (not an event)."""
    return writer.fingerprint == WATERMARK_WRITER.fingerprint


def _micros(value: int | dt.datetime) -> int:
    if isinstance(value, dt.datetime):
        return micros_from_datetime(value)
    return int(value)
