"""Wiring of ``spanner-cdc produce``: open both ends, restore checkpoints, run until told to stop."""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from spanner_cdc.common.blocking import call_with_deadline
from spanner_cdc.common.heap import settle_heap
from spanner_cdc.common.progress import show_progress
from spanner_cdc.common.schema_registry import SchemaRegistry
from spanner_cdc.errors import UsageError
from spanner_cdc.producer.backfill.runner import Backfill, BackfillTable
from spanner_cdc.producer.backfill.store import TablePlan, backfill_store
from spanner_cdc.producer.change_stream_rules import POSTGRESQL
from spanner_cdc.producer.changestream.actions import (
    ChildPartitionsAction,
    DataChangeAction,
    HeartbeatAction,
    RecordActions,
    TableFilter,
)
from spanner_cdc.producer.changestream.gauges import Gauges
from spanner_cdc.producer.changestream.partition_run import ChangeStreamSource, PartitionRunner
from spanner_cdc.producer.changestream.partition_tasks import PartitionTasks
from spanner_cdc.producer.changestream.release import CommitOrderRelease
from spanner_cdc.producer.config import ProducerConfig, PublishSettings
from spanner_cdc.producer.lineage.partitions import PartitionScheduler
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.publish.checkpoints import OPEN_TRANSACTION_WAIT_SECONDS, CheckpointStore
from spanner_cdc.producer.publish.framing import Framing, RegistryFraming, SingleObjectFraming
from spanner_cdc.producer.publish.kafka import KafkaClient
from spanner_cdc.producer.publish.publisher import EventPublisher, EventSender
from spanner_cdc.producer.publish.topic_move import move_control_topics
from spanner_cdc.producer.publish.watermarks import WatermarkEmitter
from spanner_cdc.producer.service import Lifecycle, ProducerService
from spanner_cdc.producer.shards.checkpoint_rounds import CheckpointRounds
from spanner_cdc.producer.shards.group import ShardGroup
from spanner_cdc.producer.shards.handover import ShardHandover
from spanner_cdc.producer.shards.transaction_checkpoints import TransactionCheckpoints
from spanner_cdc.producer.spanner.catalog import TableCatalog
from spanner_cdc.producer.spanner.change_stream import ChangeStreamReader
from spanner_cdc.producer.spanner.database import SpannerDatabase
from spanner_cdc.producer.spanner.query import ChangeStreamQuery
from spanner_cdc.producer.spanner.schema import SpannerSchema
from spanner_cdc.producer.spanner.whole_rows import RowFiller, partial_payloads
from spanner_cdc.producer.status import describe, publish_status_periodically
from spanner_cdc.schemas.events import EventBuilder

log = logging.getLogger(__name__)
#: How long restoring the checkpoints may take: reading them, after a wait for a transaction
#: another writer left open on their topic.
RESTORE_DEADLINE_SECONDS = 60 + OPEN_TRANSACTION_WAIT_SECONDS


async def build_service(config: ProducerConfig, metrics: ProducerMetrics | None = None) -> ProducerService:
    """Check Spanner and Kafka, create the topics, restore or start the partition table, and
    build the service (reporting to ``metrics``, a registry of its own unless given).

    The event topics of every table the stream watches (and the filters keep) are created here,
    not at a table's first change: that change then waits for no topic, and the watermark
    records cover every partition from the first round, so a consumer's consistent cut moves
    before any change arrives (created lazily, the demo's first changes reached the replica
    later).
    """
    database = await SpannerDatabase.open(config)
    schema = SpannerSchema(database)
    await schema.check_change_stream(config.change_stream)
    catalog = TableCatalog(database.dialect, schema.load_catalog)
    await call_with_deadline(catalog.refresh, config.connect_timeout_seconds)
    kafka, existing = await open_kafka(config)
    refuse_polled_prefix(kafka, existing)
    await kafka.ensure_topic(kafka.topics.schemas, compacted=True)
    shards = await kafka.ensure_checkpoint_topic(config.group_shards if config.group else 1)
    check_shards(config, kafka, shards, existing)
    if config.group is None:  # fence a process still writing to the prefix before reading
        await kafka.take_over()
    await kafka.ensure_topic(kafka.topics.dead_letters)
    await move_control_topics(kafka)
    table_filter = TableFilter(config.include_tables, config.exclude_tables)
    for pattern in table_filter.unmatched(list(catalog.columns)):
        log.warning("table filter %r matches no table of %s", pattern, config.database)
    watched = await call_with_deadline(
        lambda: schema.watched_tables(config.change_stream), config.connect_timeout_seconds
    )
    tables = [
        table
        for table in sorted(catalog.columns)
        if (watched is None or table in watched) and table_filter.wanted(table)
    ]
    await kafka.ensure_topics([kafka.topics.event(table) for table in tables])
    checkpoints = CheckpointStore(kafka)
    restored = await call_with_deadline(checkpoints.read, RESTORE_DEADLINE_SECONDS)
    owned = {0} if config.group is None else set()  # a group member's come from the group
    scheduler = (
        PartitionScheduler.restored(restored, config.end_timestamp_micros, shards, owned)
        if restored
        else PartitionScheduler.starting_at(config.start_timestamp_micros, shards, owned)
    )
    metrics = metrics or ProducerMetrics()
    builder = event_builder(config, database.dialect)
    sender = await event_sender(config, kafka, metrics, config.delete_tombstones)
    store = backfill_store(kafka)
    plans = await call_with_deadline(store.read, 60)
    backfill_tables, plans = await tables_to_backfill(config, schema, catalog, tables, plans)
    if backfill_tables and config.group is not None:
        raise UsageError(
            f"a backfill of {backfill_tables[0].name} under this prefix is unfinished; it runs in one "
            "process: run the producer without --group until it finished"
        )
    return wire_service(
        config,
        source=ChangeStreamReader(database),
        dialect=database.dialect,
        publisher=EventPublisher(sender, catalog, builder, await row_filler(config, database, schema)),
        checkpoints=checkpoints,
        scheduler=scheduler,
        metrics=metrics,
        backfill=Backfill(
            database=database.database,
            tables=backfill_tables,
            plans=plans,
            snapshot_micros=backfill_snapshot(config, bool(restored)),
            builder=builder,
            sender=sender,
            store=store,
            metrics=metrics,
            parallelism=config.backfill_parallelism,
        )
        if backfill_tables
        else None,
        group=None if config.group is None else ShardGroup(kafka, config.group, config.group_session_timeout),
    )


