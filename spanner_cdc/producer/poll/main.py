"""Wiring of ``spanner-cdc poll``: check the table and its column, own the topic prefix, restore
the position, poll until told to stop (``producer.poll``)."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress

from spanner_cdc.common.blocking import call_with_deadline
from spanner_cdc.common.heap import settle_heap
from spanner_cdc.common.progress import show_progress
from spanner_cdc.errors import UsageError
from spanner_cdc.producer.backfill.runner import BackfillTable
from spanner_cdc.producer.main import event_builder, event_sender, open_kafka
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.poll.config import PollConfig
from spanner_cdc.producer.poll.poller import Poller
from spanner_cdc.producer.poll.store import PollPosition, poll_store
from spanner_cdc.producer.publish.kafka import FLUSH_TIMEOUT_SECONDS, KafkaClient
from spanner_cdc.producer.publish.watermarks import WatermarkEmitter, publish_periodically
from spanner_cdc.producer.spanner.catalog import TableCatalog
from spanner_cdc.producer.spanner.database import SpannerDatabase
from spanner_cdc.producer.spanner.schema import SpannerSchema
from spanner_cdc.schemas.timestamps import clock_text, seconds_behind

log = logging.getLogger(__name__)


async def build_poller(config: PollConfig, metrics: ProducerMetrics) -> Poller:
    """Spanner and Kafka checked, the table's position restored or started."""
    database = await SpannerDatabase.open(config)
    schema = SpannerSchema(database)
    catalog = TableCatalog(database.dialect, schema.load_catalog)
    await call_with_deadline(catalog.refresh, config.connect_timeout_seconds)
    table, column = config.table, config.commit_timestamp_column
    if table not in catalog.columns:
        raise UsageError(f"--table {table}: no such table in {database.database_path}")
    if column not in catalog.commit_timestamp_columns.get(table, frozenset()):
        raise UsageError(
            f"--commit-timestamp-column {column}: not a column of {table} with allow_commit_timestamp=true "
            "(only such a column holds commit timestamps a poll can rely on)"
        )
    kafka, existing = await open_kafka(config)
    await kafka.take_over()  # a poller still writing to the prefix is fenced before the positions are read
    store = poll_store(kafka)
    positions = await call_with_deadline(store.read, 60)
    _own_prefix(kafka, config, positions, existing)
    await kafka.ensure_topic(kafka.topics.schemas, compacted=True)
    await kafka.ensure_topic(kafka.topics.dead_letters)
    await kafka.ensure_topic(kafka.topics.event(table))
    position = positions.get(table)
    if position is None:
        start = config.start_timestamp_micros
        # The row versions of the first poll are compared with the table just before the start.
        position = PollPosition(table, column, max(start - 1, 0), start)
    keys = await call_with_deadline(schema.primary_keys, config.connect_timeout_seconds)
    return Poller(
        database=database.database,
        dialect=database.dialect,
        table=BackfillTable.from_catalog(catalog, table, keys.get(table, [])),
        column=column,
        position=position,
        builder=event_builder(config, database.dialect),
        sender=await event_sender(config, kafka, metrics),
        store=store,
        interval=config.interval,
    )


def _own_prefix(
    kafka: KafkaClient, config: PollConfig, positions: dict[str, PollPosition], existing: set[str]
) -> None:
    """One writer of watermark records per topic prefix: a record promises every event topic of
    the prefix, so a prefix shared with a change-stream producer or another poll would make
    one writer's promise cover the other's rows."""
    others = sorted(set(positions) - {config.table})
    if others:
        raise UsageError(
            f"--topic-prefix {config.topic_prefix} is polled for {others[0]} already: give each "
            "polled table a topic prefix of its own"
        )
    position = positions.get(config.table)
    if position is not None and position.column != config.commit_timestamp_column:
        raise UsageError(
            f"--topic-prefix {config.topic_prefix} polls {config.table} by {position.column}, not "
            f"{config.commit_timestamp_column}: give another topic prefix to poll by another column"
        )
    if kafka.topics.checkpoints in existing:
        raise UsageError(
            f"--topic-prefix {config.topic_prefix} belongs to a change-stream producer: give the poll "
            "a topic prefix of its own"
        )


def describe(poller: Poller, started_at: float) -> str:
    """The progress line: rows/s, the boundary, how far the last finished poll is behind."""
    elapsed = max(1e-9, time.monotonic() - started_at)
    position = poller.position
    complete = poller.complete_micros
    lag = "-" if complete is None else f"{seconds_behind(complete):.1f}s"
    return (
        f"{position.table}: rows {poller.rows_published} ({poller.rows_published / elapsed:,.0f}/s)  "
        f"lag {lag}  boundary {clock_text(position.boundary_micros)}"
    )


async def poll(config: PollConfig) -> None:
    """The whole command; SIGINT/SIGTERM end it, a running poll included (producer.poll)."""
    metrics = ProducerMetrics()
    poller = await build_poller(config, metrics)
    settle_heap()
    kafka = poller.sender.kafka
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    # Read when scraped: a poll that hangs shows as a lag that grows.
    metrics.low_watermark_lag.set_function(lambda: seconds_behind(poller.complete_micros or 0))
    metrics.serve(config.metrics_port, config.metrics_host)
    progress_stop = asyncio.Event()
    started_at = time.monotonic()
    progress = asyncio.create_task(
        show_progress(lambda: describe(poller, started_at), progress_stop, config.progress)
    )
    watermarks = (
        WatermarkEmitter(kafka, config.stream_name, poller.sender.framing, config.json_events)
        if config.watermark_records
        else None
    )
    try:
        async with kafka.serving():
            await _poll_and_stamp(poller, stop, watermarks, config.watermark_interval)
    finally:
        progress_stop.set()
        await asyncio.gather(progress, return_exceptions=True)
        metrics.close()


async def _poll_and_stamp(
    poller: Poller, stop: asyncio.Event, watermarks: WatermarkEmitter | None, interval: float
) -> None:
    """Poll until ``stop``, stamping the newest complete poll every ``interval``; then, after a
    failure too, stop stamping, wait for Kafka's acknowledgements and stamp once more — before
    the client's last commit, so no stamp is left in a transaction nobody commits."""
    stamping = (
        None
        if watermarks is None
        else asyncio.create_task(publish_periodically(watermarks, _complete(poller), interval))
    )
    try:
        await poller.run(stop)
    finally:
        if stamping is not None:
            stamping.cancel()
            await asyncio.gather(stamping, return_exceptions=True)
        await poller.sender.kafka.flush(FLUSH_TIMEOUT_SECONDS)
        if watermarks is not None:
            with suppress(Exception):  # the rows and position are safe; only the stamp is missing
                await watermarks.publish(poller.complete_micros)


def _complete(poller: Poller) -> Callable[[], Awaitable[int | None]]:
    async def complete() -> int | None:
        return poller.complete_micros

    return complete
