"""Wiring of ``spanner-cdc consume``: a Spark session, Spark's Kafka source, and the batch processor."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException

from spanner_cdc.common.schema_registry import SchemaRegistry
from spanner_cdc.consumer.batch import BatchProcessor
from spanner_cdc.consumer.config import ConsumerConfig
from spanner_cdc.consumer.decode.driver import BatchDecoder, BrokerPartitions, partition_counts
from spanner_cdc.consumer.decode.schema_topic import SchemaTopic
from spanner_cdc.consumer.dedupe import DeliveredChanges
from spanner_cdc.consumer.errors import ConsumerError
from spanner_cdc.consumer.locations import ConsumerLocations, Location
from spanner_cdc.consumer.metrics import ConsumerMetrics
from spanner_cdc.consumer.query_rates import QueryRates
from spanner_cdc.consumer.sinks.changelog import ChangelogSink
from spanner_cdc.consumer.sinks.lakehouse.ledger import Ledger
from spanner_cdc.consumer.sinks.lakehouse.merge import LAKEHOUSE_DIR, LakehouseMerge
from spanner_cdc.consumer.sinks.quarantine import QuarantineSink
from spanner_cdc.consumer.sinks.replica.backends import open_backend
from spanner_cdc.consumer.sinks.replica.cut import ConsistentCut
from spanner_cdc.consumer.sinks.replica.history import RowHistory
from spanner_cdc.consumer.sinks.replica.merge import ReplicaMerge
from spanner_cdc.consumer.sinks.replica.sink import ReplicaCommit, ReplicaSink, ReplicaStore
from spanner_cdc.consumer.spark.data_loss import DataLossCounter
from spanner_cdc.consumer.spark.graceful_stop import (
    POLL_SECONDS,
    BatchGate,
    StopRequest,
    stop_between_batches,
    stop_requested,
)
from spanner_cdc.consumer.spark.offsets_log import OffsetsLog
from spanner_cdc.consumer.spark.session import spark_session
from spanner_cdc.consumer.streams.catalog import streams_seen
from spanner_cdc.schemas.timestamps import MICROS_PER_SECOND

log = logging.getLogger("spanner_cdc.consumer")


def source_options(config: ConsumerConfig, spark: Any) -> dict[str, str]:
    """Spark's Kafka source options for ``config``; unless ``minPartitions`` is given, a batch is
    read in at least as many tasks as the session has task slots (Spark splits a partition's
    offsets between tasks), so a topic of few partitions is still decoded on every core."""
    return {"minPartitions": str(spark.sparkContext.defaultParallelism), **config.source_settings}


def check_kafka(config: ConsumerConfig) -> None:
    """Kafka answers, and the prefix's schemas are where this version reads them."""
    consumer = Consumer({**config.client_config, "group.id": "spanner-cdc-check"})
    try:
        existing = consumer.list_topics(timeout=config.connect_timeout_seconds).topics
    except KafkaException as exc:
        raise ConsumerError(f"Kafka at {config.kafka_bootstrap} is unreachable: {exc}") from None
    finally:
        consumer.close()
    for old, new in config.topics.moved.items():
        if old in existing and new not in existing:
            raise ConsumerError(
                f"{old} is where version 0.1 kept its control records; this version reads {new}: "
                "start this version's producer once (it moves them), then the consumer"
            )


def forget_an_unplanned_first_batch(checkpoint: Location) -> None:
    """Spark refuses to start a query whose checkpoint has no planned batch yet holds files in
    ``offsets/`` or ``commits/`` (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``, on every start
    after). A consumer killed while Spark wrote its first offsets leaves exactly that: the
    write's temporary file (``.0.<uuid>.tmp``) or checksum, and no ``0``. No batch was planned,
    so nothing can be lost by removing them; a checkpoint with a planned batch is not touched."""
    entries = [entry for log_dir in ("offsets", "commits") for entry in (checkpoint / log_dir).files()]
    if any(entry.name.isdigit() for entry in entries):
        return
    for leftover in entries:
        leftover.delete()
    if entries:
        log.info(
            "removed %d file(s) Spark left in %s planning its first batch (the consumer was killed then)",
            len(entries),
            checkpoint,
        )