def wire_service(
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
) -> ProducerService:
    """The service's parts from both ends already open: the actions per record type, the
    partitions' runner and tasks, the commit-order release, the checkpoints (with each
    transaction, in rounds, at a handover) and the watermark records."""
    lifecycle = Lifecycle(scheduler, backfill, config.end_timestamp_micros)
    release = CommitOrderRelease(scheduler, publisher, across_partitions=config.in_commit_order)
    actions = RecordActions(
        DataChangeAction(release, TableFilter(config.include_tables, config.exclude_tables), metrics),
        HeartbeatAction(),
        ChildPartitionsAction(scheduler, checkpoints),
    )
    query = ChangeStreamQuery(config.change_stream, dialect, config.heartbeat_ms, config.end_timestamp_micros)
    runner = PartitionRunner(
        source,
        query,
        scheduler=scheduler,
        actions=actions,
        release=release,
        checkpoints=checkpoints,
        metrics=metrics,
        max_queries=config.max_queries,
        query_start_rate=config.query_start_rate,
        stall_seconds=config.stall_seconds,
    )
    publisher.kafka.close_transactions_with(TransactionCheckpoints(scheduler, runner, release, checkpoints))
    sender = publisher.sender
    watermarks = (
        WatermarkEmitter(publisher.kafka, config.stream_name, sender.framing, sender.json_events)
        if config.watermark_records
        else None
    )
    gauges = Gauges(metrics, scheduler, watermarks)
    tasks = PartitionTasks(scheduler, runner, lifecycle.fail, lifecycle.stop_when_done)
    rounds = CheckpointRounds(publisher.kafka, checkpoints, scheduler, runner, gauges)
    handover = ShardHandover(
        publisher.kafka, checkpoints, scheduler, runner=runner, release=release, tasks=tasks,
        rounds=rounds, gauges=gauges, stopping=lifecycle.stop.is_set, on_failure=lifecycle.fail,
    )  # fmt: skip
    return ProducerService(
        config, publisher, checkpoints, scheduler, metrics, release, runner, tasks, rounds, handover,
        gauges, lifecycle, watermarks, backfill, group,
    )  # fmt: skip


def check_shards(config: ProducerConfig, kafka: KafkaClient, shards: int, existing: set[str]) -> None:
    """A group needs a checkpoint topic of several shards, one process the topic of one: the
    number is fixed when the topic is created (a token's shard is its hash modulo it). Version
    0.1's checkpoints are moved by a producer on its own (``producer.publish.topic_move``)."""
    topic = kafka.topics.checkpoints
    if config.group is not None and existing & set(kafka.topics.moved):
        raise UsageError(
            f"{kafka.topics.prefix} still has version 0.1's control topics: run the producer once "
            "without --group to move them, or give the group a topic prefix of its own"
        )
    if config.group is not None and shards == 1:
        raise UsageError(
            f"{topic} has one shard: it was created by a producer without --group, and cannot be "
            "shared; give the group a topic prefix of its own"
        )
    if config.group is None and shards > 1:
        raise UsageError(
            f"{topic} has {shards} shards: a --group reads this topic prefix; start this producer "
            "with that --group, or give it a topic prefix of its own"
        )


def backfill_snapshot(config: ProducerConfig, restored: bool) -> int:
    """When tables backfilled afresh are read: ``--backfill-snapshot``; else on a first run the
    stream's start, on a later one now (the rows then order after every change already
    published)."""
    if config.backfill_snapshot_micros is not None:
        return config.backfill_snapshot_micros
    return config.start_timestamp_micros if not restored else int(time.time() * 1_000_000)


