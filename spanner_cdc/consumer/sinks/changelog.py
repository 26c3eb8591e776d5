"""The changelog sink: an append-only Parquet dataset, one row per delivered change.

Layout (hive-style, readable by Spark, DuckDB, pyarrow, Trino …)::

    <root>/object=<table>/commit_date=<YYYY-MM-DD>/batch-<batch id>-part-<task>.parquet

Each file is written by the Spark task that read its events (consumer.tasks): one per
table, commit date and task of a batch (two, ``…-part-<task>-1.parquet``, where a table dropped
and created again with other column types has events of both in one task). Rows within a file
are in ``sort_keys`` order. A new table version adds columns to new files only; read with
schema merging (``union_by_name`` in DuckDB, ``mergeSchema`` in Spark).

The tasks stage their files in ``_staging/batch-<id>/`` (the same layout below it) while the
driver deduplicates; when it dropped some events, tasks remove those rows from the staged files
(by their Kafka coordinates, :meth:`ChangelogSink.drop_messages`); then the driver moves the
files into place. A replayed batch writes the same files again (same
batch id, same tasks) and replaces them; if it was split into other tasks than the first
attempt (a changed option), the first attempt's files would stay beside the new ones, so the
consumer removes a batch's files before its first batch after a start
(:meth:`ChangelogSink.remove_batch`) — the only batch that can be a replay.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spanner_cdc.consumer.decode.change_rows import SOURCE_METADATA, TableChanges
from spanner_cdc.consumer.decode.outline_rows import row_numbers
from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.sinks.parquet_files import (
    batch_file_name,
    batch_file_patterns,
    staging_dir,
    write_atomically,
)

#: Where a changelog file is, below the changelog's root.
FILES = "object=*/commit_date=*/*.parquet"
#: The columns naming the Kafka message a changelog row came from.
COORDINATES = ("kafka$topic", "kafka$partition", "kafka$offset")
#: Columns whose values differ from event to event (or from transaction to transaction),
#: written without a dictionary (``parquet_files.write_atomically``): smaller files, and a
#: faster write, than with one.
DISTINCT_PER_EVENT = (
    "envelope$uuid",
    "envelope$source_timestamp",
    "envelope$sort_keys.commit_timestamp_micros",
    "envelope$sort_keys.tx_id",
    f"{SOURCE_METADATA}.commit_timestamp",
    f"{SOURCE_METADATA}.tx_id",
    "kafka$offset",
)


class ChangelogSink:
    def __init__(self, root: Location) -> None:
        self.root = root

    def staging(self, batch_id: int) -> ChangelogSink:
        """Where the tasks write a batch's changelog before the driver knows which events it
        keeps (``parquet_files.staging_dir``)."""
        return ChangelogSink(staging_dir(self.root, batch_id))

    def clear(self) -> None:
        """Remove this (staging) sink's directory and everything in it."""
        self.root.delete_tree()

    def publish(self, staged: ChangelogSink) -> None:
        """Move every file of ``staged`` to the same place under this root, then remove it."""
        for file in staged.files():
            file.move_to(self.root / file.relative_to(staged.root))
        staged.clear()

    def files(self) -> list[Location]:
        """This sink's Parquet files (of a staging sink: the batch's staged files)."""
        return self.root.files(FILES)

    def rows_per_table(self) -> Counter[str]:
        """Rows in this (staging) sink's files, per table, from the files' footers."""
        rows: Counter[str] = Counter()
        for file in self.files():
            with file.open_input() as source:
                count = pq.read_metadata(source).num_rows
            rows[unquote(file.parent.parent.name.removeprefix("object="))] += count
        return rows

    @staticmethod
    def drop_messages(file: Location, messages: pa.Table) -> None:
        """Remove from one staged ``file`` the rows of ``messages`` (``topic``, ``partition``,
        ``offset``): the events deduplication dropped. The file is rewritten only when it held
        one, in its row order, and removed when nothing is left. Arrow's join, not Python per
        row; run by the tasks (consumer.tasks.drop_from_staged)."""
        with file.open_input() as source:
            coordinates = pq.read_table(source, columns=list(COORDINATES))
        kept = row_numbers(coordinates, COORDINATES, messages, named=False)
        if len(kept) == coordinates.num_rows:
            return
        if len(kept) == 0:
            file.delete()
            return
        with file.open_input() as source:
            rows = pq.read_table(source).take(kept)
        write_atomically(file, rows, plain=DISTINCT_PER_EVENT)

    def remove_batch(self, batch_id: int) -> None:
        """Every file an earlier attempt of ``batch_id`` may have written (by any task, or whole
        by the driver, as earlier versions wrote them)."""
        for pattern in batch_file_patterns(batch_id):
            for stale in self.root.files(f"object=*/commit_date=*/{pattern}"):
                stale.delete()

    def write_table(self, batch_id: int, changes: TableChanges, part: int, run: int) -> int:
        """Write one table's changes of one batch, read by task ``part``; returns the rows written.
        ``run`` counts the task's earlier parts of the same table (contents.by_table: other column
        types), each in files of its own."""
        table = changes.changelog()
        commit_dates = pc.cast(
            pc.struct_field(table.column(SOURCE_METADATA), "commit_timestamp"), pa.date32()
        )
        for commit_date in pc.unique(commit_dates).to_pylist():
            rows = table.filter(pc.equal(commit_dates, pa.scalar(commit_date, pa.date32())))
            write_atomically(
                self._path(changes.table, commit_date, batch_id, part, run), rows, plain=DISTINCT_PER_EVENT
            )
        rows_written: int = table.num_rows
        return rows_written

    def table_dir(self, table: str) -> Location:
        return self.root / f"object={quote(table, safe='')}"

    def _path(self, table: str, commit_date: dt.date, batch_id: int, part: int, run: int) -> Location:
        directory = self.table_dir(table) / f"commit_date={commit_date.isoformat()}"
        return directory / batch_file_name(batch_id, part, run)
