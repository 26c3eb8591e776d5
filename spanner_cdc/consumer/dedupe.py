"""Bounded, replay-safe memory of the changes already delivered, for dropping duplicates by uuid.

Duplicates come from what the producer may still send twice (a partition read again after its
last checkpoint could not be written, ``--release-order partition`` after a kill, backfill and
poll rows, other writers of the topic), always with their original uuid *and* their original
commit timestamp. So the memory is keyed by (commit timestamp, uuid) and only needs to reach
back a fixed horizon of commit time behind the newest change seen — never counted later than
the consumer's clock, so one event stamped in the future (the event rules admit up to an hour
ahead) cannot shrink the window for everything else; older entries are pruned. A change older
than the horizon is still delivered (never dropped) and counted as ``beyond_horizon``: the
replica ignores it if it is a duplicate (its sort key is not newer), the changelog may then
hold it twice.

The memory lives in the checkpoint's ``dedupe/`` directory — on a disk or an object store
alike — as one Parquet file per micro-batch, ``batch-<id>-newest-<commit micros>.parquet``,
holding the (commit timestamp, uuid) of the changes the batch delivered; each file appears
whole (``Location.write_whole``), and the newest commit time in its name lets a file wholly
behind the horizon be deleted without reading it. A start reads the files into a DuckDB
database in the driver's local directory, the working copy every batch asks. Spark replays a
batch with the same offsets after a crash; ``fresh`` ignores entries of that batch and later
ones, so the replay makes exactly the decisions the first attempt made, and the batch's file —
written after every sink (consumer.batch) — is what says the batch is done.

Why not Spark's ``dropDuplicatesWithinWatermark``: it drops rows behind the watermark as late,
and with a backlog (one topic read far ahead of another) real, first-time changes fall behind
it. Here nothing is dropped for being late.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from spanner_cdc.consumer.locations import Location
from spanner_cdc.schemas.timestamps import now_micros

#: A batch's file: its id and the newest commit time it delivered (``none`` for no change).
_FILE = re.compile(r"batch-(\d{12})-newest-(none|\d+)\.parquet\Z")
#: The memory as earlier versions kept it: one DuckDB file, read once into batch files.
_EARLIER_FILE = "dedupe.duckdb"
_SCHEMA = pa.schema([("commit_micros", pa.int64()), ("uuid", pa.string()), ("batch_id", pa.int64())])


@dataclass(frozen=True)
class _BatchFile:
    batch_id: int
    newest_micros: int | None
    location: Location

    @classmethod
    def named(cls, location: Location) -> _BatchFile | None:
        found = _FILE.match(location.name)
        if found is None:
            return None
        newest = None if found.group(2) == "none" else int(found.group(2))
        return cls(int(found.group(1)), newest, location)

    @classmethod
    def of(cls, directory: Location, batch_id: int, newest_micros: int | None) -> _BatchFile:
        newest = "none" if newest_micros is None else str(newest_micros)
        return cls(batch_id, newest_micros, directory / f"batch-{batch_id:012d}-newest-{newest}.parquet")


class DeliveredChanges:
    def __init__(self, directory: Location, horizon_micros: int, local: Path) -> None:
        """The memory kept in ``directory``; its working copy goes in a temporary directory
        under ``local`` (the driver's disk), removed by :meth:`close`."""
        self.directory = directory
        self.horizon_micros = horizon_micros
        local.mkdir(parents=True, exist_ok=True)
        self._workdir = Path(tempfile.mkdtemp(prefix="dedupe-", dir=local))
        self._db = duckdb.connect(str(self._workdir / "memory.duckdb"))
        self._sql(
            "CREATE TABLE delivered "
            "(commit_micros BIGINT NOT NULL, uuid VARCHAR NOT NULL, batch_id BIGINT NOT NULL)"
        )
        self._files = {f.batch_id: f for f in self._listed()}
        if not self._files and directory.is_local:
            self._files = {f.batch_id: f for f in self._read_earlier_file()}
        if self._files:
            kept = ds.dataset(
                [f.location.path for f in self._files.values()],
                schema=_SCHEMA,
                format="parquet",
                filesystem=directory.filesystem,
            ).to_table()
            self._db.register("kept", kept)
            try:
                self._sql("INSERT INTO delivered SELECT commit_micros, uuid, batch_id FROM kept")
            finally:
                self._db.unregister("kept")

    def _sql(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """Run and fetch everything: DuckDB refuses new work while a result is unfinished."""
        return self._db.execute(sql, list(params)).fetchall()

    def _listed(self) -> list[_BatchFile]:
        named = (_BatchFile.named(location) for location in self.directory.files("batch-*.parquet"))
        return [f for f in named if f is not None]

    def _read_earlier_file(self) -> list[_BatchFile]:
        """The memory an earlier version kept in one DuckDB file, written as batch files (then
        that file is removed): an upgrade forgets nothing."""
        earlier = Path(self.directory.path) / _EARLIER_FILE
        if not earlier.is_file():
            return []
        with duckdb.connect(str(earlier), read_only=True) as old:
            batches = old.execute("SELECT batch_id, newest_micros FROM batches").fetchall()
            written = []
            for batch_id, newest in batches:
                rows = old.sql(
                    "SELECT commit_micros, uuid, batch_id FROM delivered WHERE batch_id = ?",
                    params=[batch_id],
                ).to_arrow_table()
                written.append(self._write(int(batch_id), None if newest is None else int(newest), rows))
        earlier.unlink()
        return written

    def _write(self, batch_id: int, newest_micros: int | None, rows: pa.Table) -> _BatchFile:
        batch_file = _BatchFile.of(self.directory, batch_id, newest_micros)
        table = rows.cast(_SCHEMA)
        batch_file.location.write_whole(lambda stream: pq.write_table(table, stream, compression="zstd"))
        return batch_file

    def close(self) -> None:
        """Close and let go of the working copy (see ``DuckDbBackend.close``)."""
        self._db.close()
        del self._db
        shutil.rmtree(self._workdir, ignore_errors=True)

    def committed(self, batch_id: int) -> bool:
        """Did a previous attempt of this batch finish (every sink written, memory saved)?"""
        return any(kept >= batch_id for kept in self._files)

    def oldest_remembered(self, batch_id: int) -> int | None:
        """Commit micros before which the memory was pruned, as of the start of ``batch_id``."""
        newest = self._newest(before=batch_id)
        return None if newest is None else newest - self.horizon_micros

    def _newest(self, before: int) -> int | None:
        times = [f.newest_micros for f in self._files.values() if f.batch_id < before]
        return max((t for t in times if t is not None), default=None)

    def fresh(self, batch_id: int, changes: pa.Table) -> pa.ChunkedArray:
        """Per change of ``changes`` (columns ``uuid``, ``commit_micros``): True for the first
        occurrence not delivered by an earlier batch."""
        incoming = changes.select(["uuid", "commit_micros"]).append_column(
            "position", pa.array(range(changes.num_rows), type=pa.int64())
        )
        self._db.register("incoming", incoming)
        try:
            kept = self._db.sql(
                """
                SELECT i.position FROM incoming i
                WHERE i.position = (SELECT min(j.position) FROM incoming j WHERE j.uuid = i.uuid)
                  AND NOT EXISTS (
                    SELECT 1 FROM delivered d
                    WHERE d.commit_micros = i.commit_micros AND d.uuid = i.uuid AND d.batch_id < ?)
                """,
                params=[batch_id],
            ).to_arrow_table()
        finally:
            self._db.unregister("incoming")
        return pc.is_in(incoming.column("position"), value_set=kept.column("position"))

    def remember(self, batch_id: int, delivered: pa.Table) -> None:
        """Record the batch's delivered changes (columns ``uuid``, ``commit_micros``) — its
        file first, which makes it durable — and prune what fell behind the horizon: rows of the
        working copy, and files whose newest change is behind it (the batch's own file stays:
        it answers :meth:`committed` for the next start)."""
        newest = pc.max(delivered.column("commit_micros")).as_py()
        if newest is not None:
            newest = min(newest, now_micros())
        rows = delivered.select(["commit_micros", "uuid"]).append_column(
            "batch_id", pa.array([batch_id] * delivered.num_rows, pa.int64())
        )
        replaced = [f for f in self._files.values() if f.batch_id >= batch_id]
        written = self._write(batch_id, newest, rows)
        for earlier in replaced:
            if earlier.location != written.location:
                earlier.location.delete()
            del self._files[earlier.batch_id]
        self._files[batch_id] = written
        limit = self._newest(before=batch_id + 1)
        self._db.register("batch_delivered", rows)
        try:
            self._sql("BEGIN")
            self._sql("DELETE FROM delivered WHERE batch_id >= ?", [batch_id])
            self._sql("INSERT INTO delivered SELECT commit_micros, uuid, batch_id FROM batch_delivered")
            if limit is not None:
                self._sql("DELETE FROM delivered WHERE commit_micros < ?", [limit - self.horizon_micros])
            self._sql("COMMIT")
        except BaseException:
            self._sql("ROLLBACK")
            raise
        finally:
            self._db.unregister("batch_delivered")
        if limit is not None:
            self._forget_files_before(batch_id, limit - self.horizon_micros)

    def _forget_files_before(self, batch_id: int, oldest_micros: int) -> None:
        behind = [
            f
            for f in self._files.values()
            if f.batch_id < batch_id and (f.newest_micros is None or f.newest_micros < oldest_micros)
        ]
        for forgotten in behind:
            forgotten.location.delete()
            del self._files[forgotten.batch_id]
