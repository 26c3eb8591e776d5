"""Partition lineage rules and checkpoint arithmetic, without I/O."""

from __future__ import annotations

import asyncio

import pytest

from spanner_cdc.producer.acks import AckTracker
from spanner_cdc.producer.partitions import ROOT, Partition, PartitionScheduler, PartitionState
from spanner_cdc.schemas.records import ChildPartition, ChildPartitionsRecord

pytestmark = pytest.mark.unit


def children(start: int, *specs: tuple[str, tuple[str, ...]]) -> ChildPartitionsRecord:
    return ChildPartitionsRecord(start, "00000001", tuple(ChildPartition(t, p) for t, p in specs))


def finish(scheduler: PartitionScheduler, token: str) -> None:
    partition = scheduler.partitions[token]
    scheduler.mark_running(partition)
    scheduler.mark_finished(partition)


def test_root_children_wait_for_the_root_query() -> None:
    scheduler = PartitionScheduler.starting_at(100)
    assert [p.token for p in scheduler.runnable()] == [ROOT]
    added = scheduler.register_children(children(101, ("a", ()), ("b", ())), ROOT)
    assert [p.parents for p in added] == [(ROOT,), (ROOT,)]
    scheduler.mark_running(scheduler.partitions[ROOT])
    assert scheduler.runnable() == []
    scheduler.mark_finished(scheduler.partitions[ROOT])
    assert [p.token for p in scheduler.runnable()] == ["a", "b"]


def test_merged_child_waits_for_every_parent_and_registers_once() -> None:
    scheduler = PartitionScheduler.starting_at(0)
    scheduler.register_children(children(1, ("a", ()), ("b", ())), ROOT)
    finish(scheduler, ROOT)
    merge = children(5, ("m", ("a", "b")))
    assert [p.token for p in scheduler.register_children(merge, "a")] == ["m"]
    finish(scheduler, "a")
    assert "m" not in [p.token for p in scheduler.runnable()], "b has not finished"
    assert scheduler.register_children(merge, "b") == [], "reported again by the other parent"
    finish(scheduler, "b")
    assert [p.token for p in scheduler.runnable()] == ["m"]
    assert scheduler.partitions["m"].parents == ("a", "b")


def test_a_finished_partition_is_never_queried_again() -> None:
    scheduler = PartitionScheduler.starting_at(0)
    finish(scheduler, ROOT)
    with pytest.raises(RuntimeError, match="never queried again"):
        scheduler.mark_running(scheduler.partitions[ROOT])


def test_child_with_unknown_parent_waits_rather_than_runs_early() -> None:
    scheduler = PartitionScheduler.starting_at(0)
    finish(scheduler, ROOT)
    scheduler.register_children(children(3, ("x", ("ghost",))), ROOT)
    assert scheduler.runnable() == []


def test_low_watermark_is_the_minimum_over_unfinished() -> None:
    scheduler = PartitionScheduler.starting_at(10)
    scheduler.register_children(children(20, ("a", ()), ("b", ())), ROOT)
    finish(scheduler, ROOT)
    scheduler.partitions["a"].watermark_micros = 50
    scheduler.partitions["b"].watermark_micros = 30
    assert scheduler.low_watermark_micros() == 30
    finish(scheduler, "b")
    assert scheduler.low_watermark_micros() == 50
    finish(scheduler, "a")
    assert scheduler.low_watermark_micros() is None and scheduler.all_finished()


def test_partition_state_round_trips_through_json() -> None:
    partition = Partition(
        "t", ("p1", "p2"), 5, PartitionState.RUNNING, checkpoint_micros=9, watermark_micros=9
    )
    assert Partition.from_json(partition.to_json()) == partition
    assert partition.resume_micros == 9


def test_a_restored_partition_has_read_nothing_past_its_checkpoint() -> None:
    """A run killed after reading to 12 but with only 9 acknowledged: the next run's low
    watermark starts at 9, so it neither publishes a watermark nor releases held records past
    the changes between 9 and 12 before reading them again (a chaos-run failure: a watermark
    at 12 on Kafka, then a change at 10 after it)."""
    killed = Partition("t", (), 5, PartitionState.RUNNING, checkpoint_micros=9, watermark_micros=12)
    written_by_an_earlier_version = {**killed.to_json(), "watermark_micros": 12}
    for record in (killed.to_json(), written_by_an_earlier_version):
        restored = PartitionScheduler.restored([Partition.from_json(record)], None)
        assert restored.partitions["t"].watermark_micros == 9
        assert restored.low_watermark_micros() == 9
    assert Partition(ROOT, (), 7).query_token is None


def test_a_finished_checkpoint_without_a_recorded_child_runs_again() -> None:
    """A producer finishes a partition only after registering its children, or at the end
    timestamp: a FINISHED record without either is damaged or forged (it would skip the
    partition's remaining changes and all its descendants')."""
    split = Partition("p", (), 5, PartitionState.FINISHED, checkpoint_micros=20)
    child = Partition("c", ("p",), 20, PartitionState.RUNNING, checkpoint_micros=30)
    forged = Partition("f", (), 5, PartitionState.FINISHED, checkpoint_micros=12)
    at_end = Partition("e", (), 5, PartitionState.FINISHED, checkpoint_micros=50)
    restored = PartitionScheduler.restored([split, child, forged, at_end], end_micros=50)
    states = {token: p.state for token, p in restored.partitions.items()}
    assert states == {
        "p": PartitionState.FINISHED,
        "c": PartitionState.RUNNING,
        "f": PartitionState.RUNNING,
        "e": PartitionState.FINISHED,
    }
    assert {p.token: p.resume_micros for p in restored.resumable()} == {"c": 30, "f": 12}
    without_end = PartitionScheduler.restored([Partition.from_json(at_end.to_json())], end_micros=None)
    assert without_end.partitions["e"].state == PartitionState.RUNNING, "no end timestamp: it reads on"


def test_checkpoint_stops_before_the_oldest_unacknowledged_event() -> None:
    async def scenario() -> None:
        tracker = AckTracker()
        assert tracker.checkpoint(100) == 100
        for commit in (10, 10, 20, 30):
            tracker.sent(commit)
        assert tracker.checkpoint(30) == 9
        tracker.acknowledged(10)
        tracker.acknowledged(20)
        assert tracker.checkpoint(30) == 9, "one event at 10 is still pending"
        tracker.acknowledged(10)
        assert tracker.checkpoint(30) == 29
        tracker.acknowledged(30)
        assert tracker.pending == 0 and tracker.checkpoint(40) == 40
        await asyncio.wait_for(tracker.drained(), 1)

    asyncio.run(scenario())


def test_failed_delivery_pins_the_checkpoint() -> None:
    async def scenario() -> None:
        tracker = AckTracker()
        tracker.sent(10)
        tracker.delivery_failed("broker gone")
        await asyncio.wait_for(tracker.drained(), 1)
        assert tracker.failed == "broker gone" and tracker.checkpoint(50) == 9

    asyncio.run(scenario())
