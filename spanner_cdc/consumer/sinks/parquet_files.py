"""Parquet files written so that a replayed micro-batch replaces, never adds.

Every file's name is derived from the batch id (and its partition directory), and a file
appears only complete, replacing any earlier attempt's (``Location.write_whole``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from spanner_cdc.consumer.locations import Location

COMPRESSION = "zstd"


def batch_file_name(batch_id: int, part: int | None = None, run: int = 0) -> str:
    """``batch-<id>.parquet``, or with ``part`` (the Spark task's partition that wrote it)
    ``batch-<id>-part-<part>.parquet``; a ``run`` after the first (a task's second file of the
    same table and date: contents.by_table) ``batch-<id>-part-<part>-<run>.parquet``."""
    suffix = "" if part is None else f"-part-{part:05d}" + (f"-{run}" if run else "")
    return f"batch-{batch_id:012d}{suffix}.parquet"


def batch_file_patterns(batch_id: int) -> tuple[str, str]:
    """Glob patterns for every file of ``batch_id``: written whole, and written by any task."""
    whole = batch_file_name(batch_id)
    return whole, whole.replace(".parquet", "-part-*.parquet")


def staging_dir(root: Location, batch_id: int) -> Location:
    """Where tasks stage a batch's files before the driver publishes them: under ``root``, so
    that publishing is a move on the same file system, in a directory starting with ``_``,
    which Spark's, pyarrow's and DuckDB's ``*.parquet`` readers skip."""
    return root / "_staging" / batch_file_name(batch_id).removesuffix(".parquet")


def write_atomically(path: Location, table: pa.Table, plain: Collection[str] = ()) -> None:
    """``table`` as the Parquet file ``path``, whole or not at all, every column
    dictionary-encoded but those named in ``plain`` (Parquet's paths: :func:`leaf_paths`). A
    column whose values all differ is better plain: Parquet builds its dictionary, finds it too
    large and writes the values anyway, so the dictionary cost time and, written for the first
    page, space."""
    dictionary = [leaf for leaf in leaf_paths(table.schema) if leaf not in plain] if plain else True
    path.write_whole(
        lambda stream: pq.write_table(table, stream, compression=COMPRESSION, use_dictionary=dictionary)
    )


def leaf_paths(fields: Iterable[pa.Field], within: str = "") -> Iterator[str]:
    """The path Parquet gives each leaf column of ``fields`` (what ``use_dictionary`` names): a
    struct's field ``struct.field``, a list's items ``list.list.element`` — the nested types the
    sinks write (an ARRAY column, ``source_metadata`` and ``old_values``)."""
    for field in fields:
        path, kind = f"{within}{field.name}", field.type
        if pa.types.is_struct(kind):
            yield from leaf_paths(kind.fields, f"{path}.")
        elif pa.types.is_list(kind):
            yield from leaf_paths([kind.value_field.with_name("element")], f"{path}.list.")
        else:
            yield path
