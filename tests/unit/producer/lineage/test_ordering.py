"""Commit-order release: held records leave in commit order once the watermark passes them."""

from __future__ import annotations

import asyncio

import pytest

from spanner_cdc.producer.changestream.release import CommitOrderRelease
from spanner_cdc.producer.lineage.acks import AckTracker
from spanner_cdc.producer.lineage.low_watermark import advanced_checkpoint
from spanner_cdc.producer.lineage.ordering import CommitOrderBuffer, Held
from spanner_cdc.producer.lineage.partitions import Partition, PartitionScheduler
from spanner_cdc.producer.publish.publisher import EventPublisher
from spanner_cdc.schemas.records import DataChangeRecord
from testkit.records import account_transfer_records

pytestmark = pytest.mark.unit
TEMPLATE = DataChangeRecord.from_json(account_transfer_records()[0])


def record(commit: int, tx: str = "t", sequence: str = "00000000") -> DataChangeRecord:
    return TEMPLATE._replace(
        commit_timestamp_micros=commit, server_transaction_id=tx, record_sequence=sequence
    )


def release(buffer: CommitOrderBuffer, up_to: int | None) -> list[Held]:
    """What the release does: take the next ready record, publish it (here: nothing), let it go."""
    released = []
    while (held := buffer.ready(up_to)) is not None:
        released.append(held)
        buffer.published(held)
    return released


def test_release_in_commit_order_across_partitions_up_to_the_watermark() -> None:
    buffer = CommitOrderBuffer()
    a, b = AckTracker(), AckTracker()
    pa, pb = Partition("a", (), 0), Partition("b", (), 0)
    for commit in (10, 30):
        buffer.hold(record(commit), pa, a)
    for commit in (20, 40):
        buffer.hold(record(commit), pb, b)
    assert buffer.oldest(a) == 10 and buffer.oldest(b) == 20
    released = [(h.record.commit_timestamp_micros, h.partition.token) for h in release(buffer, 30)]
    assert released == [(10, "a"), (20, "b"), (30, "a")]
    assert not buffer.holds(a) and buffer.oldest(b) == 40 and len(buffer) == 1
    assert [h.record.commit_timestamp_micros for h in release(buffer, None)] == [40]


def test_same_timestamp_orders_by_transaction_then_sequence() -> None:
    buffer = CommitOrderBuffer()
    run, partition = AckTracker(), Partition("a", (), 0)
    buffer.hold(record(5, "tx2", "00000000"), partition, run)
    buffer.hold(record(5, "tx1", "00000001"), partition, run)
    buffer.hold(record(5, "tx1", "00000000"), partition, run)
    order = [(h.record.server_transaction_id, h.record.record_sequence) for h in release(buffer, 5)]
    assert order == [("tx1", "00000000"), ("tx1", "00000001"), ("tx2", "00000000")]


def test_discarding_an_abandoned_run_keeps_the_others() -> None:
    buffer = CommitOrderBuffer()
    old, other = AckTracker(), AckTracker()
    buffer.hold(record(1), Partition("a", (), 0), old)
    buffer.hold(record(2), Partition("b", (), 0), other)
    buffer.discard(old)
    assert not buffer.holds(old) and [h.tracker for h in release(buffer, None)] == [other]


def test_a_record_being_published_stays_held_until_its_events_are_counted() -> None:
    """Publishing awaits (a catalog read, a new table's schema acknowledged); a checkpoint or a
    finish taken meanwhile must not pass the record (seen: a producer killed in that window had
    checkpointed past a change it never sent)."""
    buffer = CommitOrderBuffer()
    tracker, partition = AckTracker(), Partition("a", (), 0)
    buffer.hold(record(10), partition, tracker)
    buffer.hold(record(20), partition, tracker)
    partition.watermark_micros = 30
    held = buffer.ready(30)
    assert held is not None and held.record.commit_timestamp_micros == 10
    assert buffer.holds(tracker) and buffer.oldest(tracker) == 10 and buffer.next_commit() == 10
    assert advanced_checkpoint(partition, tracker, buffer.oldest(tracker)) == 9
    tracker.sent(10)  # what the publisher does before it returns
    buffer.published(held)
    assert buffer.oldest(tracker) == 20
    assert advanced_checkpoint(partition, tracker, buffer.oldest(tracker)) == 9, "sent, not acknowledged"
    tracker.acknowledged(10)
    assert advanced_checkpoint(partition, tracker, buffer.oldest(tracker)) == 19


def test_a_run_discarded_while_its_record_is_published_leaves_the_others_intact() -> None:
    buffer = CommitOrderBuffer()
    old, other = AckTracker(), AckTracker()
    buffer.hold(record(1), Partition("a", (), 0), old)
    buffer.hold(record(2), Partition("b", (), 0), other)
    held = buffer.ready(None)
    assert held is not None and held.tracker is old
    buffer.discard(old)
    buffer.published(held)
    assert not buffer.holds(old) and [h.tracker for h in release(buffer, None)] == [other]
    assert len(buffer) == 0


class RecordingPublisher(EventPublisher):
    """What the release hands the publisher, in order (a unit test has no Kafka to publish to)."""

    def __init__(self) -> None:
        self.published: list[tuple[int, str | None]] = []

    async def publish(
        self,
        record: DataChangeRecord,
        partition_token: str | None,
        tracker: AckTracker,
        shard: int | None = None,
    ) -> None:
        self.published.append((record.commit_timestamp_micros, partition_token))
        tracker.sent(record.commit_timestamp_micros)


@pytest.mark.parametrize(
    ("release_order", "expected"),
    [("commit", [(10, "a")]), ("partition", [(10, "a"), (30, "a"), (35, "a")])],
)
def test_the_release_order_decides_whether_a_change_waits_for_the_other_partitions(
    release_order: str, expected: list[tuple[int, str]]
) -> None:
    """Partition a has read up to 40, partition b (idle) only up to 15, its last heartbeat: in
    commit order a's changes after 15 wait for b; in partition order they go at once."""
    a, b = Partition("a", (), 0, watermark_micros=40), Partition("b", (), 0, watermark_micros=15)
    scheduler = PartitionScheduler({"a": a, "b": b})
    for partition in (a, b):
        scheduler.mark_running(partition)
    publisher = RecordingPublisher()
    release = CommitOrderRelease(scheduler, publisher, across_partitions=release_order == "commit")
    tracker = AckTracker()
    for commit in (10, 30, 35):
        release.hold(record(commit), a, tracker)
    asyncio.run(release.release())
    assert publisher.published == expected
    assert release.buffer.oldest(tracker) == (30 if release_order == "commit" else None)
