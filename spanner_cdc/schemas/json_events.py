"""Events, keys and watermark records as JSON documents (``--format json``).

The same envelope, field for field, as the Avro event; what differs is how values are written:

- column values (``payload``, ``old_values``, the key) by **column name**, in the change
  record's own JSON form — INT64 as decimal text (exact in every JSON reader), FLOAT64 as a
  number or ``"NaN"``/``"Infinity"``/``"-Infinity"``, NUMERIC as decimal text, BYTES as base64,
  DATE as ``YYYY-MM-DD``, TIMESTAMP as RFC 3339 with microseconds, JSON as its text;
- ``read_timestamp`` and ``source_timestamp`` as RFC 3339 with milliseconds (Datastream's
  examples), ``source_metadata.commit_timestamp`` with microseconds; other numbers as numbers.

A reader types column values by the table version the event names (``object`` and
``schema_key``). The producer publishes each table version it writes on the schemas topic
(:func:`version_record`): its columns exactly as ``schema_key`` hashes them, so a reader checks
the hash and cannot be handed another version under a version's key. The inverse functions
(:func:`avro_event`, :func:`avro_watermark`) turn a document back into the Avro record it
stands for, which is how the consumer reads both formats through one path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.events import Event
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.timestamps import format_timestamp_micros, parse_timestamp_micros
from spanner_cdc.schemas.watermark import Watermark

#: Key prefix of table-version records on the schemas topic (writer schemas are keyed by fingerprint).
VERSION_KEY_PREFIX = "version/"
#: The columns a table version may have: Spanner's limit per table.
MAX_VERSION_COLUMNS = 1_024
_SEPARATORS = (",", ":")


def event_document(event: Event) -> bytes:
    """The event as a JSON document."""
    value = event.value
    metadata = dict(value["source_metadata"])
    metadata["commit_timestamp"] = format_timestamp_micros(metadata["commit_timestamp"])
    old_values = metadata["old_values"]
    metadata["old_values"] = None if old_values is None else event.table.json_row(old_values)
    document = {
        **value,
        "read_timestamp": _millis_text(value["read_timestamp"]),
        "source_timestamp": _millis_text(value["source_timestamp"]),
        "source_metadata": metadata,
        "payload": event.table.json_row(value["payload"]),
    }
    return json.dumps(document, separators=_SEPARATORS, allow_nan=False).encode()


def key_document(event: Event) -> bytes:
    """The Kafka key: the primary-key columns by name, in the change record's JSON form."""
    return json.dumps(event.table.json_row(event.key), separators=_SEPARATORS).encode()


def watermark_document(watermark: Watermark, emitted_at_millis: int) -> bytes:
    document = {
        "stream_name": watermark.stream_name,
        "watermark": format_timestamp_micros(watermark.watermark_micros),
        "emitted_at": _millis_text(emitted_at_millis),
        "topics": dict(watermark.topics),
    }
    return json.dumps(document, separators=_SEPARATORS).encode()


def avro_event(document: Mapping[str, Any], table: TableSchema) -> dict[str, Any]:
    """A JSON event → the Avro record it stands for (values in Avro's primitive forms).

    Raises ValueError, TypeError, KeyError or ContractError for a document that is not one:
    the caller quarantines it. The record still has to pass the writer schema's validation."""
    metadata = dict(_object(document["source_metadata"], "source_metadata"))
    metadata["commit_timestamp"] = parse_timestamp_micros(metadata["commit_timestamp"])
    old_values = metadata.get("old_values")
    metadata["old_values"] = (
        None if old_values is None else table.convert_row(_object(old_values, "old_values"))
    )
    return {
        **document,
        "read_timestamp": parse_timestamp_micros(document["read_timestamp"]) // 1000,
        "source_timestamp": parse_timestamp_micros(document["source_timestamp"]) // 1000,
        "source_metadata": metadata,
        "payload": table.convert_row(_object(document["payload"], "payload")),
    }


def avro_watermark(document: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON watermark record → the Avro record it stands for."""
    return {
        "stream_name": document["stream_name"],
        "watermark": parse_timestamp_micros(document["watermark"]),
        "emitted_at": parse_timestamp_micros(document["emitted_at"]) // 1000,
        "topics": _object(document["topics"], "topics"),
    }


def version_record(table: TableSchema) -> tuple[bytes, bytes]:
    """(key, value) of the schemas-topic record that lets JSON readers type ``table``'s events."""
    key = f"{VERSION_KEY_PREFIX}{table.schema_key}/{table.table}"
    value = {"table": table.table, "columns": table.column_shape}
    return key.encode(), json.dumps(value, separators=_SEPARATORS).encode()


def version_from_record(key: str, value: bytes) -> TableSchema:
    """The table version of a :func:`version_record`, checked against the ``schema_key`` and table
    its key names; ContractError (or ValueError, TypeError, KeyError) when it is not one."""
    schema_key, _, table_name = key.removeprefix(VERSION_KEY_PREFIX).partition("/")
    document = json.loads(value)
    if document["table"] != table_name:
        raise ContractError(
            f"a version record under {key[:120]!r} is of table {str(document['table'])[:120]!r}"
        )
    columns = document["columns"]
    if len(columns) > MAX_VERSION_COLUMNS:
        raise ContractError(
            f"a version record of {len(columns):,} columns (Spanner allows {MAX_VERSION_COLUMNS:,})"
        )
    canonical = json.dumps(columns, separators=_SEPARATORS, sort_keys=True)
    if hashlib.sha256(canonical.encode()).hexdigest() != schema_key:
        raise ContractError(f"the columns under {key[:120]!r} do not hash to its schema_key")
    return TableSchema.from_column_types(
        table_name,
        [
            {"name": name, "type": type_, "is_primary_key": is_key, "ordinal_position": position}
            for name, type_, is_key, position in columns
        ],
    )


def _millis_text(millis: int) -> str:
    """RFC 3339 with milliseconds, as Datastream's examples write ``read_timestamp``."""
    return format_timestamp_micros(millis * 1000)[:-4] + "Z"


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} is not a JSON object")
    return value
