"""The producer's supervisor: wires the parts, runs one task per partition, stops cleanly.

A partition's life is in ``producer.partition_run``; what each record does, in
``producer.actions``; publishing, in ``producer.publisher``. Here: which partitions run (the
scheduler's lineage rules decide), the periodic checkpoints and watermark records, the gauges,
and the order of a shutdown. Any partition failing for good stops the producer with its one line.

With ``--group`` (producer.group) the process runs the partitions of the shards the group
assigned it: it takes a shard over (fencing its previous owner's writer, then reading its
checkpoints), gives one back when the group moves it (its queries stopped, its events and
checkpoints committed first), and follows every other process's checkpoint records for lineage
and the group's low watermark (CheckpointStore.follow).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from spanner_cdc.errors import SpannerCdcError
from spanner_cdc.producer.actions import (
    ChildPartitionsAction,
    DataChangeAction,
    HeartbeatAction,
    RecordActions,
    TableFilter,
)
from spanner_cdc.producer.backfill import Backfill
from spanner_cdc.producer.checkpoints import CheckpointStore
from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.producer.errors import (
    DeliveryFailedError,
    GroupMembershipLostError,
    KafkaClientLostError,
    ProducerError,
)
from spanner_cdc.producer.group import ShardGroup
from spanner_cdc.producer.low_watermark import safe_watermark
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.partition_run import ChangeStreamSource, PartitionRunner
from spanner_cdc.producer.partitions import ROOT, Partition, PartitionScheduler, PartitionState, shard_of
from spanner_cdc.producer.publisher import EventPublisher
from spanner_cdc.producer.query import ChangeStreamQuery
from spanner_cdc.producer.release import CommitOrderRelease
from spanner_cdc.producer.transaction_checkpoints import TransactionCheckpoints
from spanner_cdc.producer.watermarks import WatermarkEmitter, publish_periodically
from spanner_cdc.schemas.timestamps import seconds_behind

log = logging.getLogger(__name__)
FLUSH_TIMEOUT_SECONDS = 60.0


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
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: Shards being handed back: nothing of theirs starts, nor is checkpointed but by the
        #: handover, from its first step on (their writers go at its end).
        self._leaving: set[int] = set()
        self._stop = asyncio.Event()
        self._failure: SpannerCdcError | None = None

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
                self._watch(self.checkpoints.follow(self._records_seen, group_stop)),
                self._watch(self.group.run(self, group_stop)),
            ]
        )
        background = [asyncio.create_task(self._checkpoint_periodically())]
        if self.backfill is not None:
            background.append(asyncio.create_task(self._backfill(self.backfill)))
        if self.watermarks is not None:
            interval = self.config.watermark_interval
            background.append(
                asyncio.create_task(publish_periodically(self.watermarks, self.safe_watermark, interval))
            )
        try:
            for partition in self.scheduler.resumable():
                self._launch(partition)
            self._launch_runnable()
            await self._stop.wait()
        finally:
            if self._failure is None:  # a failure said its own "stopping" line
                log.info(
                    "stopping: ending %d partition queries, then flushing to Kafka and writing checkpoints",
                    len(self._tasks),
                )
            for task in background:
                task.cancel()
            # Under the release lock, so no partition task is stopped halfway through a release;
            # then what the low watermark allows goes out too.
            async with self.release.locked():
                for task in self._tasks.values():
                    task.cancel()
                await asyncio.gather(*background, *self._tasks.values(), return_exceptions=True)
                # Shards the group took without a handover (shards_lost) while their queries ran
                # on: what those held is not this process's to send any more.
                self._forget_runs(set(range(self.scheduler.shards)) - self.scheduler.owned)
                await self.release.release_locked()
            undelivered = await kafka.flush(FLUSH_TIMEOUT_SECONDS)
            if undelivered:
                log.warning(
                    "%d events still undelivered at shutdown; their partitions resume before them",
                    undelivered,
                )
            await self._write_last_checkpoints()
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

    def _launch_runnable(self) -> None:
        for partition in self.scheduler.runnable():
            self._launch(partition)
        self._stop_when_done()

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

    def _watch(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task whose failure stops the producer with its one line."""
        task = asyncio.create_task(work)
        task.add_done_callback(self._task_done)
        return task

    def _records_seen(self, records: list[Partition]) -> None:
        """Other processes' checkpoint records: what they finished, registered and published."""
        self.scheduler.apply_records(records)
        if not self._stop.is_set():
            self._launch_runnable()

    # --- shards (--group) -----------------------------------------------------------------

    async def take_shards(self, shards: list[int]) -> None:
        """The group assigned ``shards`` to this process: fence their previous owner's writer,
        read their checkpoints as it left them, and run their partitions."""
        kafka = self.publisher.kafka
        await asyncio.gather(*(kafka.take_over(shard) for shard in shards))  # 0.5 s each, measured
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
        self._update_gauges()
        if not self._stop.is_set():
            for partition in self.scheduler.resumable():
                self._launch(partition)
            self._launch_runnable()

    async def give_back_shards(self, shards: list[int]) -> None:
        """The group moves ``shards`` to another process: stop their queries, commit their
        events, write their checkpoints, then let them go — only then may the next owner start."""
        moving = set(shards)
        self._leaving |= moving
        try:
            await self._hand_over(moving)
        finally:
            self._leaving -= moving
        log.info("shards %s handed back to the group", ",".join(map(str, shards)))
        self._update_gauges()

    async def _hand_over(self, moving: set[int]) -> None:
        kafka = self.publisher.kafka
        tasks = [
            task for token, task in self._tasks.items() if shard_of(token, self.scheduler.shards) in moving
        ]
        async with self.release.locked():
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = {token: task for token, task in self._tasks.items() if task not in tasks}
        await kafka.flush(FLUSH_TIMEOUT_SECONDS)
        try:
            await self._write_checkpoints(shards=moving)
        except (KafkaClientLostError, DeliveryFailedError) as exc:
            log.warning("shards %s: the last checkpoints were not written (%s)", sorted(moving), exc)
        self._forget_runs(moving)
        for shard in sorted(moving):
            self.scheduler.hand_back(shard)
            await kafka.hand_back(shard)

    def _forget_runs(self, shards: set[int]) -> None:
        """Drop the runs of the tokens in ``shards`` and the events they hold: the shards' next
        owner reads them again from their checkpoints."""
        for token in [t for t in self.runner.runs if shard_of(t, self.scheduler.shards) in shards]:
            self.release.buffer.discard(self.runner.runs.pop(token).tracker)
            self.checkpoints.due.discard(token)

    def shards_lost(self, shards: list[int]) -> None:
        """The group took ``shards`` without a handover (the session expired): their writers
        are fenced, or about to be. Nothing more is written for them; the producer stops."""
        kafka = self.publisher.kafka
        for shard in shards:
            self.scheduler.hand_back(shard)
            kafka.drop(shard)
        self._fail(
            GroupMembershipLostError(
                f"shards {','.join(map(str, shards))} were taken from this process: it was paused or cut "
                "off for longer than --group-session-timeout; it stops (start it again to rejoin)"
            )
        )

    def _launch(self, partition: Partition) -> None:
        leaving = shard_of(partition.token, self.scheduler.shards) in self._leaving
        if partition.token in self._tasks or leaving:
            return
        if partition.state == PartitionState.CREATED:
            partition.state = PartitionState.RUNNING  # claimed: runnable() will not offer it again
        task = asyncio.create_task(
            self.runner.run(partition, self._launch_runnable), name=f"partition {partition.token[:12]}"
        )
        self._tasks[partition.token] = task
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """A partition's task (or a group member's) ended: a failure stops the producer."""
        if task.cancelled():
            return
        self._tasks = {token: t for token, t in self._tasks.items() if t is not task}
        error = task.exception()
        if error is not None:
            self._fail(error if isinstance(error, SpannerCdcError) else ProducerError(repr(error)))

    # --- watermarks, checkpoints and gauges -----------------------------------------------

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

    async def _checkpoint_periodically(self) -> None:
        """Every interval, the checkpoints that advanced without events to carry them
        (heartbeats); a round Kafka did not acknowledge is retried at the next one (the
        checkpoints on Kafka stay behind, which only means a restart repeats events), unless the
        client failed for good: then the producer stops."""
        interval = self.config.checkpoint_interval
        while True:
            await asyncio.sleep(interval)
            try:
                failed = await self.publisher.kafka.commit_checkpoints(self._staying())
            except KafkaClientLostError as exc:
                self._fail(exc)
                return
            if failed:
                log.warning("checkpoints not acknowledged; retrying in %.1fs", interval)
            self._update_gauges()

    def _staying(self) -> set[int]:
        """The shards this process owns and is not handing back."""
        return self.scheduler.owned - self._leaving

    async def _write_last_checkpoints(self) -> None:
        """At shutdown: a failure is one line, and the next run resumes from those written before."""
        try:
            await self._write_checkpoints(self._staying())
        except (KafkaClientLostError, DeliveryFailedError) as exc:
            log.warning(
                "the last checkpoints were not written (%s); the next run resumes from earlier ones", exc
            )

    async def _write_checkpoints(self, shards: set[int]) -> None:
        """The record of every running partition of ``shards``, advanced or not, committed by
        their writers (as every running partition's record is: producer.transaction_checkpoints)."""
        self.checkpoints.due |= {
            token
            for token in self.runner.runs
            if self.scheduler.partitions[token].state == PartitionState.RUNNING
            and shard_of(token, self.scheduler.shards) in shards
        }
        if await self.publisher.kafka.commit_checkpoints(shards):
            raise DeliveryFailedError("checkpoints not acknowledged")
        self._update_gauges()

    def _update_gauges(self) -> None:
        for state, count in self.scheduler.count_by_state().items():
            self.metrics.partitions.labels(state.value).set(count)
        self.metrics.shards_owned.set(len(self.scheduler.owned))
        self.metrics.partitions_owned.set(
            sum(1 for p in self.scheduler.unfinished() if self.scheduler.mine(p.token))
        )
        low = self.scheduler.low_watermark_micros()
        if low is not None:
            self.metrics.low_watermark_lag.set(seconds_behind(low))
        published = None if self.watermarks is None else self.watermarks.published_micros
        if published is not None:
            self.metrics.published_watermark_lag.set(seconds_behind(published))
