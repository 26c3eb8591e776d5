"""The producer's supervisor: runs the parts ``producer.main`` wired, stops cleanly.

A partition's life and task are in ``producer.changestream``, what each record does too;
publishing, in ``producer.publish``; the checkpoints without events and a ``--group``'s shards
taken and given back, in ``producer.shards``. Here: the order of a start and of a shutdown, the
watermark records, and the one line any part failing for good stops the producer with.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from spanner_cdc.errors import SpannerCdcError
from spanner_cdc.producer.backfill.runner import Backfill
from spanner_cdc.producer.changestream.gauges import Gauges
from spanner_cdc.producer.changestream.partition_run import PartitionRunner
from spanner_cdc.producer.changestream.partition_tasks import PartitionTasks
from spanner_cdc.producer.changestream.release import CommitOrderRelease
from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.producer.lineage.low_watermark import safe_watermark
from spanner_cdc.producer.lineage.partitions import Partition, PartitionScheduler
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.publish.checkpoints import CheckpointStore
from spanner_cdc.producer.publish.kafka import FLUSH_TIMEOUT_SECONDS
from spanner_cdc.producer.publish.publisher import EventPublisher
from spanner_cdc.producer.publish.watermarks import WatermarkEmitter, publish_periodically
from spanner_cdc.producer.shards.checkpoint_rounds import CheckpointRounds
from spanner_cdc.producer.shards.group import ShardGroup
from spanner_cdc.producer.shards.handover import ShardHandover

log = logging.getLogger(__name__)


@dataclass
class Lifecycle:
    """How one run of the producer ends: asked to (a signal), done (every partition, and the
    backfill, finished at the end timestamp), or failed (the first part failing for good; its
    error is the run's)."""

    scheduler: PartitionScheduler
    backfill: Backfill | None
    end_timestamp_micros: int | None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    failure: SpannerCdcError | None = None

    def fail(self, error: SpannerCdcError) -> None:
        if self.failure is None:
            self.failure = error
            log.error("stopping: %s", error)
        self.stop.set()

    def stop_when_done(self) -> None:
        """With an end timestamp: stop once every partition finished and the backfill too."""
        if self.scheduler.all_finished() and (self.backfill is None or self.backfill.finished):
            if self.end_timestamp_micros is not None:
                log.info("every partition finished at the end timestamp")
            self.stop.set()


@dataclass
class ProducerService:
    """The parts of one producer (wired by ``producer.main``) and the order they start and
    stop in."""

    config: ProducerConfig
    publisher: EventPublisher
    checkpoints: CheckpointStore
    scheduler: PartitionScheduler
    metrics: ProducerMetrics
    release: CommitOrderRelease
    runner: PartitionRunner
    tasks: PartitionTasks
    rounds: CheckpointRounds
    #: What the process does when the group moves shards (--group).
    handover: ShardHandover
    gauges: Gauges
    lifecycle: Lifecycle
    #: None with --no-watermark-records: nothing is written to the event topics but events.
    watermarks: WatermarkEmitter | None
    #: The snapshot rows to publish alongside the changes (producer.backfill), or None.
    backfill: Backfill | None
    #: The consumer group that assigns this process its shards (``--group``), or None.
    group: ShardGroup | None

    # --- lifecycle --------------------------------------------------------------------------

    def request_stop(self) -> None:
        """SIGINT/SIGTERM: stop reading, flush, checkpoint, return normally."""
        self.lifecycle.stop.set()

    @property
    def stopped(self) -> bool:
        return self.lifecycle.stop.is_set()

    async def run(self) -> None:
        """Until stopped, failed, or (with an end timestamp) every partition finished."""
        async with self.publisher.kafka.serving():  # its last commit after the group left
            await self._run_served()
        if self.lifecycle.failure is not None:
            raise self.lifecycle.failure
        log.info("stopped: checkpoints written")

    async def _run_served(self) -> None:
        group_stop = asyncio.Event()
        membership = (
            []
            if self.group is None
            else [  # the follower first: a shard's records are read at its takeover anyway
                self.tasks.watch(self.checkpoints.follow(self._records_seen, group_stop)),
                self.tasks.watch(self.group.run(self.handover, group_stop)),
            ]
        )
        rounds = self.rounds.periodically(self.config.checkpoint_interval, self._staying, self.lifecycle.fail)
        background = [asyncio.create_task(rounds)]
        if self.backfill is not None:
            background.append(asyncio.create_task(self._backfill(self.backfill)))
        if self.watermarks is not None:
            interval = self.config.watermark_interval
            background.append(
                asyncio.create_task(publish_periodically(self.watermarks, self.safe_watermark, interval))
            )
        try:
            self.tasks.launch_resumable()
            self.tasks.launch_runnable()
            await self.lifecycle.stop.wait()
        finally:
            if self.lifecycle.failure is None:  # a failure said its own "stopping" line
                log.info(
                    "stopping: ending %d partition queries, then flushing to Kafka and writing checkpoints",
                    len(self.tasks.tasks),
                )
            for task in background:
                task.cancel()
            # Under the release lock, so no partition task is stopped halfway through a release;
            # then what the low watermark allows goes out too.
            async with self.release.locked():
                await asyncio.gather(*background, self.tasks.stop(), return_exceptions=True)
                # Shards the group took without a handover (shards_lost) while their queries ran
                # on: what those held is not this process's to send any more.
                self.handover.forget_runs(set(range(self.scheduler.shards)) - self.scheduler.owned)
                await self.release.release_locked()
            undelivered = await self.publisher.kafka.flush(FLUSH_TIMEOUT_SECONDS)
            if undelivered:
                log.warning(
                    "%d events still undelivered at shutdown; their partitions resume before them",
                    undelivered,
                )
            await self.rounds.last(self._staying())
            await self._publish_last_watermark()
            group_stop.set()  # leaving hands every shard back; their commits need serving
            await asyncio.gather(*membership, return_exceptions=True)

    async def _backfill(self, backfill: Backfill) -> None:
        try:
            await backfill.run()
        except SpannerCdcError as exc:
            self.lifecycle.fail(exc)
            return
        self.lifecycle.stop_when_done()

    def _records_seen(self, records: list[Partition]) -> None:
        """Other processes' checkpoint records: what they finished, registered and published."""
        self.scheduler.apply_records(records)
        if not self.lifecycle.stop.is_set():
            self.tasks.launch_runnable()

    # --- watermarks ------------------------------------------------------------------------

    async def safe_watermark(self) -> int | None:
        """Highest T with every change committed at or before T read, published and acknowledged
        (``producer.lineage.low_watermark``), taken under the release lock so no release is half done."""
        if not self.scheduler.owned:
            return None  # a member without shards vouches for nothing until it has some
        async with self.release.locked():
            safe = safe_watermark(
                self.scheduler.low_watermark_micros(),
                self.config.end_timestamp_micros,
                self.release.next_commit(),
                self.runner.trackers(),
            )
        hold = None if self.backfill is None else self.backfill.hold
        return safe if hold is None or safe is None else min(safe, hold)

    async def _publish_last_watermark(self) -> None:
        """At shutdown, after the flush: how far consumers may trust what this run wrote."""
        if self.watermarks is None:
            return
        try:
            safe = await self.safe_watermark()
            async with asyncio.timeout(FLUSH_TIMEOUT_SECONDS):
                await self.watermarks.publish(safe)
        except Exception as exc:  # the events and checkpoints are safe; only the stamp is missing
            log.warning("could not publish the last watermark: %s", exc)

    def _staying(self) -> set[int]:
        """The shards this process owns and is not handing back."""
        return self.scheduler.owned - self.tasks.leaving
