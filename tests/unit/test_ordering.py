"""Commit-order release: held records leave in commit order once the watermark passes them."""

from __future__ import annotations

import dataclasses

import pytest

from spanner_cdc.producer.acks import AckTracker
from spanner_cdc.producer.ordering import CommitOrderBuffer
from spanner_cdc.producer.partitions import Partition
from spanner_cdc.schemas.records import DataChangeRecord
from testkit.records import account_transfer_records

pytestmark = pytest.mark.unit
TEMPLATE = DataChangeRecord.from_json(account_transfer_records()[0])


def record(commit: int, tx: str = "t", sequence: str = "00000000") -> DataChangeRecord:
    return dataclasses.replace(TEMPLATE, commit_timestamp_micros=commit, server_transaction_id=tx,
                               record_sequence=sequence)  # fmt: skip


def test_release_in_commit_order_across_partitions_up_to_the_watermark() -> None:
    buffer = CommitOrderBuffer()
    a, b = AckTracker(), AckTracker()
    pa, pb = Partition("a", (), 0), Partition("b", (), 0)
    for commit in (10, 30):
        buffer.hold(record(commit), pa, a)
    for commit in (20, 40):
        buffer.hold(record(commit), pb, b)
    assert buffer.oldest(a) == 10 and buffer.oldest(b) == 20
    released = [(h.record.commit_timestamp_micros, h.partition.token) for h in buffer.release(30)]
    assert released == [(10, "a"), (20, "b"), (30, "a")]
    assert not buffer.holds(a) and buffer.oldest(b) == 40 and len(buffer) == 1
    assert [h.record.commit_timestamp_micros for h in buffer.release(None)] == [40]


def test_same_timestamp_orders_by_transaction_then_sequence() -> None:
    buffer = CommitOrderBuffer()
    run, partition = AckTracker(), Partition("a", (), 0)
    buffer.hold(record(5, "tx2", "00000000"), partition, run)
    buffer.hold(record(5, "tx1", "00000001"), partition, run)
    buffer.hold(record(5, "tx1", "00000000"), partition, run)
    order = [(h.record.server_transaction_id, h.record.record_sequence) for h in buffer.release(5)]
    assert order == [("tx1", "00000000"), ("tx1", "00000001"), ("tx2", "00000000")]


def test_discarding_an_abandoned_run_keeps_the_others() -> None:
    buffer = CommitOrderBuffer()
    old, other = AckTracker(), AckTracker()
    buffer.hold(record(1), Partition("a", (), 0), old)
    buffer.hold(record(2), Partition("b", (), 0), other)
    buffer.discard(old)
    assert not buffer.holds(old) and [h.tracker for h in buffer.release(None)] == [other]
