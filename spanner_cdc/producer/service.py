"""The producer: partitions scheduled by lineage, read concurrently, published, checkpointed.

One asyncio task per running partition. A partition's life (DESIGN §4, §5):

1. it runs once every parent finished, at most ``max_queries`` at a time, started no faster
   than ``query_start_rate``;
2. its records become events produced to Kafka; children it reports are written to the
   checkpoint topic, acknowledged, before anything else happens;
3. when its query ends normally and every event is acknowledged, it is FINISHED (persisted),
   and the children it unblocks start.

Alongside, the safe low watermark (every change committed at or before it read, published in
commit order and acknowledged) goes to every event-topic partition (producer.watermarks), so
consumers can tell when a transaction, and a moment of the whole database, is complete.

Transient Spanner errors, stalls and failed deliveries restart the partition's query from its
checkpoint with backoff; anything else stops the producer with one clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from asyncio_throttle.throttler import Throttler
from confluent_kafka import KafkaError, Message

from spanner_cdc.producer.acks import AckTracker
from spanner_cdc.producer.catalog import TableCatalog
from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.producer.kafka import KafkaPublisher, topic_for
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.ordering import CommitOrderBuffer
from spanner_cdc.producer.partitions import Partition, PartitionScheduler, PartitionState
from spanner_cdc.producer.query import ChangeStreamQuery
from spanner_cdc.producer.reader import TRANSIENT_ERRORS, QueryStalledError, QueryStream
from spanner_cdc.producer.spanner_source import SpannerSource
from spanner_cdc.producer.watermarks import WatermarkEmitter, publish_periodically
from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.events import Event, EventBuilder
from spanner_cdc.schemas.records import (
    ChangeStreamRecord,
    ChildPartitionsRecord,
    DataChangeRecord,
    HeartbeatRecord,
)
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.wire import WriterSchema, encode

log = logging.getLogger(__name__)
MAX_BACKOFF_SECONDS = 30.0
FLUSH_TIMEOUT_SECONDS = 60.0
#: Records held for commit-order release before partitions ahead of the low watermark pause.
MAX_HELD_RECORDS = 100_000


class ProducerError(RuntimeError):
    """A non-retryable error: the message is the one line the user sees."""


class DeliveryFailedError(Exception):
    """Kafka did not acknowledge an event of this partition run."""


RETRYABLE: tuple[type[Exception], ...] = (*TRANSIENT_ERRORS, QueryStalledError, DeliveryFailedError)


@dataclass
class Progress:
    """Counters the progress line and the tests read."""

    events_acked: int = 0
    started_at: float = field(default_factory=time.monotonic)


class ProducerService:
    def __init__(
        self,
        config: ProducerConfig,
        *,
        source: SpannerSource,
        publisher: KafkaPublisher,
        scheduler: PartitionScheduler,
        builder: EventBuilder,
        catalog: TableCatalog,
        metrics: ProducerMetrics,
    ) -> None:
        self.config = config
        self.source = source
        self.publisher = publisher
        self.scheduler = scheduler
        self.builder = builder
        self.catalog = catalog
        self.metrics = metrics
        self.progress = Progress()
        self.query = ChangeStreamQuery(
            config.change_stream, source.dialect, config.heartbeat_ms, config.end_timestamp_micros
        )
        self._slots = asyncio.Semaphore(config.max_queries)
        self._throttler = Throttler(rate_limit=max(1, round(config.query_start_rate)), period=1.0)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._trackers: dict[str, AckTracker] = {}
        self._writers: dict[tuple[str, str], tuple[WriterSchema, WriterSchema]] = {}
        self.watermarks = WatermarkEmitter(publisher, config.stream_name)
        self._held = CommitOrderBuffer()
        self._release_lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._failure: str | None = None
        self._stall_seconds = config.stall_heartbeats * config.heartbeat_ms / 1000

    # --- lifecycle --------------------------------------------------------------------------

    def request_stop(self) -> None:
        """SIGINT/SIGTERM: stop reading, flush, checkpoint, return normally."""
        self._stop.set()

    async def run(self) -> None:
        """Until stopped, failed, or (with an end timestamp) every partition finished."""
        poller_stop = asyncio.Event()
        poller = asyncio.create_task(self.publisher.run_poller(poller_stop))
        checkpointer = asyncio.create_task(self._checkpoint_periodically())
        watermarks = asyncio.create_task(
            publish_periodically(self.watermarks, self.safe_watermark, self.config.watermark_interval)
        )
        try:
            for partition in self.scheduler.resumable():
                self._launch(partition)
            self._launch_runnable()
            if self.scheduler.all_finished():
                self._stop.set()
            await self._stop.wait()
        finally:
            checkpointer.cancel()
            watermarks.cancel()
            # Under the release lock, so no partition task is stopped halfway through a release
            # (a record taken from the buffer but not yet produced would be in neither, and the
            # final checkpoint could pass it); then what the low watermark allows goes out too.
            async with self._release_lock:
                for task in self._tasks.values():
                    task.cancel()
                await asyncio.gather(checkpointer, watermarks, *self._tasks.values(), return_exceptions=True)
                await self._release_locked()
            undelivered = await self.publisher.flush(FLUSH_TIMEOUT_SECONDS)
            if undelivered:
                log.warning(
                    "%d events still undelivered at shutdown; their partitions resume before them",
                    undelivered,
                )
            await self._write_checkpoints(force=True)
            await self._publish_last_watermark()
            poller_stop.set()
            await poller
        if self._failure:
            raise ProducerError(self._failure)

    def _fail(self, message: str) -> None:
        if self._failure is None:
            self._failure = message
            log.error("stopping: %s", message)
        self._stop.set()

    def _launch_runnable(self) -> None:
        for partition in self.scheduler.runnable():
            self._launch(partition)
        if self.scheduler.all_finished() and self.config.end_timestamp_micros is not None:
            log.info("every partition finished at the end timestamp")
            self._stop.set()

    def _launch(self, partition: Partition) -> None:
        if partition.token in self._tasks:
            return
        if partition.state == PartitionState.CREATED:
            partition.state = PartitionState.RUNNING  # claimed: runnable() will not offer it again
        task = asyncio.create_task(self._run_partition(partition), name=f"partition {partition.token[:12]}")
        self._tasks[partition.token] = task
        task.add_done_callback(self._partition_done)

    def _partition_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        self._tasks = {token: t for token, t in self._tasks.items() if t is not task}
        error = task.exception()
        if error is not None:
            self._fail(str(error) if isinstance(error, ProducerError | ContractError) else repr(error))

    # --- one partition ----------------------------------------------------------------------

    async def _run_partition(self, partition: Partition) -> None:
        async with self._slots:
            async with self._throttler:
                pass
            self.scheduler.mark_running(partition)
            self.metrics.queries_started.labels("first").inc()
            attempt = 0
            while True:
                tracker = AckTracker()
                self._trackers[partition.token] = tracker
                partition.watermark_micros = partition.checkpoint_micros
                try:
                    await self._read(partition, tracker)
                    await self._published(tracker)
                    await tracker.drained()
                    if tracker.failed:
                        raise DeliveryFailedError(tracker.failed)
                    break
                except RETRYABLE as exc:
                    self._abandon(partition, tracker)
                    attempt += 1
                    delay = min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** min(attempt, 6))
                    log.warning(
                        "partition %s: %s; restarting from checkpoint in %.1fs",
                        partition.token[:16],
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    self.scheduler.note_retry(partition)
                    self.metrics.queries_started.labels("retry").inc()
                except ContractError:
                    raise
                except Exception as exc:
                    message = getattr(exc, "message", None) or str(exc)
                    raise ProducerError(f"partition query failed: {type(exc).__name__}: {message}") from exc
        partition.checkpoint_micros = max(partition.checkpoint_micros, partition.watermark_micros)
        self.scheduler.mark_finished(partition)
        await self.publisher.write_checkpoints([partition.to_json()])
        del self._trackers[partition.token]
        self._launch_runnable()

    def _abandon(self, partition: Partition, tracker: AckTracker) -> None:
        """Forget a failed run before its retry, so nothing it did can move the checkpoint.

        Its held records are dropped (the retry reads them again) and its tracker leaves the
        checkpoint loop: a stale tracker with nothing pending would otherwise report the run's
        watermark as safe while the records behind it were never published.
        """
        self._held.discard(tracker)
        self._trackers.pop(partition.token, None)
        partition.watermark_micros = partition.checkpoint_micros

    async def _read(self, partition: Partition, tracker: AckTracker) -> None:
        stream = QueryStream(
            partition.token,
            lambda: self.source.read(self.query, partition.query_token, partition.resume_micros),
        )
        stream.start()
        try:
            while True:
                await self._wait_for_room(partition)
                records = await stream.next(self._stall_seconds)
                if records is None:
                    break
                for record in records:
                    await self._handle(partition, tracker, record)
                await self._release()
                if tracker.failed:
                    raise DeliveryFailedError(tracker.failed)
        finally:
            stream.stop()
        if self.config.end_timestamp_micros is not None:
            # A query that ended normally returned everything up to the end timestamp.
            partition.watermark_micros = max(partition.watermark_micros, self.config.end_timestamp_micros)

    async def _handle(self, partition: Partition, tracker: AckTracker, record: ChangeStreamRecord) -> None:
        """Watermarks say what is complete: everything before a record's commit timestamp,
        everything at or before a heartbeat, everything before a child partition's start."""
        if isinstance(record, DataChangeRecord):
            if record.commit_timestamp_micros < partition.watermark_micros:
                # The partition had promised everything up to its watermark: a server bug, and
                # what a checkpoint written since may have skipped. Said loudly, handled anyway.
                self.metrics.late_records.inc()
                log.warning(
                    "partition %s returned a change committed at %d after reporting everything up to %d",
                    partition.token[:16],
                    record.commit_timestamp_micros,
                    partition.watermark_micros,
                )
            if self._wanted(record.table_name):
                self._held.hold(record, partition, tracker)
            partition.watermark_micros = max(partition.watermark_micros, record.commit_timestamp_micros - 1)
        elif isinstance(record, HeartbeatRecord):
            partition.watermark_micros = max(partition.watermark_micros, record.timestamp_micros)
        elif isinstance(record, ChildPartitionsRecord):
            partition.watermark_micros = max(partition.watermark_micros, record.start_timestamp_micros - 1)
            added = self.scheduler.register_children(record, partition.token)
            if added:
                await self.publisher.write_checkpoints([child.to_json() for child in added])

    async def _release(self) -> None:
        """Publish held records the low watermark has passed, in commit order (see ordering)."""
        if not len(self._held):
            return
        async with self._release_lock:
            await self._release_locked()

    async def _release_locked(self) -> None:
        for held in self._held.release(self.scheduler.low_watermark_micros()):
            await self.publish(held.record, held.partition, held.tracker)

    async def _published(self, tracker: AckTracker) -> None:
        """After a query ended: wait until the other partitions' progress released its records."""
        while self._held.holds(tracker):
            await self._release()
            await asyncio.sleep(0.02)

    async def _wait_for_room(self, partition: Partition) -> None:
        """Back-pressure: while too much is held, partitions ahead of the low watermark pause.

        The partitions holding the low watermark back never wait, so the buffer always drains.
        """
        while len(self._held) > MAX_HELD_RECORDS:
            low = self.scheduler.low_watermark_micros()
            if low is None or partition.watermark_micros <= low:
                return
            await self._release()
            await asyncio.sleep(0.02)

    def _wanted(self, table: str) -> bool:
        include, exclude = self.config.include_tables, self.config.exclude_tables
        if include and not any(fnmatch.fnmatchcase(table, pattern) for pattern in include):
            return False
        return not any(fnmatch.fnmatchcase(table, pattern) for pattern in exclude)

    async def _table_schema(self, record: DataChangeRecord) -> TableSchema:
        """The record's table version, every column listed (see producer.catalog)."""
        table = self.catalog.cached_schema(record.table_name, record.column_types)
        if table is None:
            if self.catalog.needs_refresh(record.table_name, record.column_types):
                log.info("table %s: columns differ from the catalog; reading it again", record.table_name)
                await asyncio.to_thread(self.catalog.refresh)
            table = self.catalog.table_schema(record.table_name, record.column_types)
        return table

    async def publish(self, record: DataChangeRecord, partition: Partition, tracker: AckTracker) -> None:
        """One data change record's events, produced; their acks are counted by ``tracker``."""
        read_millis = int(time.time() * 1000)
        table = await self._table_schema(record)
        events = self.builder.build(record, partition.query_token, read_millis, table)
        if not events:
            return
        topic = topic_for(self.config.topic_prefix, record.table_name)
        writer, key_writer = await self._writers_for(table, topic)
        commit = record.commit_timestamp_micros
        for event in events:
            tracker.sent(commit)
            self.publisher.produce(
                topic,
                encode(key_writer, event.key),
                encode(writer, event.value),
                self._on_delivery(tracker, event),
            )
        self.publisher.poll()

    async def _writers_for(self, table: TableSchema, topic: str) -> tuple[WriterSchema, WriterSchema]:
        cache_key = (table.table, table.schema_key)
        writers = self._writers.get(cache_key)
        if writers is None:
            writers = (
                WriterSchema.from_schema(table.event_schema),
                WriterSchema.from_schema(table.key_schema),
            )
            await self.publisher.ensure_topic(topic)
            for writer in writers:
                await self.publisher.ensure_schema(writer)
            self._writers[cache_key] = writers
            log.info(
                "table %s: schema %s published (fingerprint %s)",
                table.table,
                table.schema_key[:12],
                writers[0].fingerprint_hex,
            )
        return writers

    def _on_delivery(self, tracker: AckTracker, event: Event) -> Callable[[KafkaError | None, Message], None]:
        metadata = event.value["source_metadata"]
        commit = metadata["commit_timestamp"]
        table, change_type = metadata["table"], metadata["change_type"]

        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                self.metrics.delivery_errors.inc()
                tracker.delivery_failed(error.str())
                return
            tracker.acknowledged(commit)
            self.progress.events_acked += 1
            self.metrics.events.labels(table, change_type).inc()
            self.metrics.observe_commit_to_ack(max(0.0, time.time() - commit / 1_000_000))

        return delivered

    # --- watermarks, checkpoints and metrics ----------------------------------------------

    async def safe_watermark(self) -> int | None:
        """Highest T with every change committed at or before T read, published and acknowledged.

        Taken under the release lock, so no release is half done: everything the low watermark
        let out has been handed to Kafka, and what is still held or unacknowledged bounds T.
        With an end timestamp and every partition finished, T is the end timestamp.
        """
        async with self._release_lock:
            safe = self.scheduler.low_watermark_micros()
            if safe is None:
                safe = self.config.end_timestamp_micros
            if safe is None:
                return None
            next_held = self._held.next_commit()
            if next_held is not None:
                safe = min(safe, next_held - 1)
            for tracker in self._trackers.values():
                safe = tracker.checkpoint(safe)
            return safe

    async def _publish_last_watermark(self) -> None:
        """At shutdown, after the flush: how far consumers may trust what this run wrote."""
        try:
            safe = await self.safe_watermark()
            await asyncio.wait_for(self.watermarks.publish(safe), FLUSH_TIMEOUT_SECONDS)
        except Exception as exc:  # the events and checkpoints are safe; only the stamp is missing
            log.warning("could not publish the last watermark: %s", exc)

    async def _checkpoint_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.checkpoint_interval)
            await self._write_checkpoints(force=False)

    async def _write_checkpoints(self, force: bool) -> None:
        changed = []
        for partition in self.scheduler.partitions.values():
            tracker = self._trackers.get(partition.token)
            if partition.state != PartitionState.RUNNING or tracker is None:
                continue
            safe = tracker.checkpoint(partition.watermark_micros)
            oldest_held = self._held.oldest(tracker)
            if oldest_held is not None:
                safe = min(safe, oldest_held - 1)
            advanced = max(partition.checkpoint_micros, safe)
            if advanced != partition.checkpoint_micros or force:
                partition.checkpoint_micros = advanced
                changed.append(partition.to_json())
        if changed:
            await self.publisher.write_checkpoints(changed)
        self._update_gauges()

    def _update_gauges(self) -> None:
        for state, count in self.scheduler.count_by_state().items():
            self.metrics.partitions.labels(state.value).set(count)
        low = self.scheduler.low_watermark_micros()
        if low is not None:
            self.metrics.low_watermark_lag.set(max(0.0, time.time() - low / 1_000_000))
        published = self.watermarks.published_micros
        if published is not None:
            self.metrics.published_watermark_lag.set(max(0.0, time.time() - published / 1_000_000))

    async def wait_until(self, condition: Callable[[], bool], timeout: float) -> None:
        """For callers that drive the service (tests, the demo): poll ``condition``."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self._stop.is_set():
                raise ProducerError(self._failure or "producer stopped")
            if time.monotonic() > deadline:
                raise TimeoutError("condition not reached")
            await asyncio.sleep(0.1)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ProducerService]:
        """Run in the background for the duration of the block, then stop and wait."""
        task = asyncio.create_task(self.run())
        try:
            yield self
        finally:
            self.request_stop()
            await task
