"""Arrow rows into a PostgreSQL table by COPY: what the driver's merge and the tasks that stage
rows (stage/loaded.py) both load with."""

from __future__ import annotations

import io
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pa_csv

from spanner_cdc.consumer.sinks.replica.names import quote, quote_all

#: Rows only; every string quoted ("needed" quotes every value that can hold a quote).
_CSV_OPTIONS = pa_csv.WriteOptions(include_header=False, quoting_style="needed")


def csv_loadable(schema: pa.Schema) -> bool:
    """Can PostgreSQL's CSV COPY read every column as pyarrow's CSV writer renders it? Not
    bytes (PostgreSQL reads them as ``\\x`` hex, which pyarrow does not write) nor arrays (no
    CSV form). Strings are always quoted, so an empty one stays apart from NULL (unquoted,
    empty) and ``\\.`` is never read as the end of the data (tests/integration/test_replica_load.py)."""
    return not any(
        pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_nested(t) for t in schema.types
    )


def copy_rows(cursor: psycopg.Cursor[Any], table: str, rows: pa.Table) -> None:
    """COPY ``rows`` into ``table``: rendered as CSV by pyarrow (C++, no Python per row) when
    every column's type allows it (:func:`csv_loadable`), else row by row through psycopg
    (about half as fast)."""
    names = quote_all(rows.column_names)
    if csv_loadable(rows.schema):
        rendered = io.BytesIO()
        pa_csv.write_csv(rows, rendered, _CSV_OPTIONS)
        with cursor.copy(f"COPY {quote(table)} ({names}) FROM STDIN (FORMAT csv)") as copy:
            copy.write(rendered.getbuffer())
        return
    columns = [column.to_pylist() for column in rows.columns]
    with cursor.copy(f"COPY {quote(table)} ({names}) FROM STDIN") as copy:
        for row in zip(*columns, strict=True):
            copy.write_row(row)
