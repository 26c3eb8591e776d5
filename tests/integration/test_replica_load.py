"""Loading Arrow rows into the PostgreSQL replica: its CSV COPY (pyarrow renders, PostgreSQL
parses) stores exactly what a row-by-row COPY of the same values (psycopg adapting each Python
value, as the replica loaded before) stores, for every type a stage row can have."""

from __future__ import annotations

import datetime as dt
import decimal
import math
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from spanner_cdc.consumer.sinks.replica.backends import PostgresBackend
from spanner_cdc.consumer.sinks.replica.postgres_copy import csv_loadable
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import fresh_postgres_database

pytestmark = pytest.mark.integration

UTC = dt.UTC
AWKWARD_TEXT = [
    "",
    None,
    'say "hi"',
    "a,b",
    "line\nbreak",
    "a\n\\.\nb",
    "\\.",
    "\\N",
    "NULL",
    "ß ☃ \U0001f600",
]
N = len(AWKWARD_TEXT)
#: Every Arrow type a stage row's columns take (table_version._SCALARS), by SQL type.
COLUMNS: list[tuple[str, str, pa.Array]] = [
    ("text", "TEXT", pa.array(AWKWARD_TEXT, pa.string())),
    ("big", "BIGINT", pa.array([0, -1, 2**63 - 1, -(2**63), None, 5, 6, 7, 8, 9], pa.int64())),
    ("small", "INTEGER", pa.array([0, -1, 2**31 - 1, None, 4, 5, 6, 7, 8, 9], pa.int32())),
    ("flag", "BOOLEAN", pa.array([True, False, None, True, False, True, False, True, False, True])),
    (
        "real",
        "REAL",
        pa.array([0.1, -0.0, math.nan, math.inf, -math.inf, None, 3.4e38, 1e-45, 1.5, 2.5], pa.float32()),
    ),
    (
        "double",
        "DOUBLE PRECISION",
        pa.array(
            [0.1, -0.0, math.nan, math.inf, -math.inf, None, 1.7976931348623157e308, 5e-324, 1 / 3, 2.5]
        ),
    ),
    (
        "amount",
        "NUMERIC(38,9)",
        pa.array(
            [
                decimal.Decimal(v) if v else None
                for v in [
                    "0",
                    "-1.5",
                    "99999999999999999999999999999.999999999",
                    "0.000000001",
                    "",
                    "12",
                    "13",
                    "14",
                    "15",
                    "16",
                ]
            ],
            pa.decimal128(38, 9),
        ),
    ),
    (
        "number",
        "NUMERIC",
        pa.array(["NaN", "1e-30", "-0", None, "123456789012345678901234567890.5", "1", "2", "3", "4", "5"]),
    ),
    ("doc", "JSONB", pa.array(['{"a": [1, "x,y"]}', "null", None, '"\\n"', "[]", "{}", "1", "2", "3", "4"])),
    (
        "id",
        "UUID",
        pa.array(
            ["00000000-0000-0000-0000-000000000001", None, *["123e4567-e89b-12d3-a456-426614174000"] * 8]
        ),
    ),
    ("day", "DATE", pa.array([dt.date(1, 1, 1), dt.date(9999, 12, 31), None, *[dt.date(2026, 11, 26)] * 7])),
    (
        "seen_us",
        "TIMESTAMPTZ",
        pa.array(
            [
                dt.datetime(1, 1, 1, tzinfo=UTC),
                dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                None,
                *[dt.datetime(2026, 11, 26, 1, 2, 3, 456789, tzinfo=UTC)] * 7,
            ],
            pa.timestamp("us", tz="UTC"),
        ),
    ),
    (
        "seen_ms",
        "TIMESTAMPTZ",
        pa.array(
            [
                dt.datetime(2026, 11, 26, 1, 2, 3, 456000, tzinfo=UTC),
                None,
                *[dt.datetime(1970, 1, 1, tzinfo=UTC)] * 8,
            ],
            pa.timestamp("ms", tz="UTC"),
        ),
    ),
]


def test_the_csv_copy_stores_what_the_row_by_row_copy_stores(stack: EmbeddedStack) -> None:
    rows = pa.table({name: values for name, _, values in COLUMNS})
    assert all(len(values) == N for _, _, values in COLUMNS)
    assert csv_loadable(rows.schema)
    assert not csv_loadable(pa.schema([("raw", pa.binary())])) and not csv_loadable(
        pa.schema([("names", pa.list_(pa.string()))])
    )
    dsn = fresh_postgres_database(stack.endpoint("postgres"))
    rows = rows.add_column(0, "n", pa.array(range(N), pa.int32()))
    definitions = ", ".join(f'"{name}" {sql}' for name, sql, _ in COLUMNS)
    names = ", ".join(f'"{name}"' for name in rows.column_names)
    backend = PostgresBackend(dsn)
    try:
        for table in ("by_csv", "by_row"):
            backend.execute(f'CREATE TABLE {table} ("n" INTEGER, {definitions})')
        backend.load("by_csv", rows)
        copy_rows = f"COPY by_row ({names}) FROM STDIN"
        with psycopg.connect(dsn, autocommit=True) as reference, reference.cursor().copy(copy_rows) as copy:
            for row in rows.to_pylist():
                copy.write_row(list(row.values()))
        by_csv_rows, by_row_rows = (
            backend.execute(f"SELECT * FROM {t} ORDER BY n") for t in ("by_csv", "by_row")
        )
    finally:
        backend.close()
    assert [row[1] for row in by_csv_rows] == AWKWARD_TEXT
    assert len(by_csv_rows) == N
    for csv_row, row in zip(by_csv_rows, by_row_rows, strict=True):
        assert [_nan_equal(a) for a in csv_row] == [_nan_equal(b) for b in row]


def _nan_equal(value: Any) -> Any:
    """NaN as a marker, so two NaNs compare equal."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, decimal.Decimal) and value.is_nan():
        return "NaN"
    return value
