"""Wiring of ``spanner-cdc produce``: open both ends, restore checkpoints, run until told to stop."""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import time

from spanner_cdc.common.blocking import call_with_deadline
from spanner_cdc.common.progress import show_progress
from spanner_cdc.producer.catalog import TableCatalog
from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.producer.kafka import KafkaPublisher
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.partitions import Partition, PartitionScheduler, PartitionState
from spanner_cdc.producer.query import POSTGRESQL
from spanner_cdc.producer.service import ProducerService
from spanner_cdc.producer.spanner_source import CONNECT_TIMEOUT_SECONDS, SpannerSource
from spanner_cdc.schemas.events import EventBuilder


async def build_service(config: ProducerConfig) -> ProducerService:
    """Check Spanner and Kafka, restore or start the partition table, and build the service."""
    source = await SpannerSource.open(config.project, config.instance, config.database, config.emulator_host)
    await source.check_change_stream(config.change_stream)
    catalog = TableCatalog(source.dialect, source.load_catalog)
    await call_with_deadline(catalog.refresh, CONNECT_TIMEOUT_SECONDS)
    builder = EventBuilder(
        stream_name=config.stream_name,
        database=config.database,
        default_schema="public" if source.dialect == POSTGRESQL else "",
        commit_timestamp_columns=catalog.commit_timestamp_columns,
    )
    publisher = KafkaPublisher(
        config.kafka_bootstrap,
        config.topic_prefix,
        config.kafka_config,
        config.topic_partitions,
        config.replication_factor,
    )
    await publisher.check_reachable()
    await publisher.ensure_topic(publisher.schemas_topic, compacted=True)
    await publisher.ensure_topic(publisher.checkpoints_topic, compacted=True)
    states = await call_with_deadline(publisher.read_checkpoints, 60)
    scheduler = (
        PartitionScheduler.restored(Partition.from_json(state) for state in states)
        if states
        else PartitionScheduler.starting_at(config.start_timestamp_micros)
    )
    return ProducerService(
        config,
        source=source,
        publisher=publisher,
        scheduler=scheduler,
        builder=builder,
        catalog=catalog,
        metrics=ProducerMetrics(),
    )


def describe(service: ProducerService) -> str:
    """The progress line: events/s, lag, partitions running/finished, low watermark."""
    elapsed = max(1e-9, time.monotonic() - service.progress.started_at)
    counts = service.scheduler.count_by_state()
    low = service.scheduler.low_watermark_micros()
    if low is None:
        watermark, lag = "all partitions finished", "-"
    else:
        moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=low)
        watermark = moment.strftime("%H:%M:%S.%f")[:-3]
        lag = f"{max(0.0, time.time() - low / 1e6):.1f}s"
    acked = service.progress.events_acked
    return (
        f"events {acked} ({acked / elapsed:,.0f}/s)  lag {lag}  "
        f"partitions running {counts[PartitionState.RUNNING]} waiting {counts[PartitionState.CREATED]} "
        f"finished {counts[PartitionState.FINISHED]}  low watermark {watermark}"
    )


async def produce(config: ProducerConfig) -> None:
    """The whole command; SIGINT/SIGTERM stop it cleanly (flush, checkpoint, return)."""
    service = await build_service(config)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, service.request_stop)
    service.metrics.serve(config.metrics_port)
    progress_stop = asyncio.Event()
    progress = asyncio.create_task(show_progress(lambda: describe(service), progress_stop, config.progress))
    try:
        await service.run()
    finally:
        progress_stop.set()
        await progress
        service.metrics.close()
