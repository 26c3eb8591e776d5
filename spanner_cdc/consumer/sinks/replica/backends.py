"""The two replica databases behind one small interface: run SQL, load Arrow rows, transact.

Everything else (DDL, the merge, the batch marker, streams) is the same SQL for both, in
:mod:`consumer.sinks.replica.merge` and :mod:`consumer.streams`, but for the few forms one
database runs far slower than the other: how keys compare NULL to NULL (``null_safe_equal``)
and how a join updates rows (``update_joined``). SQL is written with ``?``
placeholders; a ``?`` or ``%`` inside a quoted name is kept as it is (:func:`psycopg_placeholders`).

DuckDB lets one process open a database file for writing at a time. The consumer opens the
file for each micro-batch and lets go of it after the commit (:meth:`SqlBackend.release`), so
``spanner-cdc stream …`` and ``replica status`` can use it between batches; whoever finds the
file taken waits for it (:data:`DUCKDB_LOCK_WAIT_SECONDS`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import duckdb
import psycopg
import pyarrow as pa

from spanner_cdc.common.secrets import redact
from spanner_cdc.consumer.decode.table_version import PayloadColumn, TextOrBytes
from spanner_cdc.consumer.errors import ReplicaConflictError, ReplicaConnectionError, ReplicaQueryError
from spanner_cdc.consumer.sinks.replica.names import ReplicaNames, quote, quote_all
from spanner_cdc.consumer.sinks.replica.postgres_copy import copy_rows
from spanner_cdc.consumer.sinks.replica.postgres_text import Cleaned, without_nul

#: A table's copy while DuckDB rebuilds it (:meth:`DuckDbBackend.allow_null_keys`, ``retype``).
REBUILT_TABLE = "cdc$rebuilt"
#: An array column's converted values while PostgreSQL changes its type (:meth:`PostgresBackend.retype`).
RETYPED_COLUMN = "cdc$retyped"
#: The rows DuckDB writes anew in place of an UPDATE (:meth:`DuckDbBackend.update_joined`).
UPDATED_ROWS = "cdc$updated"
#: The first PostgreSQL with ``NULLS NOT DISTINCT`` unique indexes (15).
NULLS_NOT_DISTINCT_VERSION = 150_000
#: How long a process waits for another to let go of a DuckDB replica file: longer than any
#: micro-batch or stream command holds it.
DUCKDB_LOCK_WAIT_SECONDS = 120.0
_LOCK_POLL_SECONDS = 0.05
#: (column, SQL expression) pairs of an UPDATE's SET.
Assignments = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class Selected:
    """A query's column names and rows."""

    names: list[str]
    rows: list[tuple[Any, ...]]


class SqlBackend(Protocol):
    dialect: str
    #: Whether a replica table declares its key as a PRIMARY KEY. Without one its key columns are
    #: NOT NULL, and the merge keeps one row per key either way (docs/consumer.md, Replica).
    declares_primary_keys: bool

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql``; its rows, if it returns any. A write that lost to a concurrent
        transaction raises :class:`ReplicaConflictError`, any other refusal
        :class:`ReplicaQueryError`."""
        ...

    def select(self, sql: str, params: Sequence[Any] = ()) -> Selected: ...

    def select_arrow(self, sql: str, params: Sequence[Any], schema: pa.Schema) -> pa.Table:
        """``sql``'s rows as an Arrow table of ``schema`` (its fields in the select's order)."""
        ...

    def load(self, table: str, rows: pa.Table) -> None: ...

    def storable(self, rows: pa.Table, columns: Sequence[PayloadColumn]) -> Cleaned:
        """``rows`` with the values this database cannot store in ``columns``' types made storable."""
        ...

    def allow_null_keys(self, table: str, key: Sequence[str]) -> None:
        """Let the key columns hold NULL, one row per key still (NULL equal to NULL, as in Spanner)."""
        ...

    def recoded(self, value: str, to: TextOrBytes) -> str:
        """SQL: ``value``, a text (or an array of them), as ``to``'s bytes, or the other way round:
        a text's bytes are its UTF-8. Bytes that are not UTF-8 fail the statement."""
        ...

    def retype(self, table: str, column: str, sql_type: str, to: TextOrBytes) -> None:
        """Column ``column`` of ``table`` (text or bytes, or an array of them; a key column too)
        converted with its rows to the other, ``sql_type``, as :meth:`recoded` converts a value.
        Rows deleted earlier are not looked at: a value Spanner no longer holds must not fail it."""
        ...

    def catalog_type(self, sql_type: str) -> str:
        """The name the catalog gives a column declared ``sql_type``, as
        ``stored_columns.catalog_type`` reads it back: what a stored column's type is compared
        with."""
        ...

    def null_safe_equal(self, left: str, right: str) -> str:
        """SQL: two values are the same, NULL the same as NULL — in a form the database joins fast."""
        ...

    def update_joined(
        self, table: str, assignments: Assignments, source: str, match: str, params: Sequence[Any]
    ) -> None:
        """``UPDATE table AS t SET column = expression, … FROM source AS f WHERE match``: each row
        of ``table`` that ``match`` pairs with one row of ``source`` gets the assignments'
        expressions over ``t`` and ``f`` (``params`` fill their ``?``); the other columns keep
        their values."""
        ...

    @contextmanager
    def transaction(self) -> Iterator[None]: ...

    @contextmanager
    def snapshot_transaction(self) -> Iterator[None]:
        """A transaction whose every statement reads the same snapshot (repeatable read)."""
        ...

    def release(self) -> None:
        """Let other processes use the database until the next statement (DuckDB's file lock)."""
        ...

    def close(self) -> None: ...


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


