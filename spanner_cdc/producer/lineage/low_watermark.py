"""How far the producer can vouch for what is on Kafka: pure functions, no I/O.

- the **safe watermark**: every change committed at or before it was read, released in commit
  order and acknowledged by Kafka (what watermark records promise consumers);
- a partition's **checkpoint**: every event of it committed at or before it is acknowledged (where
  a restarted query resumes).
"""

from __future__ import annotations

from collections.abc import Iterable

from spanner_cdc.producer.lineage.acks import AckTracker
from spanner_cdc.producer.lineage.partitions import Partition


def safe_watermark(
    low_watermark: int | None,
    end_timestamp: int | None,
    next_held_commit: int | None,
    runs: Iterable[AckTracker],
) -> int | None:
    """The low watermark, lowered below the next held record and every unacknowledged event.

    With every partition finished (no low watermark) it is the end timestamp, if there is one.
    """
    safe = low_watermark if low_watermark is not None else end_timestamp
    if safe is None:
        return None
    if next_held_commit is not None:
        safe = min(safe, next_held_commit - 1)
    for tracker in runs:
        safe = tracker.checkpoint(safe)
    return safe


def advanced_checkpoint(
    partition: Partition, tracker: AckTracker, oldest_held_commit: int | None, *, if_committed: bool = False
) -> int:
    """The partition's checkpoint after its current run: what it read, less what is still held or
    unacknowledged (with ``if_committed``: as it will be once the open transaction commits);
    never behind the checkpoint it already had."""
    watermark = partition.watermark_micros
    safe = tracker.checkpoint_if_committed(watermark) if if_committed else tracker.checkpoint(watermark)
    if oldest_held_commit is not None:
        safe = min(safe, oldest_held_commit - 1)
    return max(partition.checkpoint_micros, safe)
