"""The quarantine sink: every message that could not be decoded, with its bytes and the reason.

Files under ``<output-dir>/quarantine/``, named by batch id, replaced whole on a replay; nothing
undecodable is ever dropped:

- ``batch-<id>-part-<task>.parquet`` — what a task's gate refused (consumer.tasks): the
  task writes its messages, bytes and all, to ``_staging/batch-<id>/`` and only their
  coordinates and reasons reach the driver, so a flood of garbage costs the driver a narrow row
  per message, not its bytes;
- ``batch-<id>.parquet`` — watermarks the driver refuted against the broker (consumer.decode.driver).

The driver publishes a batch's quarantine after its checks (:meth:`QuarantineSink.publish`):
the staged files are moved into place. As for the changelog, the first batch after a start —
the only one that can be a replay, perhaps split into other tasks — first has whatever an
earlier attempt left removed (:meth:`QuarantineSink.remove_batch`).
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from spanner_cdc.consumer.decode.decoded import Quarantined
from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.sinks.parquet_files import (
    batch_file_name,
    batch_file_patterns,
    staging_dir,
    write_atomically,
)

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
    def __init__(self, root: Location) -> None:
        self.root = root

    def staging(self, batch_id: int) -> Location:
        """Where the tasks of ``batch_id`` stage their quarantined messages
        (``parquet_files.staging_dir``)."""
        return staging_dir(self.root, batch_id)

    def discard_staged(self, batch_id: int) -> None:
        """Remove what tasks staged for ``batch_id`` (an earlier attempt's, or this batch's
        before it learnt a schema and was outlined again)."""
        self.staging(batch_id).delete_tree()

    @staticmethod
    def stage(staging: Location, batch_id: int, part: int, rows: list[Quarantined]) -> None:
        """One task's quarantined messages of the batch, if it had any."""
        if rows:
            write_atomically(staging / batch_file_name(batch_id, part), quarantine_table(rows))

    def publish(self, batch_id: int, refuted: list[Quarantined]) -> None:
        """The batch's quarantine in place: the files its tasks staged, and ``refuted`` (the
        driver's) in ``batch-<id>.parquet``."""
        for file in self.staging(batch_id).files("*.parquet"):
            file.move_to(self.root / file.name)
        self.discard_staged(batch_id)
        if refuted:
            write_atomically(self.root / batch_file_name(batch_id), quarantine_table(refuted))

    def remove_batch(self, batch_id: int) -> None:
        """Every file an earlier attempt of ``batch_id`` may have published (by any task, or whole
        by the driver)."""
        for pattern in batch_file_patterns(batch_id):
            for stale in self.root.files(pattern):
                stale.delete()


def quarantine_table(rows: Iterable[Quarantined]) -> pa.Table:
    listed = list(rows)
    return pa.table(
        {name: [getattr(row, name) for row in listed] for name in QUARANTINE_SCHEMA.names},
        schema=QUARANTINE_SCHEMA,
    )
