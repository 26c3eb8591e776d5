"""Commit-order release across partitions: the low watermark decides what may be published.

Lineage alone orders a key's changes only if every key stays within one line of partitions.
The emulator breaks that (seen: a key changed in partition X, then — 4.5 s of commit time later
— in a partition of an unrelated line, whose event reached Kafka first), and nothing in the
producer should depend on how a server lays keys out. So data change records wait here until
the low watermark (every unfinished partition has returned everything up to it) passes their
commit timestamp, and leave in (commit timestamp, transaction, record sequence) order. Every
key's changes then reach Kafka in commit order, whatever the partitioning, at the cost of up to
one heartbeat interval of latency.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

from spanner_cdc.producer.lineage.acks import AckTracker
from spanner_cdc.producer.lineage.partitions import Partition
from spanner_cdc.schemas.records import DataChangeRecord


@dataclass(order=True)
class Held:
    order: tuple[int, str, str, int]
    record: DataChangeRecord = field(compare=False)
    partition: Partition = field(compare=False)
    tracker: AckTracker = field(compare=False)


class CommitOrderBuffer:
    """Records not yet released, in commit order, with per-run bookkeeping for checkpoints."""

    def __init__(self) -> None:
        self._heap: list[Held] = []
        self._arrivals = itertools.count()
        self._by_run: dict[AckTracker, deque[int]] = {}

    def __len__(self) -> int:
        return len(self._heap)

    def hold(self, record: DataChangeRecord, partition: Partition, tracker: AckTracker) -> None:
        commit = record.commit_timestamp_micros
        order = (commit, record.server_transaction_id, record.record_sequence, next(self._arrivals))
        heapq.heappush(self._heap, Held(order, record, partition, tracker))
        self._by_run.setdefault(tracker, deque()).append(commit)

    def ready(self, up_to_micros: int | None) -> Held | None:
        """The next record to publish if its commit timestamp is ≤ ``up_to_micros`` (any when
        None). It stays held — bounding its run's checkpoint, keeping its run unfinished — until
        :meth:`published` says its events are counted by its run's tracker: publishing awaits
        (a catalog read, a new table's schema acknowledged), and a checkpoint or a finish taken
        meanwhile must not pass a record that is in neither place."""
        if self._heap and (up_to_micros is None or self._heap[0].order[0] <= up_to_micros):
            return self._heap[0]
        return None

    def published(self, held: Held) -> None:
        """``held``'s events are with the Kafka client and counted by its tracker: it leaves."""
        if self._heap and self._heap[0] is held:
            heapq.heappop(self._heap)
        elif held in self._heap:  # a record that came late went ahead of it meanwhile
            self._heap.remove(held)
            heapq.heapify(self._heap)
        else:  # its run was discarded while it was published
            return
        run = self._by_run[held.tracker]
        run.popleft()
        if not run:
            del self._by_run[held.tracker]

    def next_commit(self) -> int | None:
        """Commit timestamp of the next record to leave: nothing after it is published yet."""
        return self._heap[0].order[0] if self._heap else None

    def oldest(self, tracker: AckTracker) -> int | None:
        """Commit timestamp of the run's oldest held record: its checkpoint must stay below it."""
        run = self._by_run.get(tracker)
        return run[0] if run else None

    def holds(self, tracker: AckTracker) -> bool:
        return tracker in self._by_run

    def discard(self, tracker: AckTracker) -> None:
        """Forget an abandoned run's records: its restarted query reads them again."""
        if self._by_run.pop(tracker, None) is not None:
            self._heap = [held for held in self._heap if held.tracker is not tracker]
            heapq.heapify(self._heap)
