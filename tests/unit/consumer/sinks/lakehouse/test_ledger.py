"""The Delta replica's ledger: the bookkeeping of the newest committed batch comes back, with the
events held past its cut; an uncommitted batch leaves nothing that counts (sinks.lakehouse.ledger)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.sinks.lakehouse.ledger import Ledger
from spanner_cdc.consumer.sinks.replica.cut import CUT, PENDING, ConsistentCut, recorded_cut
from spanner_cdc.consumer.sinks.replica.names import quote
from spanner_cdc.consumer.sinks.replica.stage.rows import MESSAGES_SCHEMA


def held(*commits: int) -> pa.Table:
    count = len(commits)
    return pa.table(
        {
            "key": [b"k"] * count,
            "value": [b"v%d" % c for c in commits],
            "topic": ["P.T"] * count,
            "partition": [0] * count,
            "offset": list(commits),
            "commit_micros": list(commits),
        },
        schema=MESSAGES_SCHEMA,
    )


def opened(tmp_path: Path) -> Ledger:
    ledger = Ledger(Location.local(tmp_path / "ledger"), tmp_path / "local")
    ConsistentCut(ledger.backend, lambda _: True, 100, dict)  # makes the bookkeeping tables
    ledger.restore()
    return ledger


def batch(ledger: Ledger, batch_id: int, cut: int, holds: pa.Table, *, commit: bool = True) -> None:
    backend = ledger.backend
    with backend.transaction():
        ledger.begin()
        backend.execute(f"DELETE FROM {quote(PENDING)} WHERE commit_micros <= ?", [cut])
        backend.load(PENDING, holds)
        backend.execute(
            f"INSERT INTO {quote(CUT)} VALUES (1, ?, now(), 0, now()) ON CONFLICT (id) "
            "DO UPDATE SET cut_micros = excluded.cut_micros",
            [cut],
        )
        if commit:
            ledger.commit(batch_id)


def pending(ledger: Ledger) -> list[int]:
    return sorted(int(c) for (c,) in ledger.backend.execute(f"SELECT commit_micros FROM {quote(PENDING)}"))


def test_a_start_has_the_newest_committed_batch_and_what_it_held_past_its_cut(tmp_path: Path) -> None:
    ledger = opened(tmp_path)
    batch(ledger, 0, 15, held(20, 30))
    batch(ledger, 1, 25, held(40))
    ledger.close()

    restored = opened(tmp_path)
    assert restored.last_batch == 1
    assert recorded_cut(restored.backend) == 25
    assert pending(restored) == [30, 40]
    states = sorted(p.name for p in (tmp_path / "ledger" / "state").iterdir())
    assert states == ["batch-000000000001"], "an earlier state was kept"


def test_what_a_batch_wrote_before_its_marker_does_not_count(tmp_path: Path) -> None:
    """A batch killed after its held file and its state's tables, before ``_COMMITTED``."""
    ledger = opened(tmp_path)
    batch(ledger, 0, 15, held(20))
    ledger.close()
    root = tmp_path / "ledger"
    pq.write_table(held(50), root / "held" / "batch-000000000001-newest-50.parquet")
    (root / "state" / "batch-000000000001").mkdir()
    pq.write_table(pa.table({"x": [1]}), root / "state" / "batch-000000000001" / "cdc$stopped.parquet")

    restored = opened(tmp_path)
    assert restored.last_batch == 0
    assert pending(restored) == [20]


def test_held_files_wholly_behind_the_cut_are_deleted(tmp_path: Path) -> None:
    ledger = opened(tmp_path)
    batch(ledger, 0, 10, held(20))
    batch(ledger, 1, 25, held(30))
    files = sorted(p.name for p in (tmp_path / "ledger" / "held").iterdir())
    assert files == ["batch-000000000001-newest-30.parquet"]
