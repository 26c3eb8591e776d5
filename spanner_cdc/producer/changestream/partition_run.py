"""One partition's life: query it, hand its records to the actions, finish it.

A partition's query runs once its parents finished (the scheduler decides), holding one of at
most ``--max-queries`` slots while it reads, started no faster than ``--query-start-rate``. When
the query ends normally the partition waits — without its slot, so waiting partitions can never
starve the ones they wait for — until its held records were released in commit order and Kafka
acknowledged every event; then it is FINISHED and that state is checkpointed.

Failures that may pass (``producer.retry``) restart the query with backoff, after what the
failed run delivered; the failed run is forgotten first, so nothing it did later can move the
checkpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Protocol

from asyncio_throttle.throttler import Throttler

from spanner_cdc.errors import SpannerCdcError
from spanner_cdc.producer.changestream.actions import PartitionRun, RecordActions
from spanner_cdc.producer.changestream.release import CommitOrderRelease
from spanner_cdc.producer.errors import DeliveryFailedError, ProducerError, QueryEndedEarlyError
from spanner_cdc.producer.lineage.acks import AckTracker
from spanner_cdc.producer.lineage.low_watermark import advanced_checkpoint
from spanner_cdc.producer.lineage.partitions import Partition, PartitionScheduler, PartitionState
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.publish.checkpoints import CheckpointStore
from spanner_cdc.producer.retry import backoff_seconds, is_retryable
from spanner_cdc.producer.spanner.query import ChangeStreamQuery
from spanner_cdc.producer.spanner.reader import QueryStream
from spanner_cdc.schemas.records import ChangeStreamRecord
from spanner_cdc.schemas.timestamps import now_micros

log = logging.getLogger(__name__)


class ChangeStreamSource(Protocol):
    """Where partition queries run: Spanner (``producer.spanner.change_stream``) or a recorded script."""

    def read(
        self, query: ChangeStreamQuery, token: str | None, start_micros: int
    ) -> Iterator[list[ChangeStreamRecord]]: ...


class PartitionRunner:
    def __init__(
        self,
        source: ChangeStreamSource,
        query: ChangeStreamQuery,
        *,
        scheduler: PartitionScheduler,
        actions: RecordActions,
        release: CommitOrderRelease,
        checkpoints: CheckpointStore,
        metrics: ProducerMetrics,
        max_queries: int,
        query_start_rate: float,
        stall_seconds: float,
    ) -> None:
        self.source = source
        self.query = query
        self.scheduler = scheduler
        self.actions = actions
        self.release = release
        self.checkpoints = checkpoints
        self.metrics = metrics
        self.stall_seconds = stall_seconds
        #: The current run of every partition being read; checkpoints and watermarks use them.
        self.runs: dict[str, PartitionRun] = {}
        self._slots = asyncio.Semaphore(max_queries)
        self._throttler = Throttler(rate_limit=max(1, round(query_start_rate)), period=1.0)

    def trackers(self) -> list[AckTracker]:
        """The acknowledgements of every run being read."""
        return [run.tracker for run in self.runs.values()]

    def forget(self, token: str) -> AckTracker:
        """Drop ``token``'s run (its shard went to another process); its acknowledgements."""
        return self.runs.pop(token).tracker

    async def run(self, partition: Partition, on_finished: Callable[[], None]) -> None:
        """Read ``partition`` until it finished; ``on_finished`` then starts what it unblocked."""
        first = True
        attempt = 0
        while True:
            run = PartitionRun(partition, AckTracker())
            try:
                async with self._slots:
                    async with self._throttler:
                        pass
                    if first:
                        self.scheduler.mark_running(partition)
                        self.metrics.queries_started.labels("first").inc()
                        first = False
                    self._begin(run)
                    await self._read(run)
                await self.release.wait_published(run.tracker)
                finished = self._send_finished(run)
                await run.tracker.drained()
                _raise_delivery_failure(run.tracker)
                await run.children_registered()
                break
            except Exception as exc:
                if not is_retryable(exc):
                    raise _final(exc) from exc
                await self._abandon(run)
                attempt += 1
                delay = backoff_seconds(attempt)
                log.warning(
                    "partition %s: %s; restarting from checkpoint in %.1fs", partition.token[:16], exc, delay
                )
                await asyncio.sleep(delay)
                self.scheduler.note_retry(partition)
                self.metrics.queries_started.labels("retry").inc()
        try:  # committed with its last events, most often: awaited by now
            await finished
        except DeliveryFailedError as exc:  # a restart reads it again: its changes twice, none lost
            log.warning(
                "partition %s finished, but its last checkpoint was not written: %s",
                partition.token[:16],
                exc,
            )
        partition.checkpoint_micros = partition.finished_checkpoint_micros
        self.scheduler.mark_finished(partition)
        self.checkpoints.not_due(partition.token)
        del self.runs[partition.token]
        on_finished()

    def _send_finished(self, run: PartitionRun) -> asyncio.Future[None]:
        """Send the partition's FINISHED record, at its watermark, behind every event it
        published and every child it registered; its commit. It commits with the last of them
        (that transaction then carries no running record of it: ``PartitionRun.finish_staged``)
        or after them, and fails with any of them — a failure already reported is raised here
        instead, since a record sent now could commit in a later transaction than the one that
        failed. Sending it asks for that commit at once rather than at the end of the interval.
        The partition counts as finished, and its children start, once the record committed: no
        extra commit when its last events are still in the open transaction."""
        _raise_delivery_failure(run.tracker)
        run.raise_failed_registration()
        partition = run.partition
        record = dataclasses.replace(
            partition, state=PartitionState.FINISHED, checkpoint_micros=partition.finished_checkpoint_micros
        )
        return run.finishing(self.checkpoints.send([record], on_staged=run.stage_finish))

    def _begin(self, run: PartitionRun) -> None:
        run.partition.watermark_micros = run.partition.checkpoint_micros
        self.runs[run.partition.token] = run

    async def _abandon(self, run: PartitionRun) -> None:
        """Forget a failed run before its retry, once nothing it sent can still reach a reader.

        Its held records are dropped (the retry reads them again). The events it sent are still
        in Kafka's hands and may yet commit — a Spanner error or a stall fails the run, not its
        transaction — so the retry waits for their reports and resumes after what they
        delivered: starting at the older checkpoint would send those events a second time. A
        run whose delivery failed resumes from the checkpoint (its failed event bounds it).
        The run then leaves the checkpoint loop: a stale run with nothing pending would
        otherwise report its watermark as safe while the records behind it were never published.
        """
        partition = run.partition
        oldest_held = self.release.oldest(run.tracker)
        self.release.discard(run.tracker)
        if oldest_held is not None:
            partition.watermark_micros = min(partition.watermark_micros, oldest_held - 1)
        await run.tracker.settled()
        await run.settled()
        if run.tracker.failed is None and run.tracker.fatal is None:
            partition.checkpoint_micros = advanced_checkpoint(partition, run.tracker, None)
        if self.runs.get(partition.token) is run:
            del self.runs[partition.token]
        partition.watermark_micros = partition.checkpoint_micros

    async def _read(self, run: PartitionRun) -> None:
        partition = run.partition
        stream = QueryStream(
            partition.token,
            lambda: self.source.read(self.query, partition.query_token, partition.resume_micros),
        )
        stream.start()
        # With --log-level debug a run's log says when each token was read, and by which process
        # of a group: a token read by two processes at once is a defect the tests look for.
        log.debug("partition %s: query started at %d", partition.token, partition.resume_micros)
        try:
            while True:
                await self.release.wait_for_room(partition)
                records = await stream.next(self.stall_seconds)
                if records is None:
                    break
                for record in records:
                    self.actions.apply(run, record)
                await self.release.release()
                _raise_delivery_failure(run.tracker)
        finally:
            stream.stop()
            log.debug("partition %s: query stopped", partition.token)
        self._ended(run)

    def _ended(self, run: PartitionRun) -> None:
        """The query ended normally: at the end timestamp, or after reporting its children."""
        end = self.query.end_timestamp_micros
        if not run.reported_children and (end is None or now_micros() < end):
            self.metrics.queries_ended_early.inc()
            raise QueryEndedEarlyError(
                "the query ended before the end timestamp without reporting child partitions"
            )
        if end is not None:
            # A query that ended normally returned everything up to the end timestamp.
            run.partition.watermark_micros = max(run.partition.watermark_micros, end)


def _raise_delivery_failure(tracker: AckTracker) -> None:
    if tracker.fatal:
        raise ProducerError(tracker.fatal)
    if tracker.failed:
        raise DeliveryFailedError(tracker.failed)


def _final(error: Exception) -> SpannerCdcError:
    """A failure that ends the producer, as one line."""
    if isinstance(error, SpannerCdcError):
        return error
    message = getattr(error, "message", None) or str(error)
    return ProducerError(f"partition query failed: {type(error).__name__}: {message}")
