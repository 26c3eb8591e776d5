"""One table version: its columns, its Avro schemas (event and key) and its ``schema_key``.

A table version is identified by the change record's ``column_types`` (names, types, key flags,
positions): the same list in both dialects, so one class serves GoogleSQL and PostgreSQL
databases. Schemas are built once per version and reused for every event of that version.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from typing import Any

from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.row_values import RowConverter
from spanner_cdc.schemas.spanner_types import (
    Converter,
    SpannerType,
    avro_type,
    converter,
    json_formatter,
    row_value_kind,
)

_AVRO_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INVALID_NAME_CHARS = re.compile(r"[^A-Za-z0-9_]")
PAYLOAD_TYPE_NAME = "Payload"
#: The message key's record (``avsc/key.avsc``), in the table's namespace like the payload.
KEY_TYPE_NAME = "Key"


@functools.lru_cache(maxsize=4_096)
def table_namespace(table: str) -> str:
    """The Avro namespace of a table's writer schemas, so that every table's named types stay
    distinct (two names differing only in characters Avro names cannot hold share one)."""
    parts = [_INVALID_NAME_CHARS.sub("_", part) or "_" for part in table.split(".")]
    return ".".join(["spanner_cdc", *(p if p[0].isalpha() else f"_{p}" for p in parts)])


@dataclass(frozen=True)
class Column:
    """A column as the change record describes it.

    ``avro_name`` differs from ``name`` only when the Spanner name is not a valid Avro name
    (possible with quoted PostgreSQL-dialect identifiers); the original is kept in the schema as
    the field attribute ``sqlName`` so readers can map back.
    """

    name: str
    type: SpannerType
    is_primary_key: bool
    ordinal_position: int

    @property
    def avro_name(self) -> str:
        if _AVRO_NAME_RE.match(self.name):
            return self.name
        cleaned = _INVALID_NAME_CHARS.sub("_", self.name)
        return cleaned if _AVRO_NAME_RE.match(cleaned) else f"_{cleaned}"


class TableSchema:
    """The contract for one version of one table.

    ``commit_timestamp_columns`` are the columns that accept ``PENDING_COMMIT_TIMESTAMP()``
    (``allow_commit_timestamp`` / ``spanner.commit_timestamp``): the emulator reports their new
    value as 9999-12-31T23:59:59Z, and the record's commit timestamp is what they hold. They are
    a property of the database's table, not of the Avro shape, so they do not change the
    ``schema_key``.
    """

    def __init__(
        self, table: str, columns: Iterable[Column], commit_timestamp_columns: frozenset[str] = frozenset()
    ) -> None:
        self.table = table
        self.commit_timestamp_columns = commit_timestamp_columns
        self.columns: tuple[Column, ...] = tuple(sorted(columns, key=lambda c: c.ordinal_position))
        self._check_names()
        self.key_columns = tuple(c for c in self.columns if c.is_primary_key)
        self.converters: dict[str, Converter] = {
            c.name: converter(c.type, table, c.name) for c in self.columns
        }
        self._avro_types = {c.name: avro_type(c.type, table, c.name) for c in self.columns}
        self._formatters = {c.avro_name: (c.name, json_formatter(c.type)) for c in self.columns}

    @classmethod
    def from_column_types(
        cls,
        table: str,
        column_types: Sequence[Mapping[str, Any]],
        commit_timestamp_columns: frozenset[str] = frozenset(),
    ) -> TableSchema:
        """Build from a data change record's ``column_types`` list."""
        return cls(
            table,
            (
                Column(
                    name=str(entry["name"]),
                    type=SpannerType.from_json(entry["type"]),
                    is_primary_key=bool(entry["is_primary_key"]),
                    ordinal_position=int(entry["ordinal_position"]),
                )
                for entry in column_types
            ),
            commit_timestamp_columns,
        )

    def _check_names(self) -> None:
        seen: dict[str, str] = {}
        for column in self.columns:
            other = seen.setdefault(column.avro_name, column.name)
            if other != column.name:
                raise ContractError(
                    f"table {self.table!r}: columns {other!r} and {column.name!r} both map to "
                    f"the Avro field name {column.avro_name!r}"
                )

    @cached_property
    def schema_key(self) -> str:
        """Hash of names, types, key flags and positions: equal exactly when the shape is."""
        canonical = json.dumps(self.column_shape, separators=(",", ":"), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    @cached_property
    def namespace(self) -> str:
        return table_namespace(self.table)

    def _fields(self, columns: Iterable[Column]) -> list[dict[str, Any]]:
        fields = []
        for column in columns:
            field: dict[str, Any] = {
                "name": column.avro_name,
                "type": ["null", self._avro_types[column.name]],
                "default": None,
            }
            if column.avro_name != column.name:
                field["sqlName"] = column.name
            fields.append(field)
        return fields

    @cached_property
    def payload_schema(self) -> dict[str, Any]:
        """The row: every column, all nullable (partial updates leave columns out)."""
        return {"type": "record", "name": PAYLOAD_TYPE_NAME, "fields": self._fields(self.columns)}

    @cached_property
    def event_schema(self) -> dict[str, Any]:
        """The envelope of ``avsc/envelope.avsc`` with this table's payload type defined in it."""
        schema = load_avsc("envelope.avsc")
        schema["namespace"] = self.namespace
        if not _define_first_reference(schema, PAYLOAD_TYPE_NAME, self.payload_schema):
            raise ContractError("envelope.avsc never references the Payload type")
        return schema

    @cached_property
    def key_schema(self) -> dict[str, Any]:
        """The Kafka message key: the primary-key columns in key order."""
        schema = load_avsc("key.avsc")
        schema["namespace"] = self.namespace
        schema["fields"] = self._fields(self.key_columns)
        return schema

    @cached_property
    def _row_converter(self) -> RowConverter:
        return RowConverter(
            [(c.name, c.avro_name, row_value_kind(c.type), self.converters[c.name]) for c in self.columns],
            self._unknown_column,
        )

    @cached_property
    def convert_row(self) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
        """``convert_row(values)``: change-record JSON values (by column name) → Avro values (by
        field name), each by its column's converter (``schemas.row_values``).

        A name that is not a column of this table version is an error, not a silent drop. The
        compiled converter's own method, called with no Python frame in between: every mod
        converts its keys, new and old values through it."""
        return self._row_converter.convert

    @cached_property
    def convert_columns(self) -> Callable[[Sequence[str], Sequence[Any]], dict[str, Any]]:
        """``convert_columns(names, values)``: :attr:`convert_row` of a row read from a table,
        its column ``names`` and ``values`` side by side (no mapping made per row)."""
        return self._row_converter.convert_columns

    @cached_property
    def key_names(self) -> list[str]:
        """The primary-key columns' names in key order (an event's ``primary_keys``). One list
        per table version, shared by its events: not to be changed."""
        return [c.name for c in self.key_columns]

    @cached_property
    def value_names(self) -> list[str]:
        """The non-key columns' field names, sorted: what an event of a whole row lists as
        changed. One list per table version, shared by its events: not to be changed."""
        return sorted(c.avro_name for c in self.columns if not c.is_primary_key)

    def _unknown_column(self, name: str) -> None:
        raise ContractError(f"table {self.table!r}: value for unknown column {name!r}")

    def json_row(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Avro values (by field name) → change-record JSON values (by column name): the
        inverse of :meth:`convert_row`, for JSON events."""
        out = {}
        for field_name, value in values.items():
            name, format_value = self._formatters[field_name]
            out[name] = format_value(value)
        return out

    @cached_property
    def column_shape(self) -> list[list[Any]]:
        """Names, types, key flags and positions: what ``schema_key`` hashes."""
        return [[c.name, c.type.to_json(), c.is_primary_key, c.ordinal_position] for c in self.columns]

    @cached_property
    def _avro_names(self) -> dict[str, str]:
        return {c.name: c.avro_name for c in self.columns}


class TableVersions:
    """Table versions by (table, ``column_types``): each built once, then found again by
    comparing a record's column list with the lists seen for its table, newest first.

    Every record carries its column list; comparing it with the one list its table version had
    (usually the first) costs a fraction of turning it into a hashable key: its ``repr``, the key
    before, was the largest single step in a profile of the producer's event loop.
    """

    def __init__(self) -> None:
        self._versions: dict[str, list[tuple[list[Mapping[str, Any]], TableSchema]]] = {}

    def get(self, table: str, column_types: Sequence[Mapping[str, Any]]) -> TableSchema | None:
        if not isinstance(column_types, list):  # a tuple would never equal the lists kept
            column_types = list(column_types)
        for seen, schema in self._versions.get(table, ()):
            if seen == column_types:
                return schema
        return None

    def put(self, table: str, column_types: Sequence[Mapping[str, Any]], schema: TableSchema) -> TableSchema:
        self._versions.setdefault(table, []).insert(0, (list(column_types), schema))
        return schema

    def clear(self) -> None:
        self._versions.clear()


def load_avsc(name: str) -> dict[str, Any]:
    """A fresh, mutable copy of one of the shipped ``.avsc`` templates."""
    return copy.deepcopy(_read_avsc(name))


@functools.cache
def _read_avsc(name: str) -> dict[str, Any]:
    text = resources.files("spanner_cdc.schemas").joinpath("avsc", name).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _define_first_reference(node: Any, name: str, definition: dict[str, Any]) -> bool:
    """Replace the first reference to ``name`` (in document order) with its definition.

    Avro requires a named type to be defined before it is referenced; the template references
    ``Payload`` twice (``source_metadata.old_values`` and ``payload``), so the first one carries
    the definition and the later one stays a reference.
    """
    if isinstance(node, dict):
        for key in ("type", "items", "fields"):
            if key not in node:
                continue
            if node[key] == name:
                node[key] = definition
                return True
            if _define_first_reference(node[key], name, definition):
                return True
        return False
    if isinstance(node, list):
        for index, item in enumerate(node):
            if item == name:
                node[index] = definition
                return True
            if _define_first_reference(item, name, definition):
                return True
    return False
