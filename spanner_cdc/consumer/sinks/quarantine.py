"""The quarantine sink: every message that could not be decoded, with its bytes and the reason.

One Parquet file per batch that had any (``<output-dir>/quarantine/batch-<id>.parquet``),
replaced whole on a replay; nothing undecodable is ever dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

from spanner_cdc.consumer.decoded import Quarantined
from spanner_cdc.consumer.sinks.contents import BatchContents
from spanner_cdc.consumer.sinks.parquet_files import batch_file_name, write_atomically

QUARANTINE_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("reason", pa.string()),
        ("detail", pa.string()),
    ]
)


class QuarantineSink:
    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, batch_id: int, contents: BatchContents) -> None:
        if contents.quarantined:
            write_atomically(self.root / batch_file_name(batch_id), quarantine_table(contents.quarantined))


def quarantine_table(rows: Iterable[Quarantined]) -> pa.Table:
    listed = list(rows)
    return pa.table(
        {name: [getattr(row, name) for row in listed] for name in QUARANTINE_SCHEMA.names},
        schema=QUARANTINE_SCHEMA,
    )
