"""What the consumer needs to know about one writer schema: the table's columns and their types.

The writer schema (published by the producer on ``_spanner-cdc.{prefix}.schemas``) is the only description
of a table version the consumer has; everything typed downstream (the changelog's Arrow
columns, the replica's SQL columns) is derived from its ``payload`` record here, in one place.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import fastavro
import pyarrow as pa

from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.table import KEY_TYPE_NAME
from spanner_cdc.schemas.wire import WriterSchema

SQL_DIALECTS = ("postgres", "duckdb")
#: Writer schemas parsed per process, by their text (a worker serves many batches and queries).
PARSED_SCHEMAS = 4_096
#: Avro type (primitive name or logicalType) → Arrow type and SQL type per dialect.
_SCALARS: dict[str, tuple[pa.DataType, str, str]] = {
    "boolean": (pa.bool_(), "BOOLEAN", "BOOLEAN"),
    "long": (pa.int64(), "BIGINT", "BIGINT"),
    "int": (pa.int32(), "INTEGER", "INTEGER"),
    "float": (pa.float32(), "REAL", "FLOAT"),
    "double": (pa.float64(), "DOUBLE PRECISION", "DOUBLE"),
    "string": (pa.string(), "TEXT", "VARCHAR"),
    "bytes": (pa.binary(), "BYTEA", "BLOB"),
    "decimal": (pa.decimal128(38, 9), "NUMERIC(38,9)", "DECIMAL(38,9)"),
    # PG_NUMERIC: arbitrary precision and NaN; PostgreSQL's NUMERIC holds it, DuckDB's cannot.
    "number": (pa.string(), "NUMERIC", "VARCHAR"),
    "json": (pa.string(), "JSONB", "JSON"),
    "uuid": (pa.string(), "UUID", "UUID"),
    "date": (pa.date32(), "DATE", "DATE"),
    "timestamp-micros": (pa.timestamp("us", tz="UTC"), "TIMESTAMPTZ", "TIMESTAMPTZ"),
    "timestamp-millis": (pa.timestamp("ms", tz="UTC"), "TIMESTAMPTZ", "TIMESTAMPTZ"),
}


@dataclass(frozen=True)
class ColumnType:
    """A non-null Avro type of a payload column, with its Arrow and SQL counterparts."""

    avro: Any

    @cached_property
    def _element(self) -> ColumnType | None:
        if isinstance(self.avro, dict) and self.avro.get("type") == "array":
            return ColumnType(_non_null(self.avro["items"]))
        return None

    @cached_property
    def _scalar(self) -> tuple[pa.DataType, str, str]:
        name = (
            self.avro.get("logicalType") or self.avro.get("type")
            if isinstance(self.avro, dict)
            else self.avro
        )
        found = _SCALARS.get(str(name))
        if found is None:
            raise ContractError(f"no column type for Avro type {self.avro!r}")
        return found

    @property
    def arrow(self) -> pa.DataType:
        element = self._element
        return pa.list_(element.arrow) if element is not None else self._scalar[0]

    def sql(self, dialect: str) -> str:
        element = self._element
        if element is not None:
            return f"{element.sql(dialect)}[]"
        return self._scalar[1 + SQL_DIALECTS.index(dialect)]

    @property
    def text_or_bytes(self) -> TextOrBytes | None:
        """For STRING and BYTES (and arrays of them), the types Spanner changes a column between
        in place: which of the two, and whether an array. None for every other type."""
        element = self._element
        if element is not None:
            inner = element.text_or_bytes
            return None if inner is None else TextOrBytes(inner.is_bytes, is_array=True)
        if self.avro in ("string", "bytes"):
            return TextOrBytes(self.avro == "bytes", is_array=False)
        return None

    def as_bytes(self) -> ColumnType:
        """This STRING type (or array of it) as BYTES: what Spanner's ``ALTER COLUMN`` makes it."""
        element = self._element
        if element is not None:
            return ColumnType({"type": "array", "items": element.as_bytes().avro})
        return ColumnType("bytes")


@dataclass(frozen=True)
class TextOrBytes:
    """A STRING or BYTES column (or an array of them). Spanner's ``ALTER COLUMN`` changes one to
    the other in place; the bytes of a text are its UTF-8 encoding either way."""

    is_bytes: bool
    is_array: bool

    def is_other_of(self, other: TextOrBytes) -> bool:
        """``other`` is the other of text and bytes in the same shape (both scalars or both
        arrays): what Spanner changes a column between."""
        return self.is_array == other.is_array and self.is_bytes != other.is_bytes


@dataclass(frozen=True)
class PayloadColumn:
    """One column: ``name`` as in Spanner (and the sinks), ``field`` as in the Avro payload."""

    name: str
    field: str
    type: ColumnType


