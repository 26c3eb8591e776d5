"""The producer's supervisor: wires the parts, runs them, stops cleanly.

A partition's life is in ``producer.partition_run``, its task in ``producer.partition_tasks``;
what each record does, in ``producer.actions``; publishing, in ``producer.publisher``; the
checkpoints without events, in ``producer.checkpoint_rounds``; a ``--group``'s shards taken
and given back, in ``producer.shard_handover``. Here: the order of a start and of a shutdown,
the watermark records, and the one line any part failing for good stops the producer with.
"""

from __future__ import annotations

import asyncio
import logging

from spanner_cdc.errors import SpannerCdcError
from spanner_cdc.producer.actions import (
    ChildPartitionsAction,
    DataChangeAction,
    HeartbeatAction,
    RecordActions,
    TableFilter,
)
from spanner_cdc.producer.backfill import Backfill
from spanner_cdc.producer.checkpoint_rounds import CheckpointRounds
from spanner_cdc.producer.checkpoints import CheckpointStore
from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.producer.gauges import Gauges
from spanner_cdc.producer.group import ShardGroup
from spanner_cdc.producer.kafka import FLUSH_TIMEOUT_SECONDS
from spanner_cdc.producer.low_watermark import safe_watermark
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.partition_run import ChangeStreamSource, PartitionRunner
from spanner_cdc.producer.partition_tasks import PartitionTasks
from spanner_cdc.producer.partitions import Partition, PartitionScheduler
from spanner_cdc.producer.publisher import EventPublisher
from spanner_cdc.producer.query import ChangeStreamQuery
from spanner_cdc.producer.release import CommitOrderRelease
from spanner_cdc.producer.shard_handover import ShardHandover
from spanner_cdc.producer.transaction_checkpoints import TransactionCheckpoints
from spanner_cdc.producer.watermarks import WatermarkEmitter, publish_periodically

log = logging.getLogger(__name__)


class ProducerService:
    def __init__(
        self,
        config: ProducerConfig,
        *,
        source: ChangeStreamSource,
        dialect: str,
        publisher: EventPublisher,
        checkpoints: CheckpointStore,
        scheduler: PartitionScheduler,
        metrics: ProducerMetrics,
        backfill: Backfill | None = None,
        group: ShardGroup | None = None,
    ) -> None:
        self.config = config
        #: The consumer group that assigns this process its shards (``--group``), or None.
        self.group = group
        #: The snapshot rows to publish alongside the changes (producer.backfill), or None.
        self.backfill = backfill
        self.publisher = publisher
        self.checkpoints = checkpoints
        self.scheduler = scheduler
        self.metrics = metrics
        self.release = CommitOrderRelease(scheduler, publisher, across_partitions=config.in_commit_order)
        actions = RecordActions(
            DataChangeAction(
                self.release, TableFilter(config.include_tables, config.exclude_tables), metrics
            ),
            HeartbeatAction(),
            ChildPartitionsAction(scheduler, checkpoints),
        )
        self.runner = PartitionRunner(
            source,
            ChangeStreamQuery(
                config.change_stream, dialect, config.heartbeat_ms, config.end_timestamp_micros
            ),
            scheduler=scheduler,
            actions=actions,
            release=self.release,
            checkpoints=checkpoints,
            metrics=metrics,
            max_queries=config.max_queries,
            query_start_rate=config.query_start_rate,
            stall_seconds=config.stall_seconds,
        )
        publisher.kafka.close_transactions_with(
            TransactionCheckpoints(scheduler, self.runner, self.release, checkpoints)
        )
        #: None with --no-watermark-records: nothing is written to the event topics but events.
        self.watermarks = (
            WatermarkEmitter(
                publisher.kafka, config.stream_name, publisher.sender.framing, publisher.sender.json_events
            )
            if config.watermark_records
            else None
        )
        self._stop = asyncio.Event()
        self._failure: SpannerCdcError | None = None
        watermarks = self.watermarks
        self.gauges = Gauges(
            metrics, scheduler, lambda: None if watermarks is None else watermarks.published_micros
        )
        self.tasks = PartitionTasks(scheduler, self.runner, self._fail, self._stop_when_done)
        self.rounds = CheckpointRounds(publisher.kafka, checkpoints, scheduler, self.runner, self.gauges)
        #: What the process does when the group moves shards (--group).
        self.handover = ShardHandover(
            publisher.kafka, checkpoints, scheduler, runner=self.runner, release=self.release,
            tasks=self.tasks, rounds=self.rounds, gauges=self.gauges, stopping=self._stop.is_set,
            on_failure=self._fail,
        )  # fmt: skip

    # --- lifecycle --------------------------------------------------------------------------

    def request_stop(self) -> None:
        """SIGINT/SIGTERM: stop reading, flush, checkpoint, return normally."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> None:
        """Until stopped, failed, or (with an end timestamp) every partition finished."""
        kafka = self.publisher.kafka
        poller_stop, group_stop = asyncio.Event(), asyncio.Event()
        poller = asyncio.create_task(kafka.run_poller(poller_stop))
        membership = (
            []
            if self.group is None
            else [  # the follower first: a shard's records are read at its takeover anyway
                self.tasks.watch(self.checkpoints.follow(self._records_seen, group_stop)),
                self.tasks.watch(self.group.run(self.handover, group_stop)),
            ]
        )
        rounds = self.rounds.periodically(self.config.checkpoint_interval, self._staying, self._fail)
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
            await self._stop.wait()
        finally:
            if self._failure is None:  # a failure said its own "stopping" line
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
            undelivered = await kafka.flush(FLUSH_TIMEOUT_SECONDS)
            if undelivered:
                log.warning(
                    "%d events still undelivered at shutdown; their partitions resume before them",
                    undelivered,
                )
            await self.rounds.last(self._staying())
            await self._publish_last_watermark()
            group_stop.set()  # leaving hands every shard back; their commits need the poller
            await asyncio.gather(*membership, return_exceptions=True)
            poller_stop.set()
            await poller
        if self._failure is not None:
            raise self._failure
        log.info("stopped: checkpoints written")

    def _fail(self, error: SpannerCdcError) -> None:
        if self._failure is None:
            self._failure = error
            log.error("stopping: %s", error)
        self._stop.set()

    def _stop_when_done(self) -> None:
        """With an end timestamp: stop once every partition finished and the backfill too."""
        if self.scheduler.all_finished() and (self.backfill is None or self.backfill.finished):
            if self.config.end_timestamp_micros is not None:
                log.info("every partition finished at the end timestamp")
            self._stop.set()

    async def _backfill(self, backfill: Backfill) -> None:
        try:
            await backfill.run()
        except SpannerCdcError as exc:
            self._fail(exc)
            return
        self._stop_when_done()

    def _records_seen(self, records: list[Partition]) -> None:
        """Other processes' checkpoint records: what they finished, registered and published."""
        self.scheduler.apply_records(records)
        if not self._stop.is_set():
            self.tasks.launch_runnable()

    # --- watermarks ------------------------------------------------------------------------

    async def safe_watermark(self) -> int | None:
        """Highest T with every change committed at or before T read, published and acknowledged
        (``producer.low_watermark``), taken under the release lock so no release is half done."""
        if not self.scheduler.owned:
            return None  # a member without shards vouches for nothing until it has some
        async with self.release.locked():
            safe = safe_watermark(
                self.scheduler.low_watermark_micros(),
                self.config.end_timestamp_micros,
                self.release.buffer.next_commit(),
                (run.tracker for run in self.runner.runs.values()),
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
