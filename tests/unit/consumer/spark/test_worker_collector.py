"""Python's garbage collector in the tasks (consumer.spark.worker_collector): off while a task reads,
whatever PySpark does on the way, and the worker's objects frozen once."""

from __future__ import annotations

import gc
import pickle
from collections.abc import Generator, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.core.broadcast import Broadcast

from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.spark import worker_collector
from spanner_cdc.consumer.spark.worker_collector import collector_paused
from spanner_cdc.consumer.tasks import outline, staged_outline
from tests.unit.consumer.sinks.replica.test_replica_staging import history, kafka_rows


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The collector on and nothing frozen, as in a fresh worker; left so after the test."""
    monkeypatch.setattr(worker_collector, "_frozen", False)
    was_enabled = gc.isenabled()
    gc.unfreeze()
    gc.enable()
    yield
    gc.unfreeze()
    if not was_enabled:
        gc.disable()


@pytest.mark.usefixtures("collector")
def test_an_outline_task_reads_with_the_collector_off_after_its_broadcast_turned_it_on(
    tmp_path: Path,
) -> None:
    """An executor's broadcast (PySpark's own class, as a worker makes it from the file Spark
    wrote) turns the collector on when it loads its value: the task reads it first, then pauses."""
    running = TaskContext._getOrCreate()  # what a Python worker sets for its task
    running._partitionId = 3
    decoder, events = history(30)
    context = decoder.start_batch()
    stored = tmp_path / "broadcast"
    stored.write_bytes(pickle.dumps(context, protocol=pickle.HIGHEST_PROTOCOL))
    task = outline(
        Broadcast(path=str(stored)),
        context.now_micros,
        0,
        outlines=Location.local(tmp_path / "outlines"),
        staging=None,
        quarantine=None,
        replica=None,
        replica_messages=False,
        replica_tables=None,
    )

    try:
        staged = task(iter([kafka_rows(events)]))
        assert isinstance(staged, Generator)
        named = pa.Table.from_batches([next(staged)])
        assert not gc.isenabled()
        staged.close()
        assert gc.isenabled()
    finally:
        TaskContext._taskContext = None
    assert named.column("file").to_pylist() == ["part-00003.arrow"]
    assert staged_outline(Location.local(tmp_path / "outlines"), named).num_rows == len(events)


@pytest.mark.usefixtures("collector")
def test_the_first_pause_in_a_process_freezes_what_it_holds_and_later_ones_freeze_nothing() -> None:
    with collector_paused():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        assert not gc.isenabled()
    assert gc.isenabled()
    later = [[n] for n in range(1_000)]  # tracked objects made after the first pause
    with collector_paused():
        assert gc.get_freeze_count() <= frozen  # (frozen objects still die by reference counting)
    assert len(later) == 1_000
