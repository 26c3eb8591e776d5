"""A replicated table as streams see it: its columns, key and history companions, from the catalog.

Streams run in another process than the consumer (or in the caller's), so they learn a table's
layout from the database itself: the payload columns are the ones without the ``cdc$`` prefix
(``$`` cannot occur in a Spanner name), the key columns are the payload columns of its
tombstone table ``<table>$deleted``.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

from spanner_cdc.consumer.sinks.replica.backends import SqlBackend, find_table
from spanner_cdc.consumer.sinks.replica.names import (
    NAMES_TABLE,
    REPLICA_PREFIX,
    TOMBSTONE_SUFFIX,
    ReplicaNames,
    TableNames,
    quote,
)


@dataclass(frozen=True)
class ReplicatedTable:
    #: The Spanner table's name, and the replica's tables for it as the catalog spells them.
    source: str
    names: TableNames
    #: Payload columns in the table's order; the key columns among them.
    columns: tuple[str, ...]
    key: tuple[str, ...]
    has_history: bool
    has_inserts: bool

    @property
    def exists(self) -> bool:
        """Has the replica created the table (its first change arrived)?"""
        return bool(self.columns)


def table_columns(backend: SqlBackend, table: str) -> list[str]:
    """``table``'s columns in order, as the database names them; empty when there is no such table."""
    rows = backend.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = ? ORDER BY ordinal_position",
        [table],
    )
    return [str(r[0]) for r in rows]


def replicated_table(backend: SqlBackend, source: str) -> ReplicatedTable:
    """Spanner table ``source`` in the replica (``exists`` is False before its first change)."""
    expected = ReplicaNames.for_dialect(backend.dialect).of(source)
    found = TableNames(
        *(find_table(backend, n) or n for n in astuple(expected))  # DuckDB: any spelling
    )
    columns = tuple(c for c in table_columns(backend, found.table) if not c.startswith(REPLICA_PREFIX))
    key = tuple(c for c in table_columns(backend, found.tombstones) if not c.startswith(REPLICA_PREFIX))
    has_history, has_inserts = (find_table(backend, n) is not None for n in (found.history, found.inserts))
    return ReplicatedTable(source, found, columns, key, has_history, has_inserts)


def replicated_tables(backend: SqlBackend) -> list[str]:
    """The replica's tables that hold a Spanner table (those with a tombstone table)."""
    rows = backend.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
        "AND table_name LIKE ? ORDER BY table_name",
        ["%" + TOMBSTONE_SUFFIX],
    )
    return [str(r[0])[: -len(TOMBSTONE_SUFFIX)] for r in rows]


@dataclass(frozen=True)
class SourceNames:
    """The Spanner names behind one replica table (names.py: the replica may have shortened them)."""

    #: The Spanner table, or tables: DuckDB keeps ``Accounts`` and ``accounts`` as one.
    tables: tuple[str, ...]
    #: Spanner column → replica column, for the columns the replica renamed.
    renamed_columns: dict[str, str]


def source_names(backend: SqlBackend) -> dict[str, SourceNames]:
    """Replica table (by catalog key) → the Spanner names the merge recorded for it; a table
    with no change since the replica kept names (before version 0.3.0) is missing."""
    if find_table(backend, NAMES_TABLE) is None:
        return {}
    catalog_key = ReplicaNames.for_dialect(backend.dialect).catalog_key
    rows = backend.execute(
        f"SELECT source_table, source_column, replica_name FROM {quote(NAMES_TABLE)} "
        "ORDER BY source_table, source_column"
    )
    tables: dict[str, list[str]] = {}
    for source_table, source_column, replica_name in rows:
        if source_column == "":
            tables.setdefault(catalog_key(str(replica_name)), []).append(str(source_table))
    found = {}
    for replica_table, sources in tables.items():
        renamed = {
            str(column): str(name) for table, column, name in rows if column != "" and table in sources
        }
        found[replica_table] = SourceNames(tuple(sources), renamed)
    return found