@contextmanager
def _duckdb_errors() -> Iterator[None]:
    try:
        yield
    except duckdb.TransactionException as exc:
        raise ReplicaConflictError(str(exc)) from None
    except duckdb.Error as exc:
        raise ReplicaQueryError(str(exc)) from exc


def find_table(backend: SqlBackend, name: str) -> str | None:
    """The catalog's spelling of table ``name`` (DuckDB compares names without case), or None."""
    names = ReplicaNames.for_dialect(backend.dialect)
    rows = backend.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
        "AND lower(table_name) = lower(?)",
        [name],
    )
    found = [str(r[0]) for r in rows if names.catalog_key(str(r[0])) == names.catalog_key(name)]
    return found[0] if found else None


def open_backend(replica: str, duckdb_path: Path, postgres_dsn: str | None) -> SqlBackend:
    """The replica database ``consume --replica`` writes: a DuckDB file or a PostgreSQL database
    (the options were checked: ``config.require_postgres_dsn``)."""
    if replica == "postgres":
        assert postgres_dsn is not None
        return PostgresBackend(postgres_dsn)
    return DuckDbBackend(duckdb_path)


class DuckDbBackend:
    dialect = "duckdb"
    #: No: maintaining the key's index was most of a batch's commit, more as the replica grows,
    #: and the bench's DuckDB replica ran half as fast again without it.
    declares_primary_keys = False

    def __init__(self, path: Path, lock_wait_seconds: float = DUCKDB_LOCK_WAIT_SECONDS) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.lock_wait_seconds = lock_wait_seconds
        # Opened now: a bad path is reported at start, not at the first batch.
        self._open: duckdb.DuckDBPyConnection | None = self._connect()

    @property
    def _db(self) -> duckdb.DuckDBPyConnection:
        if self._open is None:
            self._open = self._connect()
        return self._open

    def _connect(self) -> duckdb.DuckDBPyConnection:
        """Open the file; while another process has it, wait (up to ``lock_wait_seconds``)."""
        deadline = time.monotonic() + self.lock_wait_seconds
        while True:
            try:
                return duckdb.connect(str(self.path))
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                    raise ReplicaConnectionError(
                        f"cannot open the DuckDB replica {self.path}: {exc}"
                    ) from None
                time.sleep(_LOCK_POLL_SECONDS)
            except duckdb.Error as exc:
                raise ReplicaConnectionError(f"cannot open the DuckDB replica {self.path}: {exc}") from None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        # Always fetch: DuckDB refuses new work on a connection while a result is unfinished.
        with _duckdb_errors():
            return self._db.execute(sql, list(params)).fetchall()

    def select(self, sql: str, params: Sequence[Any] = ()) -> Selected:
        """Through Arrow: DuckDB's own conversion of TIMESTAMPTZ to Python needs pytz."""
        with _duckdb_errors():
            relation = self._db.sql(sql, params=list(params))
            if relation is None:
                return Selected([], [])
            table = relation.to_arrow_table()
        columns = [column.to_pylist() for column in table.columns]
        return Selected(table.column_names, list(zip(*columns, strict=True)))

    def select_arrow(self, sql: str, params: Sequence[Any], schema: pa.Schema) -> pa.Table:
        """DuckDB's own Arrow result: no Python object per row."""
        with _duckdb_errors():
            relation = self._db.sql(sql, params=list(params))
            table = relation.to_arrow_table() if relation is not None else schema.empty_table()
        return table.rename_columns(schema.names).cast(schema)

    def load(self, table: str, rows: pa.Table) -> None:
        self._db.register("arrow_rows", rows)
        try:
            names = quote_all(rows.column_names)
            self._db.execute(f"INSERT INTO {quote(table)} ({names}) SELECT {names} FROM arrow_rows")
        finally:
            self._db.unregister("arrow_rows")

    def storable(self, rows: pa.Table, columns: Sequence[PayloadColumn]) -> Cleaned:
        return Cleaned(rows, 0)  # DuckDB stores every Spanner string, U+0000 included

    def allow_null_keys(self, table: str, key: Sequence[str]) -> None:
        """The table is copied without its constraints (in the batch's transaction): DuckDB cannot
        drop a primary key, and tables an earlier version created have one."""
        self._rebuild(table, "*")

    def null_safe_equal(self, left: str, right: str) -> str:
        return f"{left} IS NOT DISTINCT FROM {right}"  # a hash join condition in DuckDB

    def recoded(self, value: str, to: TextOrBytes) -> str:
        function = "encode" if to.is_bytes else "decode"
        return f"list_transform({value}, lambda e: {function}(e))" if to.is_array else f"{function}({value})"

    def catalog_type(self, sql_type: str) -> str:
        """``typeof`` names a type as the catalog's ``data_type`` does (``TIMESTAMPTZ`` is
        ``TIMESTAMP WITH TIME ZONE`` in both; every type the replica declares, arrays too:
        DuckDB 2.0.1, a scratch script)."""
        return str(self.execute(f"SELECT typeof(CAST(NULL AS {sql_type}))")[0][0]).lower()

    def retype(self, table: str, column: str, sql_type: str, to: TextOrBytes) -> None:
        """The table copied with the column converted, in place of it (in the caller's
        transaction). DuckDB's ``ALTER COLUMN … TYPE`` converts rows deleted earlier too (and
        fails on such a value that is not UTF-8), and neither it nor ``DROP COLUMN`` takes a
        column of a primary key, which tables an earlier version created have. The copy has no
        constraints: its key columns take NULL, as after :meth:`allow_null_keys`."""
        name = quote(column)
        self._rebuild(table, f"* REPLACE ({self.recoded(name, to)} AS {name})")

    def _rebuild(self, table: str, columns: str) -> None:
        """``table`` replaced by a copy of its rows selected as ``columns`` (in the caller's
        transaction): the copy has no constraints."""
        rebuilt = quote(REBUILT_TABLE)
        self.execute(f"CREATE TABLE {rebuilt} AS SELECT {columns} FROM {quote(table)}")
        self.execute(f"DROP TABLE {quote(table)}")
        self.execute(f"ALTER TABLE {rebuilt} RENAME TO {quote(table)}")

    def update_joined(
        self, table: str, assignments: Assignments, source: str, match: str, params: Sequence[Any]
    ) -> None:
        """The rows written anew: the matched rows with the assignments applied (``t.* REPLACE``
        keeps every other column, those of older table versions too) are copied aside, deleted
        and inserted again, in the caller's transaction. DuckDB's UPDATE of rows spread over the
        table is slow, and slower from batch to batch; this way is an order of magnitude faster
        per batch, and the bench's replica transactions take about half the time they took with
        UPDATE."""
        replaced = ", ".join(f"{expression} AS {quote(column)}" for column, expression in assignments)
        updated = quote(UPDATED_ROWS)
        self.execute(
            f"CREATE TEMP TABLE {updated} AS SELECT t.* REPLACE ({replaced}) "
            f"FROM {quote(table)} AS t JOIN {quote(source)} AS f ON {match}",
            params,
        )
        self.execute(f"DELETE FROM {quote(table)} AS t USING {quote(source)} AS f WHERE {match}")
        self.execute(f"INSERT INTO {quote(table)} SELECT * FROM {updated}")
        self.execute(f"DROP TABLE {updated}")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.execute("BEGIN")
        try:
            yield
        except BaseException:
            self.execute("ROLLBACK")
            raise
        self.execute("COMMIT")

    @contextmanager
    def snapshot_transaction(self) -> Iterator[None]:
        with self.transaction():  # DuckDB's transactions always read one snapshot
            yield

    def release(self) -> None:
        self.close()

    def close(self) -> None:
        """Close and let go of the connection: an object still holding it at interpreter exit
        (Spark keeps the foreachBatch function) would otherwise be reported as leaked."""
        if self._open is not None:
            self._open.close()
            self._open = None


