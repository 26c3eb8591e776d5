"""Parquet files written so that a replayed micro-batch replaces, never adds.

Every file's name is derived from the batch id (and its partition directory), and a file
appears only complete: written to a temporary name, then renamed over any earlier attempt.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

COMPRESSION = "zstd"


def batch_file_name(batch_id: int, part: int | None = None) -> str:
    """``batch-<id>.parquet``, or with ``part`` (the Spark task's partition that wrote it)
    ``batch-<id>-part-<part>.parquet``."""
    suffix = "" if part is None else f"-part-{part:05d}"
    return f"batch-{batch_id:012d}{suffix}.parquet"


def write_atomically(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, temporary, compression=COMPRESSION)
    os.replace(temporary, path)