async def open_kafka(settings: PublishSettings) -> tuple[KafkaClient, set[str]]:
    """The Kafka side, checked to answer now, and the topics the broker has."""
    kafka = KafkaClient(
        settings.kafka_bootstrap,
        settings.topic_prefix,
        settings.kafka_config,
        settings.topic_partitions,
        settings.replication_factor,
    )
    existing = await kafka.check_reachable(settings.connect_timeout_seconds)
    await kafka.fit_to_topics(existing, settings.connect_timeout_seconds)
    return kafka, existing


def refuse_polled_prefix(kafka: KafkaClient, existing: set[str]) -> None:
    """A prefix ``spanner-cdc poll`` writes to is not the producer's: each writes watermark
    records that promise every event topic of its prefix (producer.poll.main)."""
    if kafka.topics.polls in existing:
        raise UsageError(
            f"--topic-prefix {kafka.topics.prefix} belongs to spanner-cdc poll: give the producer a "
            "topic prefix of its own"
        )


async def row_filler(
    config: ProducerConfig, database: SpannerDatabase, schema: SpannerSchema
) -> RowFiller | None:
    """With ``--payload whole-row``, what completes partial records; otherwise None, and a
    warning when the stream's capture type makes events lack whole rows."""
    if config.payload == "whole-row":
        return RowFiller(database.database, schema.primary_keys)
    capture = await call_with_deadline(
        lambda: schema.stream_option(config.change_stream, "value_capture_type"),
        config.connect_timeout_seconds,
    )
    lacking = partial_payloads(capture)
    if lacking:
        log.warning("change stream %s: %s; --payload whole-row reads the rest", config.change_stream, lacking)
    return None


async def tables_to_backfill(
    config: ProducerConfig,
    schema: SpannerSchema,
    catalog: TableCatalog,
    tables: list[str],
    plans: dict[str, TablePlan],
) -> tuple[list[BackfillTable], dict[str, TablePlan]]:
    """The tables to backfill and the plans they go on with (a table without one is read
    afresh): unfinished backfills always (a started backfill finishes even when ``--backfill``
    is dropped); with ``--backfill`` every chosen table never backfilled under this prefix; with
    ``--backfill-snapshot`` also every chosen table last backfilled at another time — so a
    restart with the same options backfills nothing twice."""
    chosen = TableFilter(config.backfill_tables, ())
    for pattern in chosen.unmatched(tables):
        log.warning("--backfill-tables %r matches no table the producer publishes", pattern)
    snapshot = config.backfill_snapshot_micros
    again = {
        table
        for table, plan in plans.items()
        if snapshot is not None and plan.snapshot_micros != snapshot and chosen.wanted(table)
    }
    resumed = {table: plan for table, plan in plans.items() if table not in again}
    wanted = [
        table
        for table in tables
        if (table in resumed and not resumed[table].finished)
        or (config.backfill and table not in resumed and chosen.wanted(table))
    ]
    if not wanted:
        return [], resumed
    keys = await call_with_deadline(schema.primary_keys, config.connect_timeout_seconds)
    return [BackfillTable.from_catalog(catalog, table, keys.get(table, [])) for table in wanted], resumed


def event_builder(settings: PublishSettings, dialect: str) -> EventBuilder:
    """Events of the configured stream name and database, in the database's dialect."""
    return EventBuilder(
        stream_name=settings.stream_name,
        database=settings.database,
        default_schema="public" if dialect == POSTGRESQL else "",
    )


async def event_sender(
    settings: PublishSettings, kafka: KafkaClient, metrics: ProducerMetrics, delete_tombstones: bool = False
) -> EventSender:
    """Events to Kafka in the configured format and framing."""
    return EventSender(
        kafka,
        metrics,
        settings.on_oversize_event,
        delete_tombstones,
        await open_framing(settings.schema_registry_url, settings.schema_registry_config),
        json_events=settings.json_events,
    )


async def open_framing(registry_url: str | None, registry_settings: dict[str, str]) -> Framing:
    """Single-object encoding, or with ``--schema-registry-url`` the registry's wire format
    (checked to answer now, so a wrong URL or credentials stop the producer in one line)."""
    if not registry_url:
        return SingleObjectFraming()
    registry = SchemaRegistry.connect(registry_url, registry_settings)
    await asyncio.to_thread(registry.check_reachable)
    log.info("schema registry at %s: messages in its wire format", registry.url)
    return RegistryFraming(registry)


async def produce(config: ProducerConfig) -> None:
    """The whole command; SIGINT/SIGTERM stop it cleanly (flush, checkpoint, return)."""
    service = await build_service(config)
    settle_heap()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, service.request_stop)
    service.metrics.serve(config.metrics_port, config.metrics_host)
    progress_stop = asyncio.Event()
    started_at = time.monotonic()
    progress = asyncio.create_task(
        show_progress(lambda: describe(service, started_at), progress_stop, config.progress)
    )
    status = asyncio.create_task(publish_status_periodically(service, progress_stop))
    try:
        await service.run()
    finally:
        progress_stop.set()
        await asyncio.gather(progress, status)
        service.metrics.close()
