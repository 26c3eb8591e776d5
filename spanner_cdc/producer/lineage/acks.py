"""Which events of one partition Kafka has acknowledged, and hence how far it may checkpoint.

Within a partition records arrive in commit-timestamp order, so pending commit timestamps are
kept in insertion order and the oldest pending one bounds the checkpoint: every event with a
commit timestamp strictly before it is acknowledged.

An event goes through two steps: *staged* — the broker acknowledged it inside the open
transaction — and *acknowledged* — that transaction committed. The checkpoint a transaction may
carry with its own events (:meth:`AckTracker.checkpoint_if_committed`) counts staged events as
done: it becomes true exactly when they do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import TypeVar

#: What a count is kept by: a commit timestamp, or (change type, commit timestamp).
Key = TypeVar("Key", bound=Hashable)


class AckTracker:
    """Counts of sent-but-unacknowledged events by commit timestamp, for one partition run.

    A new tracker is made for every (re)start of a partition's query, and delivery reports name
    the tracker they belong to, so a report from an abandoned run cannot move a new run's
    checkpoint.
    """

    def __init__(self) -> None:
        self._pending: dict[int, int] = {}
        #: The pending events the broker has not yet taken into the open transaction.
        self._unstaged: dict[int, int] = {}
        self._drained = asyncio.Event()
        self._drained.set()
        #: Sent events not yet reported either way (acknowledged, failed or given up).
        self._in_flight = 0
        self._settled = asyncio.Event()
        self._settled.set()
        self.failed: str | None = None
        #: A failure a retry cannot mend (the producer stops with this line).
        self.fatal: str | None = None

    def sent(self, commit_micros: int, count: int = 1) -> None:
        """``count`` events (messages) of the change committed at ``commit_micros`` sent."""
        self._pending[commit_micros] = self._pending.get(commit_micros, 0) + count
        self._unstaged[commit_micros] = self._unstaged.get(commit_micros, 0) + count
        self._drained.clear()
        self._in_flight += count
        self._settled.clear()

    def staged(self, commit_micros: int, count: int = 1) -> None:
        """The broker took the events into the open transaction (delivered when that commits)."""
        take(self._unstaged, commit_micros, count)

    def acknowledged(self, commit_micros: int, count: int = 1) -> None:
        pending = self._pending[commit_micros]
        # Acknowledged without being staged first: no more may stay unstaged than stay pending.
        unstaged_beyond = self._unstaged.get(commit_micros, 0) - (pending - count)
        if unstaged_beyond > 0:
            take(self._unstaged, commit_micros, unstaged_beyond)
        if pending > count:
            self._pending[commit_micros] = pending - count
        else:
            del self._pending[commit_micros]
            if not self._pending:
                self._drained.set()
        self._reported(count)

    def delivery_failed(self, reason: str, count: int = 1) -> None:
        """The events stay pending forever, so the checkpoint can never pass them."""
        self.failed = self.failed or reason
        self._drained.set()
        self._reported(count)

    def give_up(self, reason: str, count: int = 1) -> None:
        """The events can never be delivered: the run must stop the producer, not retry."""
        self.fatal = self.fatal or reason
        self._drained.set()
        self._reported(count)

    def _reported(self, count: int) -> None:
        self._in_flight -= count
        if self._in_flight <= 0:
            self._settled.set()

    @property
    def pending(self) -> int:
        return sum(self._pending.values())

    def checkpoint(self, watermark_micros: int) -> int:
        """Highest T with every event at commit timestamp ≤ T acknowledged, given the watermark."""
        if not self._pending:
            return watermark_micros
        return min(next(iter(self._pending)) - 1, watermark_micros)

    def checkpoint_if_committed(self, watermark_micros: int) -> int:
        """:meth:`checkpoint` as it will be once the open transaction commits: staged events
        counted as acknowledged — unless a delivery of this run failed. Then staged events may
        belong to a transaction that was aborted (a failed commit reports them failed, it does
        not unstage them), and only acknowledged ones count: the checkpoint a run that failed
        still writes (at shutdown, after a flush whose commit failed) never passes an event
        that was not delivered."""
        if self.failed is not None or self.fatal is not None:
            return self.checkpoint(watermark_micros)
        if not self._unstaged:
            return watermark_micros
        return min(next(iter(self._unstaged)) - 1, watermark_micros)

    async def drained(self) -> None:
        """Wait until nothing is pending (or a delivery failed: check :attr:`failed` after)."""
        await self._drained.wait()

    async def settled(self) -> None:
        """Wait until every sent event was reported, delivered or not: from then on nothing
        this run sent can still reach a reader."""
        await self._settled.wait()


def take(counts: dict[Key, int], key: Key, count: int = 1) -> None:
    """Take ``count`` from ``counts[key]``, dropping the key at zero: what is left in order is
    what is still counted (the oldest pending commit first)."""
    remaining = counts[key] - count
    if remaining:
        counts[key] = remaining
    else:
        del counts[key]
