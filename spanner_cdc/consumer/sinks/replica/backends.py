"""The two replica databases behind one small interface: run SQL, load Arrow rows, transact.

Everything else (DDL, the merge, the batch marker) is the same SQL for both, in
:mod:`consumer.sinks.replica.merge`. SQL is written with ``?`` placeholders; a ``?`` or ``%``
inside a quoted name is kept as it is (:func:`psycopg_placeholders`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import duckdb
import psycopg
import pyarrow as pa

from spanner_cdc.common.secrets import redact
from spanner_cdc.consumer.errors import ReplicaConnectionError
from spanner_cdc.consumer.sinks.replica.postgres_text import Cleaned, without_nul
from spanner_cdc.consumer.table_version import PayloadColumn

#: A table's copy while DuckDB rebuilds it (:meth:`DuckDbBackend.allow_null_keys`).
REBUILT_TABLE = "cdc$rebuilt"
#: The first PostgreSQL with ``NULLS NOT DISTINCT`` unique indexes (15).
NULLS_NOT_DISTINCT_VERSION = 150_000


class SqlBackend(Protocol):
    dialect: str

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def load(self, table: str, rows: pa.Table) -> None: ...

    def storable(self, rows: pa.Table, columns: Sequence[PayloadColumn]) -> Cleaned:
        """``rows`` with the values this database cannot store in ``columns``' types made storable."""
        ...

    def allow_null_keys(self, table: str, key: Sequence[str]) -> None:
        """Let the key columns hold NULL, one row per key still (NULL equal to NULL, as in Spanner)."""
        ...

    def null_safe_equal(self, left: str, right: str) -> str:
        """SQL: two values are the same, NULL the same as NULL — in a form the database joins fast."""
        ...

    @contextmanager
    def transaction(self) -> Iterator[None]: ...

    def close(self) -> None: ...


def quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def psycopg_placeholders(sql: str) -> str:
    """``?`` placeholders → psycopg's ``%s``; every other ``%`` doubled (psycopg reads ``%``
    everywhere in a query, inside quoted names too). A ``?`` inside a quoted name or a string
    literal is a character, not a placeholder: a PostgreSQL-dialect column may be named ``a?``."""
    out, quote_char = [], ""
    for char in sql:
        if quote_char:
            quote_char = "" if char == quote_char else quote_char
        elif char in "\"'":
            quote_char = char
        elif char == "?":
            out.append("%s")
            continue
        out.append("%%" if char == "%" else char)
    return "".join(out)


class DuckDbBackend:
    dialect = "duckdb"

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = duckdb.connect(str(path))
        except duckdb.Error as exc:
            raise ReplicaConnectionError(f"cannot open the DuckDB replica {path}: {exc}") from None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        # Always fetch: DuckDB refuses new work on a connection while a result is unfinished.
        return self._db.execute(sql, list(params)).fetchall()

    def load(self, table: str, rows: pa.Table) -> None:
        self._db.register("arrow_rows", rows)
        try:
            names = ", ".join(quote(n) for n in rows.column_names)
            self._db.execute(f"INSERT INTO {quote(table)} ({names}) SELECT {names} FROM arrow_rows")
        finally:
            self._db.unregister("arrow_rows")

    def storable(self, rows: pa.Table, columns: Sequence[PayloadColumn]) -> Cleaned:
        return Cleaned(rows, 0)  # DuckDB stores every Spanner string, U+0000 included

    def allow_null_keys(self, table: str, key: Sequence[str]) -> None:
        """DuckDB cannot drop a primary key: the table is copied without it (in the batch's transaction)."""
        rebuilt = quote(REBUILT_TABLE)
        self._db.execute(f"CREATE TABLE {rebuilt} AS SELECT * FROM {quote(table)}")
        self._db.execute(f"DROP TABLE {quote(table)}")
        self._db.execute(f"ALTER TABLE {rebuilt} RENAME TO {quote(table)}")

    def null_safe_equal(self, left: str, right: str) -> str:
        return f"{left} IS NOT DISTINCT FROM {right}"  # a hash join condition in DuckDB

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        """Close and let go of the connection: an object still holding it at interpreter exit
        (Spark keeps the foreachBatch function) would otherwise be reported as leaked."""
        self._db.close()
        del self._db


class PostgresBackend:
    dialect = "postgres"

    def __init__(self, dsn: str) -> None:
        try:
            self._db = psycopg.connect(dsn, connect_timeout=10, autocommit=True)
        except psycopg.ProgrammingError:  # libpq's parse errors quote the string, password and all
            raise ReplicaConnectionError(
                "the PostgreSQL replica's connection string (--postgres-dsn) does not parse; libpq's "
                "message is not shown because it may quote the password"
            ) from None
        except psycopg.Error as exc:
            raise ReplicaConnectionError(
                f"cannot connect to the PostgreSQL replica: {redact(str(exc))}".strip()
            ) from None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._db.cursor() as cursor:
            cursor.execute(psycopg_placeholders(sql), list(params))
            return cursor.fetchall() if cursor.description else []

    def load(self, table: str, rows: pa.Table) -> None:
        names = ", ".join(quote(n) for n in rows.column_names)
        columns = [column.to_pylist() for column in rows.columns]
        with self._db.cursor() as cursor, cursor.copy(f"COPY {quote(table)} ({names}) FROM STDIN") as copy:
            for row in zip(*columns, strict=True):
                copy.write_row(row)

    def storable(self, rows: pa.Table, columns: Sequence[PayloadColumn]) -> Cleaned:
        return without_nul(rows, columns)

    def allow_null_keys(self, table: str, key: Sequence[str]) -> None:
        """The primary key becomes a unique index that takes NULLs as equal (PostgreSQL 15 and
        later; an older server takes them as distinct, and the merge keeps one row per key)."""
        rows = self.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = ?::regclass AND contype = 'p'", [quote(table)]
        )
        for (constraint,) in rows:
            self.execute(f"ALTER TABLE {quote(table)} DROP CONSTRAINT {quote(constraint)}")
        for column in key:
            self.execute(f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(column)} DROP NOT NULL")
        version = int(self.execute("SHOW server_version_num")[0][0])
        nulls = " NULLS NOT DISTINCT" if version >= NULLS_NOT_DISTINCT_VERSION else ""
        columns = ", ".join(quote(k) for k in key)
        self.execute(f"CREATE UNIQUE INDEX ON {quote(table)} ({columns}){nulls}")

    def null_safe_equal(self, left: str, right: str) -> str:
        # IS NOT DISTINCT FROM is neither hashed nor looked up in an index by PostgreSQL (a
        # 300,000-row table: 6.3 s against 26 ms for this form, which uses the index).
        return f"({left} = {right} OR ({left} IS NULL AND {right} IS NULL))"

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._db.transaction():
            yield

    def close(self) -> None:
        self._db.close()
