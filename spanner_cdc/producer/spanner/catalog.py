"""Table shapes from the database's information schema, to complete partial change records.

With ``NEW_VALUES`` and ``OLD_AND_NEW_VALUES`` a data change record's ``column_types`` lists
only the keys and the columns that changed, so each record would otherwise define its own
narrower Avro schema and ``schema_key``. The payload contract is "every column of the table",
so the producer completes each record's column list from the catalog: one schema per table
version, whatever a mod touched.

The record stays the authority for the columns it lists (types, key flags). When it names a
column the catalog does not know, or types it differently, the catalog is read again (a column
was added or altered mid-stream); a column since dropped keeps the record's description.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spanner_cdc.producer.change_stream_rules import POSTGRESQL
from spanner_cdc.schemas.errors import UnsupportedTypeError
from spanner_cdc.schemas.spanner_types import SpannerType
from spanner_cdc.schemas.table import TableSchema, TableVersions

_LENGTH = re.compile(r"\(\s*(?:\d+|MAX)\s*\)", re.IGNORECASE)
_GOOGLESQL_CODES = {
    "BOOL",
    "INT64",
    "FLOAT32",
    "FLOAT64",
    "NUMERIC",
    "STRING",
    "BYTES",
    "DATE",
    "TIMESTAMP",
    "JSON",
}
_POSTGRES_TYPES = {
    "boolean": SpannerType("BOOL"),
    "bigint": SpannerType("INT64"),
    "real": SpannerType("FLOAT32"),
    "double precision": SpannerType("FLOAT64"),
    "numeric": SpannerType("NUMERIC", "PG_NUMERIC"),
    "character varying": SpannerType("STRING"),
    "text": SpannerType("STRING"),
    "bytea": SpannerType("BYTES"),
    "date": SpannerType("DATE"),
    "timestamp with time zone": SpannerType("TIMESTAMP"),
    "spanner.commit_timestamp": SpannerType("TIMESTAMP"),
    "jsonb": SpannerType("JSON", "PG_JSONB"),
}
#: Catalog-only column types that never appear in change records (search index token lists).
NOT_CAPTURED = ("TOKENLIST", "spanner.tokenlist")


def parse_catalog_type(text: str, dialect: str, table: str, column: str) -> SpannerType:
    """INFORMATION_SCHEMA.COLUMNS.SPANNER_TYPE text → the type change records would report."""
    cleaned = _LENGTH.sub("", text).strip()
    if dialect == POSTGRESQL:
        if cleaned.endswith("[]"):
            return SpannerType("ARRAY", None, parse_catalog_type(cleaned[:-2], dialect, table, column))
        known = _POSTGRES_TYPES.get(cleaned)
    else:
        if cleaned.startswith("ARRAY<") and cleaned.endswith(">"):
            return SpannerType("ARRAY", None, parse_catalog_type(cleaned[6:-1], dialect, table, column))
        code = cleaned.split("<", 1)[0]
        known = SpannerType(code) if code in _GOOGLESQL_CODES | {"PROTO", "ENUM"} else None
    if known is None:
        raise UnsupportedTypeError(table, column, text)
    return known


@dataclass(frozen=True)
class CatalogColumn:
    name: str
    ordinal_position: int
    type: SpannerType | None  # None: a type this project cannot represent (error if ever used)
    type_text: str

    @classmethod
    def parse(
        cls, name: str, ordinal_position: int, type_text: str, dialect: str, table: str
    ) -> CatalogColumn:
        try:
            parsed: SpannerType | None = parse_catalog_type(type_text, dialect, table, name)
        except UnsupportedTypeError:
            parsed = None
        return cls(name, ordinal_position, parsed, type_text)


#: What a catalog read returns: columns by table, and each table's commit-timestamp columns.
CatalogContents = tuple[dict[str, list[CatalogColumn]], dict[str, frozenset[str]]]


@dataclass
class TableCatalog:
    """Columns and commit-timestamp columns per table, refreshed on demand; the table versions
    built from them (one per record shape), dropped when the catalog is read again."""

    dialect: str
    load: Callable[[], CatalogContents]
    columns: dict[str, list[CatalogColumn]] = field(default_factory=dict)
    commit_timestamp_columns: dict[str, frozenset[str]] = field(default_factory=dict)
    _versions: TableVersions = field(default_factory=TableVersions)

    def refresh(self) -> None:
        self.columns, self.commit_timestamp_columns = self.load()
        self._versions.clear()

    def needs_refresh(self, table: str, column_types: Sequence[Mapping[str, Any]]) -> bool:
        """True when the record lists a column the catalog lacks or types differently."""
        known = {c.name: c for c in self.columns.get(table, [])}
        for entry in column_types:
            column = known.get(str(entry["name"]))
            if column is None or column.type != SpannerType.from_json(entry["type"]):
                return True
        return False

    def cached_schema(self, table: str, column_types: Sequence[Mapping[str, Any]]) -> TableSchema | None:
        """The table version for a record shape seen before: one dict lookup on the hot path."""
        return self._versions.get(table, column_types)

    def table_schema(self, table: str, column_types: Sequence[Mapping[str, Any]]) -> TableSchema:
        """The table version of a record: its columns completed from the catalog."""
        schema = self._versions.get(table, column_types)
        if schema is None:
            schema = self._versions.put(
                table,
                column_types,
                TableSchema.from_column_types(
                    table,
                    self.complete(table, column_types),
                    self.commit_timestamp_columns.get(table, frozenset()),
                ),
            )
        return schema

    def complete(self, table: str, column_types: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The record's columns plus every other catalog column of the table, by position."""
        listed = {str(entry["name"]) for entry in column_types}
        completed = [dict(entry) for entry in column_types]
        for column in self.columns.get(table, []):
            if column.name in listed:
                continue
            if column.type is None:
                raise UnsupportedTypeError(table, column.name, column.type_text)
            completed.append(
                {
                    "name": column.name,
                    "type": column.type.to_json(),
                    "is_primary_key": False,
                    "ordinal_position": column.ordinal_position,
                }
            )
        completed.sort(key=lambda entry: int(entry["ordinal_position"]))
        return completed
