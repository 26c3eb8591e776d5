"""The change of one replicated table between two cuts, as SQL (consumer.sinks.replica.history).

Three modes, after Snowflake and Databend:

- ``standard``: the net change of each row. A row present at the end and not at the start is an
  INSERT; present at the start and not at the end, a DELETE of its image at the start; present
  at both in different versions, a DELETE of the start image and an INSERT of the end image,
  both ``change$is_update``. A row inserted and deleted in between shows nothing.
- ``append_only`` (Databend's meaning): rows inserted in between, in their state at the end; a
  row inserted and deleted in between is gone, changes to older rows are invisible.
- ``insert_only`` (Snowflake's append-only): every insert in between, even of rows since deleted.

Every row carries ``change$action``, ``change$is_update`` and ``change$row_id`` (the changelog's
row id: one per table and key). Rows come ordered by key, a DELETE before the INSERT of its key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spanner_cdc.consumer.decode.change_rows import REPLICA_ROW_ID, ROW_ID, SORT_COLUMNS
from spanner_cdc.consumer.sinks.replica.backends import SqlBackend
from spanner_cdc.consumer.sinks.replica.history import INSERT_CUT, VALID_FROM, VALID_TO
from spanner_cdc.consumer.sinks.replica.names import quote
from spanner_cdc.consumer.streams.tables import ReplicatedTable

ACTION = "change$action"
IS_UPDATE = "change$is_update"
CHANGE_COLUMNS = (ACTION, IS_UPDATE, ROW_ID)
_PRESENT = "cdc$present"


def delta_query(
    backend: SqlBackend, table: ReplicatedTable, mode: str, start: int, end: int
) -> tuple[str, list[Any]]:
    """SQL and parameters: the change of ``table`` after cut ``start`` up to cut ``end``."""
    if mode == "insert_only":
        return _insert_only(table, start, end)
    if mode == "append_only":
        return _append_only(backend, table, start, end)
    return _standard(backend, table, start, end)


def _standard(backend: SqlBackend, table: ReplicatedTable, start: int, end: int) -> tuple[str, list[Any]]:
    before, before_params = _snapshot(table, start)
    after, after_params = _snapshot(table, end)
    same = _same_key(backend, table.key, "a", "b")
    changed = f"a.{quote(VALID_FROM)} IS DISTINCT FROM b.{quote(VALID_FROM)}"
    row_id = quote(REPLICA_ROW_ID)
    sql = (
        f"WITH a AS ({before}), b AS ({after}) "
        f"SELECT {_columns(table, 'b')}, 'INSERT' AS {quote(ACTION)}, "
        f"a.{quote(_PRESENT)} IS NOT NULL AS {quote(IS_UPDATE)}, b.{row_id} AS {quote(ROW_ID)} "
        f"FROM b LEFT JOIN a ON {same} WHERE a.{quote(_PRESENT)} IS NULL OR {changed} "
        "UNION ALL "
        f"SELECT {_columns(table, 'a')}, 'DELETE', b.{quote(_PRESENT)} IS NOT NULL, a.{row_id} "
        f"FROM a LEFT JOIN b ON {same} WHERE b.{quote(_PRESENT)} IS NULL OR {changed}"
    )
    return _ordered(table, sql), [*before_params, *after_params]


def _append_only(backend: SqlBackend, table: ReplicatedTable, start: int, end: int) -> tuple[str, list[Any]]:
    if not table.has_inserts:
        return _nothing(table)
    after, after_params = _snapshot(table, end)
    inserted = (
        f"SELECT 1 FROM {quote(table.names.inserts)} AS i WHERE {_same_key(backend, table.key, 'i', 'b')} "
        f"AND i.{quote(INSERT_CUT)} > ? AND i.{quote(INSERT_CUT)} <= ?"
    )
    sql = (
        f"WITH b AS ({after}) SELECT {_columns(table, 'b')}, 'INSERT' AS {quote(ACTION)}, "
        f"FALSE AS {quote(IS_UPDATE)}, b.{quote(REPLICA_ROW_ID)} AS {quote(ROW_ID)} "
        f"FROM b WHERE EXISTS ({inserted})"
    )
    return _ordered(table, sql), [*after_params, start, end]


def _insert_only(table: ReplicatedTable, start: int, end: int) -> tuple[str, list[Any]]:
    if not table.has_inserts:
        return _nothing(table)
    cut = quote(INSERT_CUT)
    sql = (
        f"SELECT {_columns(table, 'i')}, 'INSERT' AS {quote(ACTION)}, FALSE AS {quote(IS_UPDATE)}, "
        f"i.{quote(REPLICA_ROW_ID)} AS {quote(ROW_ID)} FROM {quote(table.names.inserts)} AS i "
        f"WHERE i.{cut} > ? AND i.{cut} <= ? ORDER BY {', '.join('i.' + quote(c) for c in SORT_COLUMNS)}"
    )
    return sql, [start, end]


def _snapshot(table: ReplicatedTable, at: int) -> tuple[str, list[Any]]:
    """The table's rows at cut ``at``: current versions begun by then, and earlier versions
    that had begun and not yet ended."""
    carried = ", ".join(
        [
            *(quote(c) for c in table.columns),
            quote(REPLICA_ROW_ID),
            quote(VALID_FROM),
            f"1 AS {quote(_PRESENT)}",
        ]
    )
    began = f"coalesce({quote(VALID_FROM)}, -1) <= ?"
    sql = f"SELECT {carried} FROM {quote(table.names.table)} WHERE {began}"
    if not table.has_history:
        return sql, [at]
    history = quote(table.names.history)
    sql += f" UNION ALL SELECT {carried} FROM {history} WHERE {began} AND {quote(VALID_TO)} > ?"
    return sql, [at, at, at]


def _nothing(table: ReplicatedTable) -> tuple[str, list[Any]]:
    sql = (
        f"SELECT {_columns(table, 't')}, 'INSERT' AS {quote(ACTION)}, FALSE AS {quote(IS_UPDATE)}, "
        f"t.{quote(REPLICA_ROW_ID)} AS {quote(ROW_ID)} FROM {quote(table.names.table)} AS t WHERE FALSE"
    )
    return sql, []


def _columns(table: ReplicatedTable, alias: str) -> str:
    return ", ".join(f"{alias}.{quote(c)} AS {quote(c)}" for c in table.columns)


def _same_key(backend: SqlBackend, key: Sequence[str], left: str, right: str) -> str:
    """Same key, NULL the same as NULL (as in Spanner); a table without key columns has one row."""
    same = backend.null_safe_equal
    return " AND ".join(same(f"{left}.{quote(k)}", f"{right}.{quote(k)}") for k in key) or "TRUE"


def _ordered(table: ReplicatedTable, sql: str) -> str:
    order = [*(quote(k) for k in table.key), quote(ACTION)]
    return f"SELECT * FROM ({sql}) AS d ORDER BY {', '.join(order)}"
