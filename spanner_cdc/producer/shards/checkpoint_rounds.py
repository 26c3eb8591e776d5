"""Rounds of checkpoints beyond those each transaction carries with its events.

Every running partition's record is made as its shard's transaction commits
(producer.shards.transaction_checkpoints). A round commits the writers of some shards with those
records even when nothing else is in the transaction: every ``--checkpoint-interval`` seconds
for the checkpoints that advanced without events (heartbeats), and at shutdown or a shard's
handover for every running partition of it, advanced or not (``CheckpointStore.due``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from spanner_cdc.errors import SpannerCdcError
from spanner_cdc.producer.changestream.gauges import Gauges
from spanner_cdc.producer.changestream.partition_run import PartitionRunner
from spanner_cdc.producer.errors import DeliveryFailedError, KafkaClientLostError
from spanner_cdc.producer.lineage.partitions import PartitionScheduler, PartitionState, shard_of
from spanner_cdc.producer.publish.checkpoints import CheckpointStore
from spanner_cdc.producer.publish.kafka import KafkaClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointRounds:
    kafka: KafkaClient
    checkpoints: CheckpointStore
    scheduler: PartitionScheduler
    runner: PartitionRunner
    gauges: Gauges

    async def periodically(
        self, interval: float, shards: Callable[[], set[int]], on_failure: Callable[[SpannerCdcError], None]
    ) -> None:
        """Every ``interval``, the checkpoints of ``shards()`` that advanced; a round Kafka did
        not acknowledge is retried at the next one (the checkpoints on Kafka stay behind, which
        only means a restart repeats events), unless the client failed for good: then
        ``on_failure``, and the rounds end."""
        while True:
            await asyncio.sleep(interval)
            try:
                failed = await self.kafka.commit_checkpoints(shards())
            except KafkaClientLostError as exc:
                on_failure(exc)
                return
            if failed:
                log.warning("checkpoints not acknowledged; retrying in %.1fs", interval)
            self.gauges.update()

    async def every_running(self, shards: set[int]) -> None:
        """The record of every running partition of ``shards``, advanced or not.
        DeliveryFailedError when Kafka did not acknowledge them, KafkaClientLostError when a
        writer can deliver nothing any more."""
        for token in self.runner.runs:
            if (
                self.scheduler.partitions[token].state == PartitionState.RUNNING
                and shard_of(token, self.scheduler.shards) in shards
            ):
                self.checkpoints.make_due(token)
        if await self.kafka.commit_checkpoints(shards):
            raise DeliveryFailedError("checkpoints not acknowledged")
        self.gauges.update()

    async def last(self, shards: set[int]) -> None:
        """At shutdown: a failure is one line, and the next run resumes from those written before."""
        try:
            await self.every_running(shards)
        except (KafkaClientLostError, DeliveryFailedError) as exc:
            log.warning(
                "the last checkpoints were not written (%s); the next run resumes from earlier ones", exc
            )
