"""Partition lineage rules and checkpoint arithmetic, without I/O."""

from __future__ import annotations

import asyncio

import pytest

from spanner_cdc.producer.lineage.acks import AckTracker
from spanner_cdc.producer.lineage.partitions import (
    ROOT,
    Partition,
    PartitionScheduler,
    PartitionState,
    shard_of,
)
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
    assert partition.resume_micros == 10  # just after the checkpoint: changes at 9 were delivered


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
    assert {p.token: p.resume_micros for p in restored.resumable()} == {"c": 31, "f": 13}
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


# --- several processes (--group) -------------------------------------------------------------


def tokens_of(shard: int, shards: int, count: int) -> list[str]:
    """``count`` tokens that fall in ``shard``."""
    found = (f"t{i}" for i in range(10_000))
    return [t for t in found if shard_of(t, shards) == shard][:count]


def record(
    token: str, state: PartitionState, checkpoint: int, *children: str, parents: tuple[str, ...] = ()
) -> Partition:
    return Partition(token, parents or (ROOT,), 0, state, checkpoint, checkpoint, children)


def test_a_token_belongs_to_the_same_shard_in_every_process() -> None:
    assert shard_of("some-token", 6) == 2  # CRC-32, not the per-process salted hash()
    assert {shard_of(f"t{i}", 6) for i in range(100)} == set(range(6))


def test_a_process_runs_only_the_tokens_of_its_shards() -> None:
    mine, theirs = tokens_of(0, 2, 1)[0], tokens_of(1, 2, 1)[0]
    scheduler = PartitionScheduler.restored(
        [record(ROOT, PartitionState.FINISHED, 5, mine, theirs), record(mine, PartitionState.CREATED, 0),
         record(theirs, PartitionState.CREATED, 0)], None, shards=2, owned={0},
    )  # fmt: skip
    assert [p.token for p in scheduler.runnable()] == [mine]


def test_another_process_finishing_a_parent_counts_once_its_children_are_known() -> None:
    parent, child = tokens_of(1, 2, 2)
    scheduler = PartitionScheduler.restored([record(parent, PartitionState.RUNNING, 10)], None, 2, {0})
    scheduler.apply_records([record(parent, PartitionState.FINISHED, 20, child)])
    assert scheduler.partitions[parent].state == PartitionState.RUNNING, "finished before its child is known"
    assert scheduler.low_watermark_micros() == 20
    scheduler.apply_records([record(child, PartitionState.CREATED, 19, parents=(parent,))])
    assert scheduler.partitions[parent].state == PartitionState.FINISHED
    assert scheduler.low_watermark_micros() == 19


def test_records_never_move_another_processs_token_back_nor_touch_this_ones() -> None:
    mine, theirs = tokens_of(0, 2, 1)[0], tokens_of(1, 2, 1)[0]
    scheduler = PartitionScheduler.restored(
        [record(mine, PartitionState.RUNNING, 50), record(theirs, PartitionState.RUNNING, 50)], None, 2, {0}
    )
    scheduler.apply_records(
        [record(mine, PartitionState.CREATED, 0), record(theirs, PartitionState.CREATED, 10)]
    )
    assert (scheduler.partitions[theirs].state, scheduler.partitions[theirs].checkpoint_micros) == (
        PartitionState.RUNNING, 50,
    )  # fmt: skip
    assert scheduler.partitions[mine].checkpoint_micros == 50


def test_the_release_waits_for_the_other_processes_checkpoints_strictly_before_a_commit() -> None:
    mine, theirs = tokens_of(0, 2, 1)[0], tokens_of(1, 2, 1)[0]
    scheduler = PartitionScheduler.restored(
        [record(mine, PartitionState.RUNNING, 0), record(theirs, PartitionState.RUNNING, 99)], None, 2, {0}
    )
    scheduler.partitions[mine].watermark_micros = 500
    # A change at 100 may go once the other process published everything before 100: one
    # transaction held at 100 in both would otherwise wait for the other for ever.
    assert scheduler.release_bound_micros() == 100
    assert scheduler.low_watermark_micros() == 99  # what a watermark record may promise


