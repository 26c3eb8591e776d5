"""Partition lineage: which change-stream partitions exist, what each waits for, what may run.

The rules of Spanner's partition model (docs/design.md §4) live here and nowhere else:

- children are registered idempotently by token (a merged child is reported by each parent);
- a child runs only when **every** parent has finished, and exactly one query runs per token;
- the initial query (``partition_token = NULL``) is the pseudo-partition :data:`ROOT`, the
  parent of the partitions it reports;
- the low watermark is the minimum watermark over unfinished partitions;
- with several processes (``--group``), each owns some shards of the checkpoint topic and runs
  only the tokens of those (:func:`shard_of`); the others' tokens are in the table too, as their
  checkpoint records say, so lineage and the low watermark span the whole group.

This is plain state with no I/O, so the service decides *when* to persist and run, and this
module decides *what*.
"""

from __future__ import annotations

import enum
import logging
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from spanner_cdc.schemas.records import ChildPartitionsRecord

ROOT = "<root>"
log = logging.getLogger(__name__)


def shard_of(token: str, shards: int) -> int:
    """The checkpoint-topic partition (shard) that holds ``token``'s records and decides which
    process of a group reads it. CRC-32, not Python's ``hash``, which differs between processes;
    no hashing for one shard (a producer on its own): the release asks for every record."""
    return zlib.crc32(token.encode()) % shards if shards > 1 else 0


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
    #: The children it reported (written in its FINISHED record: a process of a group that reads
    #: that record learns of the children before it could pass them in the low watermark).
    children: tuple[str, ...] = ()
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
        """Where a (re)started query begins: just after the checkpoint, since every change
        committed at or before it was read and delivered (a data record moves the watermark to
        the microsecond before its commit, a heartbeat to its own time)."""
        return max(self.start_micros, self.checkpoint_micros + 1)

    @property
    def finished_checkpoint_micros(self) -> int:
        """Its checkpoint once its query ended and every event it published was delivered:
        everything it returned is acknowledged, so the checkpoint reaches the watermark."""
        return max(self.checkpoint_micros, self.watermark_micros)

    def to_json(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "parents": list(self.parents),
            "start_micros": self.start_micros,
            "state": self.state.value,
            "checkpoint_micros": self.checkpoint_micros,
            "children": list(self.children),
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
        children = data.get("children", [])  # records of earlier versions have none
        if not isinstance(children, list) or not all(isinstance(c, str) and c for c in children):
            raise ValueError("'children' is not a list of tokens")
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
            children=tuple(children),
        )


def _integer(data: dict[str, Any], name: str) -> int:
    value = data.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name!r} is not an integer")
    return value


#: The order states move in; a record never moves a partition back.
STATE_ORDER = {PartitionState.CREATED: 0, PartitionState.RUNNING: 1, PartitionState.FINISHED: 2}


