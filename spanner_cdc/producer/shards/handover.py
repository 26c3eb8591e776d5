"""What a process of a ``--group`` does when the group moves shards (producer.shards.group's
``ShardOwner``).

It takes a shard over by fencing its previous owner's writer, then reading its checkpoints as
that owner left them, and runs its partitions. It gives one back by stopping its queries,
committing its events and its checkpoints, and only then letting its writer go — the next
owner may start from there. A shard taken without a handover (the session expired) is written
to no more, and the process stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

from spanner_cdc.errors import SpannerCdcError
from spanner_cdc.producer.changestream.gauges import Gauges
from spanner_cdc.producer.changestream.partition_run import PartitionRunner
from spanner_cdc.producer.changestream.partition_tasks import PartitionTasks
from spanner_cdc.producer.changestream.release import CommitOrderRelease
from spanner_cdc.producer.errors import DeliveryFailedError, GroupMembershipLostError, KafkaClientLostError
from spanner_cdc.producer.lineage.partitions import ROOT, PartitionScheduler, shard_of
from spanner_cdc.producer.publish.checkpoints import CheckpointStore
from spanner_cdc.producer.publish.kafka import FLUSH_TIMEOUT_SECONDS, KafkaClient
from spanner_cdc.producer.shards.checkpoint_rounds import CheckpointRounds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardHandover:
    kafka: KafkaClient
    checkpoints: CheckpointStore
    scheduler: PartitionScheduler
    _: KW_ONLY
    runner: PartitionRunner
    release: CommitOrderRelease
    tasks: PartitionTasks
    rounds: CheckpointRounds
    gauges: Gauges
    stopping: Callable[[], bool]
    on_failure: Callable[[SpannerCdcError], None]

    async def take_shards(self, shards: list[int]) -> None:
        """The group assigned ``shards`` to this process: fence their previous owner's writer,
        read their checkpoints as it left them, and run their partitions."""
        # In parallel: each takeover (init_transactions) waits for the broker's fencing.
        await asyncio.gather(*(self.kafka.take_over(shard) for shard in shards))
        records = await asyncio.to_thread(self.checkpoints.read)
        self.scheduler.apply_records(records)
        for shard in shards:
            self.scheduler.adopt(shard, records)
        root = self.scheduler.partitions.get(ROOT)
        if root is not None and self.scheduler.mine(ROOT) and ROOT not in {r.token for r in records}:
            await self.checkpoints.write([root])  # its start, before another process could pick its own
        log.info(
            "shards %s of %d are this process's now (%d shards in all)",
            ",".join(map(str, shards)),
            self.scheduler.shards,
            len(self.scheduler.owned),
        )
        self.gauges.update()
        if not self.stopping():
            self.tasks.launch_resumable()
            self.tasks.launch_runnable()

    async def give_back_shards(self, shards: list[int]) -> None:
        """The group moves ``shards`` to another process: stop their queries, commit their
        events, write their checkpoints, then let them go — only then may the next owner start."""
        moving = set(shards)
        self.tasks.leaving |= moving
        try:
            await self._hand_over(moving)
        finally:
            self.tasks.leaving -= moving
        log.info("shards %s handed back to the group", ",".join(map(str, shards)))
        self.gauges.update()

    async def _hand_over(self, moving: set[int]) -> None:
        async with self.release.locked():
            await self.tasks.stop(moving)
        await self.kafka.flush(FLUSH_TIMEOUT_SECONDS)
        try:
            await self.rounds.every_running(moving)
        except (KafkaClientLostError, DeliveryFailedError) as exc:
            log.warning("shards %s: the last checkpoints were not written (%s)", sorted(moving), exc)
        self.forget_runs(moving)
        for shard in sorted(moving):
            self.scheduler.hand_back(shard)
            await self.kafka.hand_back(shard)

    def forget_runs(self, shards: set[int]) -> None:
        """Drop the runs of the tokens in ``shards`` and the events they hold: the shards' next
        owner reads them again from their checkpoints."""
        for token in [t for t in self.runner.runs if shard_of(t, self.scheduler.shards) in shards]:
            self.release.discard(self.runner.forget(token))
            self.checkpoints.not_due(token)

    def shards_lost(self, shards: list[int]) -> None:
        """The group took ``shards`` without a handover (the session expired): their writers
        are fenced, or about to be. Nothing more is written for them; the producer stops."""
        for shard in shards:
            self.scheduler.hand_back(shard)
            self.kafka.drop(shard)
        self.on_failure(
            GroupMembershipLostError(
                f"shards {','.join(map(str, shards))} were taken from this process: it was paused or cut "
                "off for longer than --group-session-timeout; it stops (start it again to rejoin)"
            )
        )