def test_a_shard_taken_over_resumes_from_its_newest_records() -> None:
    token = tokens_of(1, 2, 1)[0]
    scheduler = PartitionScheduler.restored([record(token, PartitionState.RUNNING, 10)], None, 2, {0})
    scheduler.adopt(1, [record(token, PartitionState.RUNNING, 40)])
    assert [(p.token, p.resume_micros) for p in scheduler.resumable()] == [(token, 41)]
    scheduler.hand_back(1)
    assert scheduler.resumable() == []


def test_a_finished_record_names_its_children() -> None:
    scheduler = PartitionScheduler.starting_at(0)
    scheduler.register_children(children(1, ("a", ()), ("b", ())), ROOT)
    root = scheduler.partitions[ROOT]
    assert Partition.from_json(root.to_json()).children == ("a", "b")
    with pytest.raises(ValueError, match="'children'"):
        Partition.from_json({**root.to_json(), "children": None})


def test_a_transaction_s_checkpoint_counts_its_staged_events_as_delivered() -> None:
    """``checkpoint_if_committed``: what a transaction may carry — staged events (the broker has
    them in the open transaction) count as delivered, unstaged ones still bound it; the plain
    checkpoint moves only once they are acknowledged (the transaction committed)."""

    async def scenario() -> None:
        tracker = AckTracker()
        for commit in (10, 10, 20, 30):
            tracker.sent(commit)
        tracker.staged(10)
        tracker.staged(10)
        tracker.staged(20)
        assert tracker.checkpoint(100) == 9
        assert tracker.checkpoint_if_committed(100) == 29
        for commit in (10, 10, 20):
            tracker.acknowledged(commit)
        assert tracker.checkpoint(100) == tracker.checkpoint_if_committed(100) == 29
        tracker.acknowledged(30)  # acknowledged without being staged (not through a transaction)
        assert tracker.checkpoint(100) == tracker.checkpoint_if_committed(100) == 100

    asyncio.run(scenario())


def test_after_a_failed_delivery_staged_events_no_longer_count() -> None:
    """Events staged in a transaction whose commit then failed were not delivered: once the run
    has a failure, the checkpoint a transaction may carry is the acknowledged one (before, a
    shutdown's last checkpoint after a failed flush passed them: 100 here)."""

    async def scenario() -> None:
        tracker = AckTracker()
        for commit in (10, 20):
            tracker.sent(commit)
            tracker.staged(commit)
        assert tracker.checkpoint_if_committed(100) == 100
        tracker.delivery_failed("the commit failed")
        assert tracker.checkpoint_if_committed(100) == tracker.checkpoint(100) == 9

    asyncio.run(scenario())


def test_a_batch_s_events_are_counted_at_once_as_one_at_a_time() -> None:
    """A batch moves the tracker once per commit timestamp with how many of its events have it:
    the same checkpoints as one event at a time, including events acknowledged without being
    staged first."""

    async def scenario() -> None:
        batched, single = AckTracker(), AckTracker()
        batched.sent(10, 3)
        batched.sent(20, 2)
        for commit in (10, 10, 10, 20, 20):
            single.sent(commit)
        batched.staged(10, 2)
        single.staged(10)
        single.staged(10)
        for tracker in (batched, single):
            assert tracker.pending == 5
            assert tracker.checkpoint_if_committed(100) == 9  # one event at 10 still unstaged
        batched.acknowledged(10, 3)
        for _ in range(3):
            single.acknowledged(10)
        for tracker in (batched, single):
            assert tracker.checkpoint(100) == tracker.checkpoint_if_committed(100) == 19
        batched.delivery_failed("the commit failed", 2)
        single.delivery_failed("the commit failed")
        single.delivery_failed("the commit failed")
        for tracker in (batched, single):
            await asyncio.wait_for(tracker.settled(), 1)
            assert tracker.checkpoint(100) == 19

    asyncio.run(scenario())
