"""The changelog sink: an append-only Parquet dataset, one row per delivered change.

Layout (hive-style, readable by Spark, DuckDB, pyarrow, Trino …)::

    <root>/object=<table>/commit_date=<YYYY-MM-DD>/batch-<batch id>.parquet

Rows within a file are in ``sort_keys`` order. A new table version adds columns to new files
only; read with schema merging (``union_by_name`` in DuckDB, ``mergeSchema`` in Spark).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc

from spanner_cdc.consumer.change_rows import TableChanges
from spanner_cdc.consumer.sinks.contents import BatchContents
from spanner_cdc.consumer.sinks.parquet_files import batch_file_name, write_atomically


class ChangelogSink:
    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, batch_id: int, contents: BatchContents) -> None:
        for changes in contents.tables:
            self.write_table(batch_id, changes)

    def write_table(self, batch_id: int, changes: TableChanges) -> int:
        """Write one table's changes of one batch; returns the rows written."""
        table = changes.changelog()
        commit_dates = pc.cast(
            pc.struct_field(table.column("envelope$source_metadata"), "commit_timestamp"), pa.date32()
        )
        for commit_date in pc.unique(commit_dates).to_pylist():
            rows = table.filter(pc.equal(commit_dates, pa.scalar(commit_date, pa.date32())))
            write_atomically(self._path(changes.table, commit_date, batch_id), rows)
        rows_written: int = table.num_rows
        return rows_written

    def table_dir(self, table: str) -> Path:
        return self.root / f"object={quote(table, safe='')}"

    def _path(self, table: str, commit_date: dt.date, batch_id: int) -> Path:
        return self.table_dir(table) / f"commit_date={commit_date.isoformat()}" / batch_file_name(batch_id)