def open_registry(config: ConsumerConfig) -> SchemaRegistry | None:
    """With ``--schema-registry-url``, the registry that resolves registry-framed messages,
    checked to answer now (a wrong URL or credentials stop the consumer in one line)."""
    if not config.schema_registry_url:
        return None
    registry = SchemaRegistry.connect(config.schema_registry_url, config.schema_registry_config)
    registry.check_reachable()
    return registry


def open_store(config: ConsumerConfig, locations: ConsumerLocations) -> ReplicaStore:
    """The replica's tables: a DuckDB or PostgreSQL database, or Delta tables under
    ``<output-dir>/lakehouse`` with their ledger in the checkpoint."""
    if config.replica == "delta":
        ledger = Ledger(locations.checkpoint / "lakehouse", locations.local)
        return LakehouseMerge(ledger, locations.output / LAKEHOUSE_DIR)
    backend = open_backend(config.replica, config.duckdb_path, config.postgres_dsn)
    history = (
        RowHistory(backend, config.history_retention_hours * 3600 * MICROS_PER_SECOND)
        if config.whole_transactions
        else None
    )
    return ReplicaMerge(backend, history)


def replica_sink(
    config: ConsumerConfig,
    locations: ConsumerLocations,
    store: ReplicaStore,
    *,
    metrics: ConsumerMetrics,
    decoder: BatchDecoder,
    on_replica_commit: Callable[[ReplicaCommit], None] | None,
) -> ReplicaSink:
    """The replica sink over ``store``, with whole transactions unless ``config`` says not."""
    backend = store.backend
    cut = (
        ConsistentCut(backend, config.subscribed, config.max_events_per_batch, decoder.partitions.counts)
        if config.whole_transactions
        else None
    )
    tasks_load = config.replica == "postgres" and config.postgres_staging == "tasks"
    sink = ReplicaSink(
        store,
        metrics,
        locations.spark_checkpoint,
        locations.replica_staging,
        cut,
        on_replica_commit,
        tasks_load_with=config.postgres_dsn if tasks_load else None,
        # Streams are the SQL replicas' (the lakehouse's changes are Delta's Change Data Feed).
        streams_seen=list if config.replica == "delta" else lambda: streams_seen(backend),
    )
    store.release()  # until the first batch: stream commands may use a DuckDB replica
    return sink


