"""Partition lineage: which change-stream partitions exist, what each waits for, what may run.

The rules of seed 000 and docs/design.md §4 live here and nowhere else:

- children are registered idempotently by token (a merged child is reported by each parent);
- a child runs only when **every** parent has finished, and exactly one query runs per token;
- the initial query (``partition_token = NULL``) is the pseudo-partition :data:`ROOT`, the
  parent of the partitions it reports;
- the low watermark is the minimum watermark over unfinished partitions.

This is plain state with no I/O, so the service decides *when* to persist and run, and this
module decides *what*.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from spanner_cdc.schemas.records import ChildPartitionsRecord

ROOT = "<root>"
log = logging.getLogger(__name__)


class PartitionState(enum.StrEnum):
    CREATED = "CREATED"  # registered; waits for its parents
    RUNNING = "RUNNING"  # its query was started (and is resumed from its checkpoint after a restart)
    FINISHED = "FINISHED"  # query ended, every event acknowledged, children durably registered


@dataclass
class Partition:
    token: str
    parents: tuple[str, ...]
    start_micros: int
    state: PartitionState = PartitionState.CREATED
    #: Every event of this partition with commit timestamp ≤ checkpoint is acknowledged by Kafka.
    checkpoint_micros: int = 0
    #: Everything at or before this was returned by the query (records, heartbeats).
    watermark_micros: int = 0
    #: Queries started for it in this process: first starts (at most one) and retries.
    starts: int = 0
    retries: int = 0

    def __post_init__(self) -> None:
        # Before its query runs, a partition has returned nothing: not even changes committed
        # at its start timestamp, which belong to it.
        self.checkpoint_micros = max(self.checkpoint_micros, self.start_micros - 1)
        self.watermark_micros = max(self.watermark_micros, self.start_micros - 1)

    @property
    def query_token(self) -> str | None:
        return None if self.token == ROOT else self.token

    @property
    def resume_micros(self) -> int:
        """Where a (re)started query begins: inclusive, so events at the checkpoint may repeat."""
        return max(self.start_micros, self.checkpoint_micros)

    def to_json(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "parents": list(self.parents),
            "start_micros": self.start_micros,
            "state": self.state.value,
            "checkpoint_micros": self.checkpoint_micros,
        }

    @classmethod
    def from_json(cls, data: Any) -> Partition:
        """A partition as a checkpoint record left it, for a new run; ValueError naming what is
        wrong when ``data`` is not such a record (the caller says where it came from).

        Its watermark is its checkpoint: the run that wrote the record may have read further,
        but what it read and had not published is lost with it, and a watermark ahead of the
        checkpoint would let the new run publish watermarks and release held records past
        changes it has yet to read again. (Records of earlier versions carry that run's
        ``watermark_micros``; it is ignored.)
        """
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        token, parents = data.get("token"), data.get("parents")
        if not isinstance(token, str) or not token:
            raise ValueError("'token' is not a non-empty string")
        if not isinstance(parents, list) or not all(isinstance(p, str) and p for p in parents):
            raise ValueError("'parents' is not a list of tokens")
        start, checkpoint = _integer(data, "start_micros"), _integer(data, "checkpoint_micros")
        if data.get("state") not in PartitionState.__members__:
            raise ValueError(f"'state' is not one of {', '.join(PartitionState)}")
        return cls(
            token=token,
            parents=tuple(parents),
            start_micros=start,
            state=PartitionState(data["state"]),
            checkpoint_micros=checkpoint,
            watermark_micros=checkpoint,
        )


def _integer(data: dict[str, Any], name: str) -> int:
    value = data.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name!r} is not an integer")
    return value


@dataclass
class PartitionScheduler:
    """The partition table: lineage, states, and what may run next."""

    partitions: dict[str, Partition] = field(default_factory=dict)

    @classmethod
    def starting_at(cls, start_micros: int) -> PartitionScheduler:
        return cls({ROOT: Partition(ROOT, (), start_micros)})

    @classmethod
    def restored(cls, partitions: Iterable[Partition], end_micros: int | None) -> PartitionScheduler:
        """The partition table as the checkpoint records left it, checked for what a producer
        never writes: a FINISHED partition without a child recorded, when it could not have
        ended at the end timestamp. A partition finishes only after its children are durably
        registered, or at the end timestamp (``end_micros``, this run's); anything else is a
        damaged or forged record, and believing it would skip the partition's remaining changes
        and every descendant's. Such a partition runs again from its checkpoint: at worst its
        changes since then are sent twice (same uuids, dropped by the consumer), none lost."""
        table = cls({p.token: p for p in partitions})
        parents = {parent for p in table.partitions.values() for parent in p.parents}
        for partition in table.partitions.values():
            ended_at_end = end_micros is not None and partition.checkpoint_micros >= end_micros
            if (
                partition.state == PartitionState.FINISHED
                and partition.token not in parents
                and not ended_at_end
            ):
                log.warning(
                    "checkpoint of partition %s says FINISHED but no child of it is recorded; "
                    "it runs again from its checkpoint",
                    partition.token[:16],
                )
                partition.state = PartitionState.RUNNING
        return table

    def register_children(self, record: ChildPartitionsRecord, reported_by: str) -> list[Partition]:
        """Partitions this record adds (already-known tokens are not added again)."""
        added = []
        for child in record.children:
            parents = child.parent_tokens or (reported_by,)
            if child.token in self.partitions:
                continue
            partition = Partition(child.token, parents, record.start_timestamp_micros)
            self.partitions[child.token] = partition
            added.append(partition)
        return added

    def runnable(self) -> list[Partition]:
        """CREATED partitions whose parents all finished, oldest first."""
        ready = [
            p for p in self.partitions.values() if p.state == PartitionState.CREATED and self._parents_done(p)
        ]
        return sorted(ready, key=lambda p: (p.start_micros, p.token))

    def resumable(self) -> list[Partition]:
        """RUNNING partitions: after a restart their queries resume from the checkpoint."""
        return [p for p in self.partitions.values() if p.state == PartitionState.RUNNING]

    def _parents_done(self, partition: Partition) -> bool:
        for parent in partition.parents:
            known = self.partitions.get(parent)
            if known is None:
                log.error("partition %s waits for unknown parent %s", partition.token[:16], parent[:16])
                return False
            if known.state != PartitionState.FINISHED:
                return False
        return True

    def mark_running(self, partition: Partition) -> None:
        if partition.state == PartitionState.FINISHED:
            raise RuntimeError(f"partition {partition.token} already finished; it is never queried again")
        partition.state = PartitionState.RUNNING
        partition.starts += 1

    @staticmethod
    def note_retry(partition: Partition) -> None:
        """A running partition's query is started again from its checkpoint (error or stall)."""
        partition.retries += 1

    @staticmethod
    def mark_finished(partition: Partition) -> None:
        partition.state = PartitionState.FINISHED

    def unfinished(self) -> list[Partition]:
        return [p for p in self.partitions.values() if p.state != PartitionState.FINISHED]

    def all_finished(self) -> bool:
        return not self.unfinished()

    def low_watermark_micros(self) -> int | None:
        """Minimum watermark over unfinished partitions; None once all finished."""
        marks = [p.watermark_micros for p in self.unfinished()]
        return min(marks) if marks else None

    def count_by_state(self) -> dict[PartitionState, int]:
        counts = dict.fromkeys(PartitionState, 0)
        for partition in self.partitions.values():
            counts[partition.state] += 1
        return counts
