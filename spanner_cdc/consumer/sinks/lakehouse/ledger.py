"""The lakehouse replica's bookkeeping — the consistent cut, the watermarks, the held events,
the stopped tables — in a DuckDB working copy on the driver, made durable in the checkpoint
after every batch.

The SQL replicas keep these in the batch's own database transaction. Delta commits one table at
a time, so here they are written after the batch's tables, under ``<checkpoint-dir>/lakehouse/``:

- ``state/batch-<id>/``: every bookkeeping table but the held events, one Parquet file each,
  and ``_COMMITTED`` last: the state after that batch. A start reads the newest committed one;
  a batch whose state is committed is done (:attr:`Ledger.last_batch`).
- ``held/batch-<id>-newest-<commit micros>.parquet``: the Kafka messages of the events batch
  ``<id>`` held past the cut. A held event leaves only when the cut passes it, so the held
  events are those of the committed batches' files committed after the cut: the files are
  never rewritten, and one wholly behind the cut is deleted.

A batch that did not commit its state is replayed from the state before it, so it computes
exactly what its first attempt did; that attempt's table commits are then skipped by Delta's
transaction identifiers (delta.py).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.sinks.replica.backends import DuckDbBackend
from spanner_cdc.consumer.sinks.replica.cut import PENDING, recorded_cut
from spanner_cdc.consumer.sinks.replica.names import quote
from spanner_cdc.consumer.sinks.replica.stage.rows import MESSAGES_SCHEMA

COMMITTED = "_COMMITTED"
_STATE = re.compile(r"batch-(\d{12})\Z")
_HELD = re.compile(r"batch-(\d{12})-newest-(\d+)\.parquet\Z")


class LedgerBackend(DuckDbBackend):
    """The working copy. What the cut loads into ``cdc$pending`` during a batch is the batch's
    newly held events, kept aside for its ``held/`` file."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.newly_held: list[pa.Table] = []

    def load(self, table: str, rows: pa.Table) -> None:
        super().load(table, rows)
        if table == PENDING:
            self.newly_held.append(rows.select(MESSAGES_SCHEMA.names).cast(MESSAGES_SCHEMA))

    def rows(self, table: str) -> pa.Table:
        """Every row of ``table``, as DuckDB makes them Arrow."""
        relation = self._db.sql(f"SELECT * FROM {quote(table)}")
        assert relation is not None
        return relation.to_arrow_table()


@dataclass(frozen=True)
class _HeldFile:
    batch_id: int
    newest_micros: int
    location: Location


class Ledger:
    def __init__(self, directory: Location, local: Path) -> None:
        """The ledger kept in ``directory``; its working copy in a temporary directory under
        ``local`` (the driver's disk), removed by :meth:`close`."""
        self.directory = directory
        local.mkdir(parents=True, exist_ok=True)
        self._workdir = Path(tempfile.mkdtemp(prefix="ledger-", dir=local))
        self.backend = LedgerBackend(self._workdir / "ledger.duckdb")
        #: The newest batch whose state is committed; None before the first.
        self.last_batch: int | None = None

    def restore(self) -> None:
        """The bookkeeping as of the newest committed batch into the working copy: call once,
        after the tables' owners created them (their rows are inserted by column name)."""
        states = self._states()
        if not states:
            return
        self.last_batch, state = states[-1]
        for file in state.files("*.parquet"):
            with file.open_input() as source:
                rows = pq.read_table(source)
            self.backend.load(file.name.removesuffix(".parquet"), rows)
        cut = recorded_cut(self.backend)
        for held in self._held():
            if held.batch_id <= self.last_batch and (cut is None or held.newest_micros > cut):
                with held.location.open_input() as source:
                    rows = pq.read_table(source)
                if cut is not None:
                    rows = rows.filter(pc.greater(rows.column("commit_micros"), cut))
                self.backend.load(PENDING, rows)
        self.backend.newly_held.clear()

    def begin(self) -> None:
        """A batch starts: nothing it holds yet."""
        self.backend.newly_held.clear()

    def commit(self, batch_id: int) -> None:
        """The batch's state made durable: its held events, then its tables (the marker last);
        then what is no longer needed deleted — earlier states, held files behind the cut. Call
        inside the working copy's transaction, before it commits."""
        held = self.backend.newly_held
        if held:
            rows = pa.concat_tables(held)
            newest = int(pc.max(rows.column("commit_micros")).as_py())
            target = self.directory / "held" / f"batch-{batch_id:012d}-newest-{newest}.parquet"
            _write_parquet(target, rows)
        state = self.directory / "state" / f"batch-{batch_id:012d}"
        state.delete_tree()
        for table in self._tables():
            _write_parquet(state / f"{table}.parquet", self.backend.rows(table))
        (state / COMMITTED).write_bytes(b"")
        self.last_batch = batch_id
        for older_id, older in self._states():
            if older_id < batch_id:
                older.delete_tree()
        cut = recorded_cut(self.backend)
        for file in self._held():
            if cut is not None and file.newest_micros <= cut:
                file.location.delete()

    def close(self) -> None:
        self.backend.close()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def _tables(self) -> list[str]:
        rows = self.backend.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
            "AND table_type = 'BASE TABLE' ORDER BY 1"
        )
        return [str(name) for (name,) in rows if str(name) != PENDING]

    def _states(self) -> list[tuple[int, Location]]:
        """Committed states, oldest first."""
        found = []
        for state in (self.directory / "state").directories("batch-*"):
            named = _STATE.match(state.name)
            if named is not None and (state / COMMITTED).is_file():
                found.append((int(named.group(1)), state))
        return found

    def _held(self) -> list[_HeldFile]:
        found = []
        for file in (self.directory / "held").files("batch-*.parquet"):
            named = _HELD.match(file.name)
            if named is not None:
                found.append(_HeldFile(int(named.group(1)), int(named.group(2)), file))
        return found


def _write_parquet(location: Location, rows: pa.Table) -> None:
    location.write_whole(lambda stream: pq.write_table(rows, stream, compression="zstd"))