@dataclass
class PartitionScheduler:
    """The partition table: lineage, states, and what may run next.

    ``shards`` is the checkpoint topic's partition count and ``owned`` the shards whose tokens
    this process runs: all of them (one shard, owned) for a producer on its own; what Kafka's
    consumer group assigned for one of a ``--group`` (producer.shards.group). Tokens of other shards
    are in the table as their owners' checkpoint records say (:meth:`apply_records`).
    """

    partitions: dict[str, Partition] = field(default_factory=dict)
    shards: int = 1
    owned: set[int] = field(default_factory=lambda: {0})
    #: FINISHED records held back until every child they name is known (see apply_records).
    _finishing: dict[str, Partition] = field(default_factory=dict)

    @classmethod
    def starting_at(
        cls, start_micros: int, shards: int = 1, owned: set[int] | None = None
    ) -> PartitionScheduler:
        return cls({ROOT: Partition(ROOT, (), start_micros)}, shards, {0} if owned is None else owned)

    @classmethod
    def restored(
        cls,
        partitions: Iterable[Partition],
        end_micros: int | None,
        shards: int = 1,
        owned: set[int] | None = None,
    ) -> PartitionScheduler:
        """The partition table as the checkpoint records left it, checked for what a producer
        never writes: a FINISHED partition without a child recorded, when it could not have
        ended at the end timestamp. A partition finishes only after its children are durably
        registered, or at the end timestamp (``end_micros``, this run's); anything else is a
        damaged or forged record, and believing it would skip the partition's remaining changes
        and every descendant's. Such a partition runs again from its checkpoint: at worst its
        changes since then are sent twice (same uuids, dropped by the consumer), none lost."""
        table = cls({p.token: p for p in partitions}, shards, {0} if owned is None else owned)
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

    # --- ownership (several processes) ---------------------------------------------------

    def mine(self, token: str) -> bool:
        """Whether this process runs ``token`` (its shard is owned here)."""
        return shard_of(token, self.shards) in self.owned

    def apply_records(self, records: Iterable[Partition]) -> None:
        """Other processes' checkpoint records, in the order they were written: a token not
        known is added (a child another process registered), a token of a shard owned elsewhere
        takes the record's state and checkpoint — never moving back. A token this process runs
        keeps its own state: its records are its own.

        A FINISHED record counts only once every child it names is known: the children's
        CREATED records are in other shards, read in no particular order against this one, and
        a parent finished with its children unknown would let the low watermark pass changes
        the children have still to read."""
        for record in records:
            known = self.partitions.get(record.token)
            if known is not None and self.mine(record.token):
                continue
            state = record
            if record.state == PartitionState.FINISHED:
                self._finishing[record.token] = record
                state = _unfinished(record)
            if known is None:
                self.partitions[record.token] = state
            else:
                _advance(known, state)
        for token, record in list(self._finishing.items()):
            if all(child in self.partitions for child in record.children):
                del self._finishing[token]
                if not self.mine(token):
                    _advance(self.partitions[token], record)

    def adopt(self, shard: int, records: Iterable[Partition]) -> None:
        """This process now runs ``shard``: its tokens take the newest records' states (their
        previous owner was fenced before those were read), then count as this process's."""
        for record in records:
            if shard_of(record.token, self.shards) == shard:
                known = self.partitions.get(record.token)
                if (
                    known is None
                    or record.state != PartitionState.FINISHED
                    or all(child in self.partitions for child in record.children)
                ):
                    self.partitions[record.token] = record
        self.owned.add(shard)

    def hand_back(self, shard: int) -> None:
        """``shard`` goes to another process: its tokens count as that process's, at their
        checkpoints (what this one vouched for on Kafka)."""
        self.owned.discard(shard)
        for partition in self.partitions.values():
            if shard_of(partition.token, self.shards) == shard:
                partition.watermark_micros = partition.checkpoint_micros

    # --- lineage ---------------------------------------------------------------------------

    def register_children(self, record: ChildPartitionsRecord, reported_by: str) -> list[Partition]:
        """Partitions this record adds (already-known tokens are not added again)."""
        added = []
        for child in record.children:
            parents = child.parent_tokens or (reported_by,)
            reporter = self.partitions[reported_by]
            if child.token not in reporter.children:
                reporter.children = (*reporter.children, child.token)
            if child.token in self.partitions:
                continue
            partition = Partition(child.token, parents, record.start_timestamp_micros)
            self.partitions[child.token] = partition
            added.append(partition)
        return added

    def runnable(self) -> list[Partition]:
        """This process's CREATED partitions whose parents all finished, oldest first."""
        ready = [
            p
            for p in self.partitions.values()
            if p.state == PartitionState.CREATED and self.mine(p.token) and self._parents_done(p)
        ]
        return sorted(ready, key=lambda p: (p.start_micros, p.token))

    def resumable(self) -> list[Partition]:
        """This process's RUNNING partitions: after a restart (or when their shard came to this
        process) their queries resume from the checkpoint."""
        return [
            p for p in self.partitions.values() if p.state == PartitionState.RUNNING and self.mine(p.token)
        ]

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
        """Minimum watermark over unfinished partitions — of those another process runs, their
        checkpoint, which is what it had read and Kafka acknowledged; None once all finished."""
        marks = [p.watermark_micros for p in self.unfinished()]
        return min(marks) if marks else None

    def release_bound_micros(self) -> int | None:
        """Up to where held records may be published in commit order: the low watermark of this
        process's partitions, and one past the checkpoints of the others'. One past: one
        transaction's records can sit in partitions of two processes, each holding them until
        the other's checkpoint passes their commit timestamp — they would wait for each other for
        ever; two changes of one key never share a commit timestamp, so per-key order only
        needs every other process to have published what came strictly before."""
        marks = [
            p.watermark_micros if self.mine(p.token) else p.checkpoint_micros + 1 for p in self.unfinished()
        ]
        return min(marks) if marks else None

    def count_by_state(self) -> dict[PartitionState, int]:
        counts = dict.fromkeys(PartitionState, 0)
        for partition in self.partitions.values():
            counts[partition.state] += 1
        return counts


def _unfinished(record: Partition) -> Partition:
    """A FINISHED record as the RUNNING one before it: its checkpoint without the finish."""
    return Partition(
        record.token,
        record.parents,
        record.start_micros,
        PartitionState.RUNNING,
        record.checkpoint_micros,
        record.checkpoint_micros,
        record.children,
    )


def _advance(known: Partition, record: Partition) -> None:
    """Move ``known`` forward to what ``record`` says, never back."""
    if STATE_ORDER[record.state] > STATE_ORDER[known.state]:
        known.state = record.state
    known.checkpoint_micros = max(known.checkpoint_micros, record.checkpoint_micros)
    known.watermark_micros = known.checkpoint_micros
    known.children = tuple(dict.fromkeys((*known.children, *record.children)))
