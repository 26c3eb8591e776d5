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

The memory is a DuckDB file in the consumer's checkpoint directory, written in one transaction
per micro-batch and tagged with the batch id. Spark replays a batch with the same offsets after
a crash; ``fresh`` ignores entries of that batch and later ones, so the replay makes exactly
the decisions the first attempt made.

Why not Spark's ``dropDuplicatesWithinWatermark``: it drops rows behind the watermark as late,
and with a backlog (one topic read far ahead of another) real, first-time changes fall behind
it. Here nothing is dropped for being late.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from spanner_cdc.schemas.timestamps import now_micros

STATE_FILE = "dedupe.duckdb"
#: Batch records kept: enough to answer ``committed`` for a replay, and the newest commit time.
KEPT_BATCHES = 100


class DeliveredChanges:
    def __init__(self, directory: Path, horizon_micros: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.horizon_micros = horizon_micros
        self._db = duckdb.connect(str(directory / STATE_FILE))
        self._sql(
            "CREATE TABLE IF NOT EXISTS delivered "
            "(commit_micros BIGINT NOT NULL, uuid VARCHAR NOT NULL, batch_id BIGINT NOT NULL)"
        )
        self._sql("CREATE TABLE IF NOT EXISTS batches (batch_id BIGINT NOT NULL, newest_micros BIGINT)")

    def _sql(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """Run and fetch everything: DuckDB refuses new work while a result is unfinished."""
        return self._db.execute(sql, list(params)).fetchall()

    def close(self) -> None:
        """Close and let go of the connection (see ``DuckDbBackend.close``)."""
        self._db.close()
        del self._db

    def committed(self, batch_id: int) -> bool:
        """Did a previous attempt of this batch finish (every sink written, memory saved)?"""
        return bool(self._sql("SELECT 1 FROM batches WHERE batch_id >= ?", [batch_id]))

    def oldest_remembered(self, batch_id: int) -> int | None:
        """Commit micros before which the memory was pruned, as of the start of ``batch_id``."""
        newest = self._sql("SELECT max(newest_micros) FROM batches WHERE batch_id < ?", [batch_id])[0][0]
        return None if newest is None else int(newest) - self.horizon_micros

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
        """Record the batch's delivered changes (columns ``uuid``, ``commit_micros``) and prune
        what fell behind the horizon, atomically."""
        newest = pc.max(delivered.column("commit_micros")).as_py()
        if newest is not None:
            newest = min(newest, now_micros())
        self._db.register("batch_delivered", delivered)
        try:
            self._sql("BEGIN")
            self._sql("DELETE FROM delivered WHERE batch_id >= ?", [batch_id])
            self._sql("DELETE FROM batches WHERE batch_id >= ?", [batch_id])
            self._sql("INSERT INTO delivered SELECT commit_micros, uuid, ? FROM batch_delivered", [batch_id])
            self._sql("INSERT INTO batches VALUES (?, ?)", [batch_id, newest])
            self._sql(
                "DELETE FROM delivered WHERE commit_micros < (SELECT max(newest_micros) FROM batches) - ?",
                [self.horizon_micros],
            )
            self._sql("DELETE FROM batches WHERE batch_id < ?", [batch_id - KEPT_BATCHES])
            self._sql("COMMIT")
        except BaseException:
            self._sql("ROLLBACK")
            raise
        finally:
            self._db.unregister("batch_delivered")