class PostgresBackend:
    dialect = "postgres"
    declares_primary_keys = True  # its index is what the merge's joins and deletes look keys up by

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
        return self.select(sql, params).rows

    def select(self, sql: str, params: Sequence[Any] = ()) -> Selected:
        with self._db.cursor() as cursor:
            try:
                cursor.execute(psycopg_placeholders(sql), list(params))
            except psycopg.errors.SerializationFailure as exc:
                raise ReplicaConflictError(str(exc).strip()) from None
            except psycopg.Error as exc:
                raise ReplicaQueryError(redact(str(exc)).strip()) from exc
            if not cursor.description:
                return Selected([], [])
            return Selected([d.name for d in cursor.description], cursor.fetchall())

    def select_arrow(self, sql: str, params: Sequence[Any], schema: pa.Schema) -> pa.Table:
        """psycopg's rows, converted (BYTEA comes as memoryview, which Arrow takes as is)."""
        rows = self.execute(sql, params)
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
        arrays = [pa.array(column, field.type) for column, field in zip(columns, schema, strict=True)]
        return pa.Table.from_arrays(arrays, schema=schema)

    def load(self, table: str, rows: pa.Table) -> None:
        """By COPY, as the tasks that load stage rows do (postgres_copy.py)."""
        with self._db.cursor() as cursor:
            copy_rows(cursor, table, rows)

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
        columns = quote_all(key)
        self.execute(f"CREATE UNIQUE INDEX ON {quote(table)} ({columns}){nulls}")

    def null_safe_equal(self, left: str, right: str) -> str:
        # IS NOT DISTINCT FROM is neither hashed nor looked up in an index by PostgreSQL: on a
        # large table it scans where this form uses the index.
        return f"({left} = {right} OR ({left} IS NULL AND {right} IS NULL))"

    def recoded(self, value: str, to: TextOrBytes) -> str:
        function = "convert_to" if to.is_bytes else "convert_from"
        if not to.is_array:
            return f"{function}({value}, 'UTF8')"
        elements = f"SELECT {function}(e, 'UTF8') FROM unnest({value}) WITH ORDINALITY AS u(e, i) ORDER BY i"
        return f"CASE WHEN {value} IS NULL THEN NULL ELSE ARRAY({elements}) END"

    def catalog_type(self, sql_type: str) -> str:
        """The type's ``pg_type`` name, which the catalog's ``udt_name`` is (``_int8`` for
        ``BIGINT[]``). A type modifier is not part of it: ``NUMERIC(38,9)`` and ``NUMERIC``
        are both ``numeric``."""
        return str(
            self.execute("SELECT typname FROM pg_type WHERE oid = CAST(? AS regtype)", [sql_type])[0][0]
        )

    def retype(self, table: str, column: str, sql_type: str, to: TextOrBytes) -> None:
        """``ALTER COLUMN … TYPE`` (its primary key's index rebuilt), which converts the live rows
        only. Its ``USING`` takes no subquery, which an array's elements need: an array column is
        added anew, filled, and put in place of the old one (it moves to the table's end)."""
        name = quote(column)
        if not to.is_array:
            using = self.recoded(name, to)
            self.execute(f"ALTER TABLE {quote(table)} ALTER COLUMN {name} TYPE {sql_type} USING {using}")
            return
        retyped = quote(RETYPED_COLUMN)
        self.execute(f"ALTER TABLE {quote(table)} ADD COLUMN {retyped} {sql_type}")
        self.execute(f"UPDATE {quote(table)} SET {retyped} = {self.recoded(name, to)}")
        self.execute(f"ALTER TABLE {quote(table)} DROP COLUMN {name}")
        self.execute(f"ALTER TABLE {quote(table)} RENAME COLUMN {retyped} TO {name}")

    def update_joined(
        self, table: str, assignments: Assignments, source: str, match: str, params: Sequence[Any]
    ) -> None:
        sets = ", ".join(f"{quote(column)} = {expression}" for column, expression in assignments)
        self.execute(f"UPDATE {quote(table)} AS t SET {sets} FROM {quote(source)} AS f WHERE {match}", params)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._db.transaction():
            yield

    @contextmanager
    def snapshot_transaction(self) -> Iterator[None]:
        with self._db.transaction():
            self.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            yield

    def release(self) -> None:
        """PostgreSQL serves many connections: nothing to let go of."""

    def close(self) -> None:
        self._db.close()
