"""The one gate every message passes: Kafka rows → events, watermarks or quarantine rows.

It reads with what the driver knows at the start of a batch (:class:`DecodeContext`: the writer
schemas by fingerprint, the schemas refused and why, the Schema Registry ids resolved, the JSON
table versions) and asks nothing of Kafka, the registry or the broker, so Spark's executors run
it on their share of a batch as well as the driver does. A message that names something the
context does not know yet is quarantined with that name (:class:`UnknownNameError`,
``Quarantined.unknown``); the driver then reads the schema topic or asks the registry once
(consumer.decode.driver) and the batch is read again.

Messages are grouped by the writer schema they name — by their single-object header, the
registry id they carry, or the table version a JSON event names — and each writer's events are
read at once, into Arrow columns, and judged by the rules there (consumer.decode.events,
consumer.decode.rules): one way through for every event, and the one that says why a message
is refused.

The line between the two kinds of failure is drawn here, once: everything about one message's
bytes and content is that message's fault (quarantined, the batch goes on) — whatever exception
the content provokes, not only the ones foreseen. Watermarks are decoded here and checked
against the broker's partitions by the driver (consumer.decode.driver.BrokerPartitions).

Timestamps and dates are read as the numbers the message holds (micros, millis or days since
the epoch; ``WriterSchema.column_reader``), not as ``datetime``: every one goes to an Arrow
column, which holds that number.

JSON events (``--format json``, a value that starts with ``{``) name their table version by
``object`` and ``schema_key``; such an event is turned into the Avro event it stands for and
read with the Avro events of its writer schema, so both formats meet the same checks
(schemas.json_events).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fastavro.validation import validate

from spanner_cdc.consumer.decode.decoded import DecodedBatch, Quarantined, Unknown, WatermarkSeen
from spanner_cdc.consumer.decode.events import EventReader, EventsRead, Messages, grouped
from spanner_cdc.consumer.decode.kafka_rows import kafka_column
from spanner_cdc.consumer.decode.rules import MAX_NAME_CHARS, check_version
from spanner_cdc.consumer.decode.table_version import PARSED_SCHEMAS, TableVersion
from spanner_cdc.schemas.errors import ContractError, DecodeError
from spanner_cdc.schemas.json_events import avro_event, avro_watermark
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import WATERMARK_WRITER, Watermark, is_watermark
from spanner_cdc.schemas.wire import (
    HEADER_LENGTH,
    MAGIC,
    REGISTRY_HEADER_LENGTH,
    WriterSchema,
    encode,
    is_registry_framed,
    read_body,
    read_fingerprint,
    read_schema_id,
)

#: A JSON event's table or schema_key longer than this is not sent to the driver to learn: a
#: qualified Spanner name (schema.table) has at most 2 x 128 + 1 characters.
MAX_LEARNABLE_NAME = 2 * MAX_NAME_CHARS + 1
#: A quarantine reason's detail is cut here: an exception's text can quote the message, and
#: the detail travels to the driver in the outline.
MAX_DETAIL_CHARS = 1_000


@dataclass(frozen=True)
class DecodeContext:
    """What reading a batch may use, fixed when the batch starts: every task of the batch, and a
    replay of it, decides the same way (``now_micros`` included)."""

    topics: Topics
    now_micros: int
    #: Fingerprint → the writer schema's text, for schemas that passed the checks.
    schemas: Mapping[int, str] = field(default_factory=dict)
    #: Fingerprint → (reason, detail) why its events must not be read (consumer.decode.schema_topic).
    unreadable: Mapping[int, tuple[str, str]] = field(default_factory=dict)
    #: Registry schema id → its fingerprint, or (reason, detail) why its messages cannot be read.
    registry_ids: Mapping[int, int | tuple[str, str]] = field(default_factory=dict)
    #: (table, schema_key) → the table version JSON events of it are read with.
    json_versions: Mapping[tuple[str, str], TableSchema] = field(default_factory=dict)


class UnknownNameError(DecodeError):
    """A message names something the batch's context does not know (:class:`Unknown`): the
    driver can learn it (read the schema topic, ask the registry) and read the batch again;
    after that the reason is final."""

    def __init__(self, reason: str, detail: str, unknown: Unknown) -> None:
        super().__init__(reason, detail)
        self.unknown = unknown


@functools.lru_cache(maxsize=PARSED_SCHEMAS)
def parsed_schema(text: str) -> WriterSchema:
    """A writer schema parsed once per process (keyed by its text, not its fingerprint: a
    lookalike shares the fingerprint, and one process may serve several consumers)."""
    return WriterSchema.from_schema(text)


class MessageReader:
    """Reads the rows of one batch (or one task's share of it) under one :class:`DecodeContext`."""

    def __init__(self, context: DecodeContext) -> None:
        self.context = context
        self._versions: dict[tuple[int, tuple[str, ...]], TableVersion] = {}
        self._json_writers: dict[tuple[str, str], WriterSchema] = {}
        self._events = EventReader(context.topics, context.now_micros, self.version)

    def read(self, rows: pa.Table | pa.RecordBatch) -> DecodedBatch:
        """``rows`` has the Kafka columns key, value, topic, partition and offset: each becomes an
        event, a watermark, a quarantine row or a skipped tombstone. Messages are grouped by the
        writer schema they name, and each writer's are read at once (consumer.decode.events)."""
        found = _Found(rows)
        shares: dict[int, tuple[WriterSchema, list[Messages]]] = {}
        for writer, located in self._located(rows, found):
            shares.setdefault(id(writer), (writer, []))[1].append(located)
        for writer, parts in shares.values():
            self._read_share(writer, Messages.joined(parts), rows, found)
        return found.batch()

    def _located(
        self, rows: pa.Table | pa.RecordBatch, found: _Found
    ) -> Iterator[tuple[WriterSchema, Messages]]:
        """Each message's writer schema and Avro bytes; the rest go to ``found`` (tombstones,
        and messages whose header, schema or JSON is refused). Single-object headers are looked
        up once each; the other messages (the registry's framing, JSON, short or foreign
        bytes, no value) one by one."""
        values = kafka_column(rows, "value")
        headers = pc.dictionary_encode(pc.binary_slice(values, 0, HEADER_LENGTH))
        codes = pc.fill_null(headers.indices, -1).to_numpy(zero_copy_only=False)
        one_by_one: list[np.ndarray] = []
        dictionary = headers.dictionary.to_pylist()
        for positions in grouped(codes):
            code = codes[positions[0]]
            header = None if code < 0 else dictionary[code]
            if header is None or len(header) < HEADER_LENGTH or header[: len(MAGIC)] != MAGIC:
                one_by_one.append(positions)
                continue
            try:
                writer = self._writer(read_fingerprint(header))
            except DecodeError as exc:
                found.refuse(positions, exc)
                continue
            messages = values.take(pa.array(positions)).to_pylist()
            yield writer, Messages(positions, messages, [HEADER_LENGTH] * len(positions))
        if not one_by_one:
            return
        positions = np.sort(np.concatenate(one_by_one))
        taken = pa.array(positions)
        pairs = zip(
            values.take(taken).to_pylist(), kafka_column(rows, "key").take(taken).to_pylist(), strict=True
        )
        for position, (value, key) in zip(positions.tolist(), pairs, strict=True):
            if value is None and key is not None:
                found.tombstones += 1
                continue
            try:
                writer, body, start = self._locate(value, key)
            except DecodeError as exc:
                found.refuse(np.array([position]), exc)
                continue
            yield writer, Messages(np.array([position]), [body], [start])

    def _read_share(
        self, writer: WriterSchema, messages: Messages, rows: pa.Table | pa.RecordBatch, found: _Found
    ) -> None:
        """One writer's messages: watermarks record by record, events at once. Whatever a share's
        content provokes beyond the reasons foreseen costs its messages alone: the share is read
        again message by message, and the one that provokes it is ``not-an-event``."""
        if is_watermark(writer):
            found.watermarks.extend(self._watermarks(writer, messages, rows, found))
            return
        try:
            read = self._events.read(writer, messages, rows)
        except Exception as exc:  # the content provoked it; see the module docstring
            if len(messages.bodies) == 1:
                found.refuse(messages.positions, _provoked(exc))
                return
            for one in messages.each():
                self._read_share(writer, one, rows, found)
            return
        found.events.append(read)
        for position, error in read.refused:
            found.refuse(np.array([position]), error)

    def _watermarks(
        self, writer: WriterSchema, messages: Messages, rows: pa.Table | pa.RecordBatch, found: _Found
    ) -> Iterator[WatermarkSeen]:
        taken = rows.take(pa.array(messages.positions))
        kafka = (taken.column(name).to_pylist() for name in ("topic", "partition", "offset", "value"))
        for position, body, start, (topic, partition, offset, value) in zip(
            messages.positions.tolist(),
            messages.bodies,
            messages.starts,
            zip(*kafka, strict=True),
            strict=True,
        ):
            try:
                watermark = Watermark.from_record(read_body(writer, body, start, calendar_numbers=True))
            except DecodeError as exc:
                found.refuse(np.array([position]), exc)
                continue
            except Exception as exc:  # the content provoked it; see the module docstring
                found.refuse(np.array([position]), _provoked(exc))
                continue
            yield WatermarkSeen(topic, partition, offset, watermark, value)

    def _locate(self, value: bytes | None, key: bytes | None) -> tuple[WriterSchema, bytes, int]:
        """A message that is not single-object Avro of a known header: its writer schema, the
        Avro bytes it is read from, and where their body starts."""
        if not value:
            raise DecodeError("empty", "the message has no value (and no key: not a tombstone)")
        if value[:1] == b"{":
            writer, body = self._read_json(value, key)
            return writer, body, HEADER_LENGTH
        if not is_registry_framed(value):
            return self._writer(read_fingerprint(value)), value, HEADER_LENGTH
        schema_id = read_schema_id(value)
        known = self.context.registry_ids.get(schema_id)
        if known is None:
            raise UnknownNameError(
                "unresolved-schema-id",
                f"schema id {schema_id} not resolved for this batch",
                Unknown(schema_id=schema_id),
            )
        if isinstance(known, tuple):
            raise DecodeError(*known)
        return self._writer(known), value, REGISTRY_HEADER_LENGTH

    def _writer(self, fingerprint: int) -> WriterSchema:
        """The writer schema of ``fingerprint``, or DecodeError why its messages are not read."""
        unreadable = self.context.unreadable.get(fingerprint)
        if unreadable is not None:
            raise DecodeError(*unreadable)
        text = self.context.schemas.get(fingerprint)
        if text is None:
            raise UnknownNameError(
                "unknown-fingerprint",
                f"no writer schema with fingerprint {fingerprint:016x}",
                Unknown(fingerprint=fingerprint),
            )
        return parsed_schema(text)

    def _read_json(self, value: bytes, key: bytes | None) -> tuple[WriterSchema, bytes]:
        """A JSON event (a keyed message) or watermark record (no key) → its writer schema and
        the Avro message it stands for, validated against that schema: read like any Avro
        message, it meets the same checks."""
        try:
            document = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise DecodeError("undecodable-json", f"{type(exc).__name__}: {str(exc)[:200]}") from None
        if not isinstance(document, dict):
            raise DecodeError("undecodable-json", "not a JSON object")
        try:
            if key is None:
                writer, ready = WATERMARK_WRITER, avro_watermark(document)
            else:
                table = self._json_version(document)
                writer, ready = self._json_writer(table), avro_event(document, table)
            validate(ready, writer.parsed, raise_errors=True)
        except DecodeError:
            raise
        except (ValueError, TypeError, KeyError, ContractError) as exc:
            raise DecodeError("undecodable-json", f"{type(exc).__name__}: {str(exc)[:200]}") from None
        return writer, encode(writer, ready)

    def _json_version(self, document: Mapping[str, Any]) -> TableSchema:
        named = json_version_name(document)
        version = self.context.json_versions.get(named)
        if version is None:
            detail = f"no table version {named[1][:64]!r} of {named[0][:120]!r} on the schema topic"
            if max(map(len, named)) > MAX_LEARNABLE_NAME:  # no checked version has such a name
                raise DecodeError("unknown-table-version", detail)
            raise UnknownNameError("unknown-table-version", detail, Unknown(table_version=named))
        return version

    def _json_writer(self, table: TableSchema) -> WriterSchema:
        named = (table.table, table.schema_key)
        writer = self._json_writers.get(named)
        if writer is None:  # parsed once per process, not once per task
            writer = self._json_writers[named] = parsed_schema(json.dumps(table.event_schema))
        return writer

    def version(self, writer: WriterSchema, primary_keys: tuple[str, ...]) -> TableVersion:
        """The table version of events of ``writer`` keyed by ``primary_keys``, once per reader;
        DecodeError where they are not change events of a table the sinks can hold."""
        cache_key = (writer.fingerprint, primary_keys)
        version = self._versions.get(cache_key)
        if version is None:
            try:
                version = TableVersion.from_writer(writer, primary_keys)
            except ContractError as exc:
                raise DecodeError("not-an-event", f"decodes, but is not a change event: {exc}") from exc
            check_version(version)
            self._check_key(version)
            self._versions[cache_key] = version
        return version

    def _check_key(self, version: TableVersion) -> None:
        """The key an event names is its table's only if the producer published the key schema
        of that key (TableVersion): one message cannot re-key a table — taken for a table
        dropped and created again, that would empty its replica. Unknown to the batch's context,
        the driver reads the schema topic once more before the reason is final."""
        fingerprint = version.key_fingerprint
        if fingerprint in self.context.schemas and fingerprint not in self.context.unreadable:
            return
        detail = (
            f"primary_keys {list(version.key)!r:.200} of writer schema {version.writer.fingerprint_hex}: "
            f"their key schema {fingerprint:016x} was never published"
        )
        if fingerprint in self.context.unreadable:
            raise DecodeError("unpublished-key", detail)
        raise UnknownNameError("unpublished-key", detail, Unknown(fingerprint=fingerprint))


@dataclass
class _Found:
    """What a read has made so far of ``rows``."""

    rows: pa.Table | pa.RecordBatch
    events: list[EventsRead] = field(default_factory=list)
    watermarks: list[WatermarkSeen] = field(default_factory=list)
    refused: list[tuple[np.ndarray, DecodeError]] = field(default_factory=list)
    tombstones: int = 0

    def refuse(self, positions: np.ndarray, error: DecodeError) -> None:
        self.refused.append((positions, error))

    def batch(self) -> DecodedBatch:
        """The events in their messages' order, the watermarks, and the quarantine rows."""
        events = [event for read in self.events for event in read.events]
        if len(self.events) > 1:
            order = np.argsort(np.concatenate([read.positions for read in self.events]), kind="stable")
            events = [events[i] for i in order.tolist()]
        return DecodedBatch(events, self.watermarks, self._quarantined(), self.tombstones)

    def _quarantined(self) -> list[Quarantined]:
        if not self.refused:
            return []
        positions = np.concatenate([positions for positions, _ in self.refused])
        errors = [error for positions, error in self.refused for _ in range(len(positions))]
        order = np.argsort(positions, kind="stable")
        taken = self.rows.take(pa.array(positions[order]))
        columns = (
            taken.column(name).to_pylist() for name in ("topic", "partition", "offset", "key", "value")
        )
        return [
            Quarantined(
                topic,
                partition,
                offset,
                key,
                value,
                error.reason,
                error.detail[:MAX_DETAIL_CHARS],
                error.unknown if isinstance(error, UnknownNameError) else None,
            )
            for (topic, partition, offset, key, value), error in zip(
                zip(*columns, strict=True), (errors[i] for i in order.tolist()), strict=True
            )
        ]


def _provoked(exc: Exception) -> DecodeError:
    """An exception a message's content provoked beyond the reasons foreseen, as its reason."""
    return DecodeError("not-an-event", f"{type(exc).__name__}: {exc}")


def json_version_name(document: Mapping[str, Any]) -> tuple[str, str]:
    """(table, schema_key) a JSON event names."""
    return str(document.get("object")), str(document.get("schema_key"))
