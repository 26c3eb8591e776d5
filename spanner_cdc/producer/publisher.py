"""Publishing one data change record: its events, encoded, produced, their acks tracked.

The one path from a record to Kafka: the producer's partitions and the benchmarks go through
:meth:`EventPublisher.publish`, the tests' synthetic histories through its
:meth:`EventSender.send`.

1. the record's table version comes from the catalog (every column listed; read again when the
   record names a column it does not know — added mid-stream);
2. each writer schema is on ``{prefix}._schemas``, acknowledged, before its first event;
3. each event is produced keyed by its primary key; its acknowledgement is counted by the
   partition run's :class:`AckTracker`, which is what checkpoints are computed from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, Message

from spanner_cdc.producer.acks import AckTracker
from spanner_cdc.producer.catalog import TableCatalog
from spanner_cdc.producer.kafka import KafkaClient
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.schemas.events import Event, EventBuilder
from spanner_cdc.schemas.records import DataChangeRecord
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.timestamps import seconds_behind
from spanner_cdc.schemas.wire import WriterSchema, encode

log = logging.getLogger(__name__)


class EventSender:
    """Events → Kafka: writer schemas published first, key and value encoded, acks counted."""

    def __init__(self, kafka: KafkaClient, metrics: ProducerMetrics) -> None:
        self.kafka = kafka
        self.metrics = metrics
        #: Events Kafka acknowledged since start (the progress line).
        self.acknowledged = 0
        self._writers: dict[tuple[str, str], tuple[WriterSchema, WriterSchema]] = {}

    async def send(self, events: Sequence[Event], tracker: AckTracker) -> None:
        """Produce ``events``; ``tracker`` counts each until Kafka acknowledges it."""
        for event in events:
            table = event.table
            topic = self.kafka.topics.event(table.table)
            writer, key_writer = await self._writers_for(table, topic)
            tracker.sent(event.value["source_metadata"]["commit_timestamp"])
            self.kafka.produce(
                topic,
                encode(key_writer, event.key),
                encode(writer, event.value),
                self._on_delivery(tracker, event),
            )
        self.kafka.poll()

    async def _writers_for(self, table: TableSchema, topic: str) -> tuple[WriterSchema, WriterSchema]:
        cache_key = (table.table, table.schema_key)
        writers = self._writers.get(cache_key)
        if writers is None:
            writers = (
                WriterSchema.from_schema(table.event_schema),
                WriterSchema.from_schema(table.key_schema),
            )
            await self.kafka.ensure_topic(topic)
            for writer in writers:
                await self.kafka.ensure_schema(writer)
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
            self.acknowledged += 1
            self.metrics.events.labels(table, change_type).inc()
            self.metrics.observe_commit_to_ack(seconds_behind(commit))

        return delivered


class EventPublisher:
    """Data change records → events (table versions from the catalog) → :class:`EventSender`."""

    def __init__(self, sender: EventSender, catalog: TableCatalog, builder: EventBuilder) -> None:
        self.sender = sender
        self.kafka = sender.kafka
        self.catalog = catalog
        self.builder = builder

    async def publish(
        self, record: DataChangeRecord, partition_token: str | None, tracker: AckTracker
    ) -> None:
        """Produce the record's events; ``tracker`` counts them until Kafka acknowledges each."""
        table = await self._table_schema(record)
        events = self.builder.build(record, partition_token, int(time.time() * 1000), table)
        await self.sender.send(events, tracker)

    async def _table_schema(self, record: DataChangeRecord) -> TableSchema:
        """The record's table version, every column listed (see producer.catalog)."""
        table = self.catalog.cached_schema(record.table_name, record.column_types)
        if table is None:
            if self.catalog.needs_refresh(record.table_name, record.column_types):
                log.info("table %s: columns differ from the catalog; reading it again", record.table_name)
                await asyncio.to_thread(self.catalog.refresh)
            table = self.catalog.table_schema(record.table_name, record.column_types)
        return table