@dataclass
class ConsumerJob:
    """Everything one running consumer holds; :meth:`close` releases it."""

    config: ConsumerConfig
    locations: ConsumerLocations
    processor: BatchProcessor
    store: ReplicaStore | None
    gate: BatchGate = field(default_factory=BatchGate)

    @classmethod
    def open(
        cls,
        config: ConsumerConfig,
        on_replica_commit: Callable[[ReplicaCommit], None] | None = None,
        hadoop: Mapping[str, str] | None = None,
    ) -> ConsumerJob:
        """Connect everything; ``on_replica_commit`` is called after every committed replica
        batch. ``hadoop``: the Hadoop settings of the session the query runs in, which reach
        the object store (default: those among ``--spark-conf``)."""
        check_kafka(config)
        locations = ConsumerLocations.of(config, hadoop)
        registry = open_registry(config)
        decoder = BatchDecoder(
            SchemaTopic(
                config.client_config,
                config.topic_prefix,
                locations.schemas,
                config.max_writer_schemas,
            ),
            config.topics,
            BrokerPartitions(functools.partial(partition_counts, config.client_config)),
            registry,
        )
        # Schemas are published before their first event: read what is there now, or the first
        # batch would be outlined twice (all of it unknown, then again after learning them).
        decoder.schemas.refresh()
        metrics = ConsumerMetrics(f"{config.topic_prefix}.* into {', '.join(config.sinks)}")
        store = open_store(config, locations) if "replica" in config.sinks else None
        replica = (
            None
            if store is None
            else replica_sink(
                config,
                locations,
                store,
                metrics=metrics,
                decoder=decoder,
                on_replica_commit=on_replica_commit,
            )
        )
        offsets = OffsetsLog(locations.spark_checkpoint)
        processor = BatchProcessor(
            decoder=decoder,
            delivered=DeliveredChanges(
                locations.dedupe,
                config.dedupe_horizon_seconds * MICROS_PER_SECOND,
                locations.local,
            ),
            changelog=ChangelogSink(locations.changelog) if "changelog" in config.sinks else None,
            replica=replica,
            quarantine=QuarantineSink(locations.quarantine),
            outlines=locations.outlines,
            offsets=offsets,
            fail_on_bad_message=config.on_bad_message == "fail",
            metrics=metrics,
            data_loss=None if config.fail_on_data_loss else DataLossCounter(offsets, config.client_config),
        )
        return cls(config, locations, processor, store)

    def read_stream(self, spark: Any) -> Any:
        """The streaming DataFrame of the subscribed topics, from Spark's Kafka source."""
        forget_an_unplanned_first_batch(self.locations.spark_checkpoint)
        return spark.readStream.format("kafka").options(**source_options(self.config, spark)).load()

    def start(self, spark: Any) -> Any:
        """Start the streaming query (Spark keeps its offsets and id under ``<checkpoint-dir>/spark``)."""
        config = self.config
        writer = (
            self.read_stream(spark)
            .writeStream.foreachBatch(self.run_batch)
            .option("checkpointLocation", self.locations.spark_checkpoint.uri)
            .queryName(f"spanner_cdc_{config.topic_prefix}")
        )
        if config.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{config.trigger_seconds} seconds")
        return writer.start()

    def run_batch(self, batch: Any, batch_id: int) -> None:
        """One micro-batch into every sink (the query's ``foreachBatch`` function)."""
        with self.gate.batch(batch_id):
            self.processor(batch, batch_id)

    def run_until_stopped(self, query: Any, request: StopRequest) -> None:
        """Until the query ends (``available_now``) or ``request`` stops it between two batches."""
        stop_between_batches(query, self.gate, request, idle_seconds=self.config.trigger_seconds + 2)

    def close(self) -> None:
        self.processor.delivered.close()
        self.processor.metrics.close()
        if self.processor.data_loss is not None:
            self.processor.data_loss.close()
        if self.store is not None:
            self.store.close()


def wait_until_started(query: Any, timeout: float) -> None:
    """Until the query has planned its first trigger (Spark and the source are up)."""
    deadline = time.monotonic() + timeout
    while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
        if query.status.get("message") == "Waiting for data to arrive":
            return
        query.awaitTermination(POLL_SECONDS)


def drain(job: ConsumerJob, spark: Any, request: StopRequest) -> Any:
    """Run the query until stopped; with ``available_now``, until Kafka's current end is written.
    The query, ended (its progress says what its batches took)."""
    query = job.start(spark)
    job.run_until_stopped(query, request)
    return query


def consume(config: ConsumerConfig) -> None:
    """The whole command: runs until stopped, or until Kafka is drained with ``available_now``."""
    job = ConsumerJob.open(config)
    spark = spark_session(
        config.spark_master,
        f"spanner-cdc-consume-{config.topic_prefix}",
        config.spark_conf,
        log_dir=config.local_directory / "logs",
        ui=config.spark_ui,
        delta=config.replica == "delta",
    )
    try:
        job.processor.metrics.serve(config.metrics_port, config.metrics_host)
        spark.streams.addListener(QueryRates(job.processor.metrics))
        ui = spark.sparkContext.uiWebUrl
        with stop_requested() as request:
            log.info(
                "consuming %s.* into %s%s",
                config.topic_prefix,
                ", ".join(config.sinks),
                f"; Spark UI at {ui}" if ui else "",
            )
            drain(job, spark, request)
    finally:
        job.close()
        spark.stop()