class TableVersion:
    """One writer schema of one table: its columns in order and which of them form the key.

    The key an event names (``source_metadata.primary_keys``) is trusted only as far as the
    producer published it: :attr:`key_fingerprint` is the fingerprint of the message-key schema
    the producer publishes beside the event schema for that key (the key columns' payload fields
    in key order, ``avsc/key.avsc`` in the table's namespace), which the consumer requires on the
    schema topic (consumer.decode.gate).
    """

    def __init__(
        self,
        writer: WriterSchema,
        columns: Sequence[PayloadColumn],
        key: Sequence[str],
        namespace: str,
        key_fingerprint: int,
    ) -> None:
        self.writer = writer
        self.columns = tuple(columns)
        self.key = tuple(key)
        #: The writer schema's namespace: schemas.table.table_namespace of the table it describes.
        self.namespace = namespace
        self.key_fingerprint = key_fingerprint

    @classmethod
    def from_writer(cls, writer: WriterSchema, primary_keys: Sequence[str]) -> TableVersion:
        """``primary_keys`` as events name them (Spanner names, in key order)."""
        event, fields = _payload_fields(writer)
        columns = _columns(fields)
        missing = [k for k in primary_keys if k not in fields]
        if missing:
            raise ContractError(
                f"writer schema {writer.fingerprint_hex}: key columns {missing} not in payload"
            )
        namespace = str(event.get("name", "")).rpartition(".")[0]
        key_schema = {
            "type": "record",
            "name": f"{namespace}.{KEY_TYPE_NAME}",
            "fields": [fields[k] for k in primary_keys],
        }
        key_fingerprint = WriterSchema.from_schema(key_schema).fingerprint
        return cls(writer, columns, primary_keys, namespace, key_fingerprint)

    @cached_property
    def fields_by_name(self) -> dict[str, str]:
        """Spanner column name → Avro field name."""
        return {c.name: c.field for c in self.columns}


def payload_columns(writer: WriterSchema) -> tuple[PayloadColumn, ...]:
    """The columns of a writer schema's ``payload`` record, in its order (whatever the key)."""
    return _columns(_payload_fields(writer)[1])


def _columns(fields: dict[str, dict[str, Any]]) -> tuple[PayloadColumn, ...]:
    return tuple(
        PayloadColumn(name, f["name"], ColumnType(_non_null(f["type"]))) for name, f in fields.items()
    )


def _payload_fields(writer: WriterSchema) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The event schema, expanded (the payload record defined in place wherever the schema first
    defined it), and its payload's fields by Spanner name: read once per process and schema,
    for the gate's reader and every table version of it alike (not to be changed)."""
    return _expanded_payload(writer.schema_json, writer.fingerprint_hex)


@functools.lru_cache(maxsize=PARSED_SCHEMAS)
def _expanded_payload(text: str, fingerprint_hex: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    event: Any = fastavro.parse_schema(json.loads(text), expand=True)
    payload = next((f for f in event.get("fields", []) if f.get("name") == "payload"), None)
    if payload is None or not isinstance(payload.get("type"), dict):
        raise ContractError(f"writer schema {fingerprint_hex} has no payload record")
    return event, {f.get("sqlName", f["name"]): f for f in payload["type"]["fields"]}


def merged(table: str, columns: Iterable[PayloadColumn]) -> tuple[PayloadColumn, ...]:
    """``columns`` by name, first seen first. A column Spanner changed between STRING and BYTES
    takes BYTES, whichever came first: every text is bytes (its UTF-8), not every value of
    bytes is a text. Any other change of type raises :class:`ColumnTypeChangeError`."""
    seen: dict[str, PayloadColumn] = {}
    for column in columns:
        known = seen.setdefault(column.name, column)
        if known.type != column.type and known.type.arrow != column.type.arrow:
            seen[column.name] = _wider(table, known, column)
    return tuple(seen.values())


def merged_or_none(table: str, columns: Iterable[PayloadColumn]) -> tuple[PayloadColumn, ...] | None:
    """:func:`merged`, or None where one table cannot hold ``columns``' types (a table dropped
    and created again under its name with other types: consumer.sinks.contents.by_table)."""
    try:
        return merged(table, columns)
    except ColumnTypeChangeError:
        return None


def _wider(table: str, known: PayloadColumn, other: PayloadColumn) -> PayloadColumn:
    kinds = known.type.text_or_bytes, other.type.text_or_bytes
    if kinds[0] is None or kinds[1] is None or not kinds[0].is_other_of(kinds[1]):
        raise ColumnTypeChangeError(table, known.name, known.type.avro, other.type.avro)
    return replace(known, type=other.type) if kinds[1].is_bytes else known


class ColumnTypeChangeError(ContractError):
    """A column whose events have two types the consumer cannot hold in one column (only
    STRING ↔ BYTES can be followed: docs/consumer.md, Guarantees)."""

    def __init__(self, table: str, column: str, first: Any, then: Any) -> None:
        super().__init__(
            f"table {table!r}, column {column!r} changes type from {json.dumps(first)} to "
            f"{json.dumps(then)}; only STRING <-> BYTES is followed (a table dropped and created "
            "again under its key with other types: docs/consumer.md, Guarantees)"
        )


def _non_null(avro: Any) -> Any:
    if isinstance(avro, list):
        rest = [t for t in avro if t != "null"]
        if len(rest) != 1:
            raise ContractError(f"payload columns must be a union of null and one type, got {avro!r}")
        return rest[0]
    return avro
