"""Spanner's table and column names as the replica database can hold them.

Spanner allows names of 128 characters; PostgreSQL keeps the first 63 bytes of an identifier
and silently drops the rest. Two long names that share their first 63 bytes would become one
table (or one column), and a long table name and its tombstone table ``<table>$deleted`` would
be the same table: the replica held deleted keys as rows. So in PostgreSQL every table and
column is named by the name itself when it fits together with the suffix or prefix the replica
adds to it (``$deleted`` for tombstones, ``$history`` and ``$inserts`` for streams, ``set$`` in
the stage), and otherwise by its first
bytes, ``~`` and eight hex digits of its SHA-256 — deterministic (no state to lose or to
replay), different for different names, and still recognisable. ``~`` never occurs in a
Spanner name, so a mapped name cannot be another table's real one. DuckDB has no length limit:
names stay as they are.

DuckDB compares names without regard to the case of ASCII letters, quoted or not. Spanner does
too (a database cannot hold ``Accounts`` and ``accounts`` at once), so two such names are one
table dropped and created again; the DuckDB replica keeps them as one table, as it does when a
table is created again under its old name, and the same for columns. PostgreSQL compares quoted
names exactly: there they stay two tables.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from spanner_cdc.consumer.decode.change_rows import SET_PREFIX

#: The replica's own tables and columns begin with it (``$`` cannot occur in a Spanner name).
REPLICA_PREFIX = "cdc$"
TOMBSTONE_SUFFIX = "$deleted"
#: Earlier row versions and every insert, kept for streams (consumer.sinks.replica.history).
HISTORY_SUFFIX = "$history"
INSERTS_SUFFIX = "$inserts"
#: Spanner name → replica name of every replicated table (column ``''``) and of every column
#: the replica renamed, kept by the merge: a shortened name cannot be turned back, and
#: ``replica status`` shows both.
NAMES_TABLE = "cdc$names"
#: Every companion table's suffix has this length, so one fitted table name serves them all.
_SUFFIX_BYTES = len(TOMBSTONE_SUFFIX)
assert all(len(s) == _SUFFIX_BYTES for s in (HISTORY_SUFFIX, INSERTS_SUFFIX))
#: PostgreSQL's NAMEDATALEN - 1.
POSTGRES_IDENTIFIER_BYTES = 63
_HASH_CHARS = 8


def quote(identifier: str) -> str:
    """``identifier`` as an SQL quoted name (both databases' syntax)."""
    return '"' + identifier.replace('"', '""') + '"'


def quote_all(identifiers: Sequence[str]) -> str:
    """``identifiers`` quoted, comma-separated: a column list."""
    return ", ".join(quote(i) for i in identifiers)


@dataclass(frozen=True)
class TableNames:
    """One replicated table's tables: its rows, tombstones, earlier versions and inserts."""

    table: str
    tombstones: str
    history: str
    inserts: str


@dataclass(frozen=True)
class ReplicaNames:
    #: The longest identifier the database keeps whole, in bytes; None when there is no limit.
    max_bytes: int | None
    #: Does the database take ``Accounts`` and ``accounts`` for one name (DuckDB: ASCII letters)?
    case_insensitive: bool

    @classmethod
    def for_dialect(cls, dialect: str) -> ReplicaNames:
        if dialect == "postgres":
            return cls(POSTGRES_IDENTIFIER_BYTES, case_insensitive=False)
        return cls(None, case_insensitive=True)

    def catalog_key(self, name: str) -> str:
        """``name`` as the database compares names: two names with one key are one table (column)."""
        return name.encode().lower().decode() if self.case_insensitive else name

    def table(self, name: str) -> str:
        return self._fitted(name, _SUFFIX_BYTES)

    def tombstones(self, name: str) -> str:
        """Where the deleted keys of table ``name`` are kept (so a stale insert cannot revive them)."""
        return self.table(name) + TOMBSTONE_SUFFIX

    def history(self, name: str) -> str:
        """Where the earlier versions of table ``name``'s rows are kept, for streams."""
        return self.table(name) + HISTORY_SUFFIX

    def inserts(self, name: str) -> str:
        """Where every insert into table ``name`` is kept, for insert-only streams."""
        return self.table(name) + INSERTS_SUFFIX

    def of(self, name: str) -> TableNames:
        """Every table the replica keeps for Spanner table ``name``."""
        return TableNames(self.table(name), self.tombstones(name), self.history(name), self.inserts(name))

    def column(self, name: str) -> str:
        return self._fitted(name, len(SET_PREFIX))

    def _fitted(self, name: str, reserved: int) -> str:
        if self.max_bytes is None or len(name.encode()) + reserved <= self.max_bytes:
            return name
        budget = self.max_bytes - reserved - 1 - _HASH_CHARS
        head = name.encode()[:budget].decode(errors="ignore")  # never half a character
        return f"{head}~{hashlib.sha256(name.encode()).hexdigest()[:_HASH_CHARS]}"
