"""The one gate every message passes: Kafka rows → events, watermarks or quarantine rows.

It reads with what the driver knows at the start of a batch (:class:`DecodeContext`: the writer
schemas by fingerprint, the schemas refused and why, the Schema Registry ids resolved, the JSON
table versions) and asks nothing of Kafka, the registry or the broker, so Spark's executors run
it on their share of a batch as well as the driver does. A message that names something the
context does not know yet is quarantined with that name (:class:`UnknownNameError`,
``Quarantined.unknown``); the driver then reads the schema topic or asks the registry once
(consumer.decode.driver) and the batch is read again.

Most messages never reach the record-by-record path below: :meth:`MessageReader.read` lets the
columnar gate (consumer.decode.columnar) take a share's events of a known writer schema in Arrow
columns first, and reads here only what it hands back — every message it does not accept, so
every reason a message is refused is given here.

The line between the two kinds of failure is drawn here, once: everything about one message's
bytes and content is that message's fault (quarantined, the batch goes on) — whatever exception
the content provokes, not only the ones foreseen. Watermarks are decoded here and checked
against the broker's partitions by the driver (consumer.decode.driver.BrokerPartitions).

Timestamps and dates are read as the numbers the message holds (micros, millis or days since
the epoch; ``WriterSchema.column_reader``), not as ``datetime``: every one goes to an Arrow
column, which holds that number.

JSON events (``--format json``, a value that starts with ``{``) name their table version by
``object`` and ``schema_key``; such an event is turned into the Avro record it stands for and
read through the same path, so both formats meet the same checks (schemas.json_events).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from fastavro.validation import validate

from spanner_cdc.consumer.decode.columnar import ColumnarGate
from spanner_cdc.consumer.decode.decoded import (
    DecodedBatch,
    DecodedEvent,
    Quarantined,
    Unknown,
    WatermarkSeen,
)
from spanner_cdc.consumer.decode.rules import MAX_NAME_CHARS, check_event, check_version
from spanner_cdc.consumer.decode.table_version import PARSED_SCHEMAS, TableVersion
from spanner_cdc.schemas.errors import ContractError, DecodeError
from spanner_cdc.schemas.json_events import avro_event, avro_watermark
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import WATERMARK_WRITER, Watermark, is_watermark
from spanner_cdc.schemas.wire import (
    HEADER_LENGTH,
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
        self._columnar = ColumnarGate(context.topics, context.now_micros, self._known_writer, self.version)

    def read(self, rows: pa.Table | pa.RecordBatch) -> DecodedBatch:
        """``rows`` has the Kafka columns key, value, topic, partition and offset. The columnar
        gate takes what it can (consumer.decode.columnar); the rest is read record by record."""
        accepted = self._columnar.read(rows)
        if len(accepted.handed_back) == rows.num_rows:
            return self.read_each(rows)
        rest = self.read_each(rows.take(pa.array(accepted.handed_back, pa.int64())))
        return replace(rest, events=[*accepted.events, *rest.events], outlined=accepted.outlines)

    def read_each(self, rows: pa.Table | pa.RecordBatch) -> DecodedBatch:
        """``rows`` read record by record: the gate every kind of message passes, and the one
        that says why a message is refused."""
        batch = DecodedBatch([], [], [])
        tombstones = 0
        now = self.context.now_micros
        columns = (rows.column(name).to_pylist() for name in ("value", "key", "topic", "partition", "offset"))
        for value, key, topic, partition, offset in zip(*columns, strict=True):
            if value is None and key is not None:
                tombstones += 1
                continue
            try:
                record, writer = self._read(value, key)
                if is_watermark(writer):
                    watermark = Watermark.from_record(record)
                    batch.watermarks.append(WatermarkSeen(topic, partition, offset, watermark, value))
                    continue
                version = self.version(writer, tuple(record["source_metadata"]["primary_keys"]))
                order = check_event(self.context.topics, topic, record, version, now)
            except DecodeError as exc:
                unknown = exc.unknown if isinstance(exc, UnknownNameError) else None
                detail = exc.detail[:MAX_DETAIL_CHARS]
                batch.quarantined.append(
                    Quarantined(topic, partition, offset, key, value, exc.reason, detail, unknown)
                )
                continue
            except Exception as exc:  # the content provoked it; see the module docstring
                detail = f"{type(exc).__name__}: {exc}"[:MAX_DETAIL_CHARS]
                batch.quarantined.append(
                    Quarantined(topic, partition, offset, key, value, "not-an-event", detail)
                )
                continue
            batch.events.append(
                DecodedEvent(topic, partition, offset, key, value, version, record["object"], order, record)
            )
        return replace(batch, tombstones=tombstones)

    def _read(self, value: bytes | None, key: bytes | None) -> tuple[dict[str, Any], WriterSchema]:
        if not value:
            raise DecodeError("empty", "the message has no value (and no key: not a tombstone)")
        if value[:1] == b"{":
            return self._read_json(value, key)
        fingerprint, body_start = self._locate(value)
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
        writer = parsed_schema(text)
        return read_body(writer, value, body_start, calendar_numbers=True), writer

    def _read_json(self, value: bytes, key: bytes | None) -> tuple[dict[str, Any], WriterSchema]:
        """A JSON event (a keyed message) or watermark record (no key) → the Avro record it
        stands for, validated against its writer schema, encoded and read back: the record is
        then exactly what the Avro event would have decoded to."""
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
        return read_body(writer, encode(writer, ready), HEADER_LENGTH, calendar_numbers=True), writer

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

    def _locate(self, value: bytes) -> tuple[int, int]:
        """(the writer schema's fingerprint, where the Avro body starts), whichever way the
        message's header names its schema (schemas.wire)."""
        if not is_registry_framed(value):
            return read_fingerprint(value), HEADER_LENGTH
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
        return known, REGISTRY_HEADER_LENGTH

    def _known_writer(self, fingerprint: int) -> WriterSchema | None:
        """The writer schema of ``fingerprint`` where the context has it and does not refuse it."""
        text = self.context.schemas.get(fingerprint)
        if text is None or fingerprint in self.context.unreadable:
            return None
        return parsed_schema(text)

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


def json_version_name(document: Mapping[str, Any]) -> tuple[str, str]:
    """(table, schema_key) a JSON event names."""
    return str(document.get("object")), str(document.get("schema_key"))
