"""Rows as they were at one timestamp: a table's, in primary-key order from any key on (a
backfill), those whose commit-timestamp column is at or after a time (``spanner-cdc poll``), or
a few rows by key (``--payload whole-row``, and whether polled rows existed before).

Each read is a single-use read-only transaction at the exact snapshot timestamp, so reading can
stop anywhere (a crash, a stop) and go on later after the last row whose event Kafka
acknowledged: the key is the checkpoint. Spanner's partitioned reads would split one table over
several streams, but their partitions belong to one multi-use read-only transaction: a restart
cannot resume a partition without that transaction, and the emulator invalidates it as soon as
another transaction begins ("Invalid transaction ID. Transaction ID must be >= …", seen with
writes running), so a backfill built on them could neither resume nor be tested with writes
going on. Tables are read in parallel instead (``producer.backfill``).

Rows are asked for undecoded (``lazy_decode``): Spanner's wire values are the very JSON form
change records carry (INT64 and NUMERIC as decimal text, BYTES as base64, TIMESTAMP as RFC 3339,
FLOAT64 as a number or "NaN"), so snapshot rows go through the event builder's converters
unchanged, and a key read back is a key Spanner accepts in a key range as it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

from google.cloud import spanner
from google.cloud.spanner_v1 import KeyRange, KeySet

from spanner_cdc.producer.change_stream_rules import POSTGRESQL
from spanner_cdc.schemas.timestamps import datetime_from_micros

#: Rows handed over per chunk (one worker-thread hand-off, one Kafka poll, one checkpoint step).
ROWS_PER_CHUNK = 500


def json_value(value: Any) -> Any:
    """A Spanner wire value (a protobuf ``Value``) → the change-record JSON form of it."""
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [json_value(item) for item in value.list_value.values]
    if kind == "null_value" or kind is None:
        return None
    return getattr(value, kind)


def table_rows(
    database: Any,
    snapshot_micros: int,
    table: str,
    columns: Sequence[str],
    after_key: Sequence[Any] | None,
) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``table`` at ``snapshot_micros`` whose key follows ``after_key`` (all rows
    when None), as lists of JSON-form values in ``columns`` order, in chunks, in key order
    (blocking: iterate on a worker thread)."""
    keys: Any = (
        KeySet(all_=True)  # type: ignore[no-untyped-call]
        if after_key is None
        else KeySet(ranges=[KeyRange(start_open=list(after_key))])  # type: ignore[no-untyped-call]
    )
    with database.snapshot(read_timestamp=datetime_from_micros(snapshot_micros)) as snapshot:
        results = iter(snapshot.read(table=table, columns=list(columns), keyset=keys, lazy_decode=True))
        while chunk := [tuple(map(json_value, row)) for row in islice(results, ROWS_PER_CHUNK)]:
            yield chunk


def rows_stamped_since(
    database: Any,
    *,
    dialect: str,
    snapshot_micros: int,
    table: str,
    columns: Sequence[str],
    stamp_column: str,
    key: Sequence[str],
    since_micros: int,
) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``table`` at ``snapshot_micros`` whose ``stamp_column`` is at or after
    ``since_micros``, ordered by that column and then the key, in chunks of JSON-form values in
    ``columns`` order (blocking: iterate on a worker thread).

    The condition compares the commit-timestamp column with a constant (a parameter), the form
    Spanner answers from recent data only (its commit-timestamp documentation); ``>=``, not
    ``>``, because commit timestamps are not unique: a transaction committed at the boundary may
    not have been read last time.
    """
    quote = _quote_postgresql if dialect == POSTGRESQL else _quote_googlesql
    parameter = "$1" if dialect == POSTGRESQL else "@since"
    order = ", ".join(quote(name) for name in [stamp_column, *key])
    sql = (
        f"SELECT {', '.join(quote(name) for name in columns)} FROM {quote(table)} "
        f"WHERE {quote(stamp_column)} >= {parameter} ORDER BY {order}"
    )
    name = "p1" if dialect == POSTGRESQL else "since"
    with database.snapshot(read_timestamp=datetime_from_micros(snapshot_micros)) as snapshot:
        results = iter(
            snapshot.execute_sql(
                sql,
                params={name: datetime_from_micros(since_micros)},
                param_types={name: spanner.param_types.TIMESTAMP},
                lazy_decode=True,
            )
        )
        while chunk := [tuple(map(json_value, row)) for row in islice(results, ROWS_PER_CHUNK)]:
            yield chunk


def _quote_googlesql(name: str) -> str:
    """A table or column name as a GoogleSQL identifier (a named schema's parts each quoted)."""
    return ".".join("`" + part.replace("\\", "\\\\").replace("`", "\\`") + "`" for part in name.split("."))


def _quote_postgresql(name: str) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def rows_by_key(
    database: Any, at_micros: int, table: str, columns: Sequence[str], keys: Sequence[Sequence[Any]]
) -> list[list[Any]]:
    """The rows of ``table`` with ``keys`` (JSON-form values, key order) as they were at
    ``at_micros``, JSON-form values in ``columns`` order; rows that did not exist are absent
    (blocking)."""
    wanted: Any = KeySet(keys=[list(key) for key in keys])  # type: ignore[no-untyped-call]
    with database.snapshot(read_timestamp=datetime_from_micros(at_micros)) as snapshot:
        rows = snapshot.read(table=table, columns=list(columns), keyset=wanted, lazy_decode=True)
        return [[json_value(value) for value in row] for row in rows]
