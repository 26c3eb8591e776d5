"""Publishing one data change record: its events, encoded, produced, their acks tracked.

The one path from a record to Kafka: the producer's partitions and the benchmarks go through
:meth:`EventPublisher.publish`, the tests' synthetic histories through its
:meth:`EventSender.send`.

1. the record's table version comes from the catalog (every column listed; read again when the
   record names a column it does not know — added mid-stream);
2. each writer schema is on ``_spanner-cdc.{prefix}.schemas``, acknowledged, before its first event
   (and, with a schema registry, registered under the topic's subjects: producer.publish.framing);
3. each event is produced keyed by its primary key; its acknowledgement is counted by the
   partition run's :class:`AckTracker`, which is what checkpoints are computed from.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from functools import partial

from confluent_kafka import KafkaError, Message

from spanner_cdc.common.schema_registry import key_subject, value_subject
from spanner_cdc.producer.lineage.acks import AckTracker, take
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.publish.framing import Framing, SingleObjectFraming
from spanner_cdc.producer.publish.kafka import KafkaClient
from spanner_cdc.producer.publish.transactions import (
    DeliveryCallback,
    Outbound,
    client_lost,
    lost_for_good,
)
from spanner_cdc.producer.spanner.catalog import TableCatalog
from spanner_cdc.producer.spanner.whole_rows import RowFiller
from spanner_cdc.schemas.events import READ_METHOD_BACKFILL, Event, EventBuilder
from spanner_cdc.schemas.json_events import event_document, key_document, version_record
from spanner_cdc.schemas.records import DataChangeRecord
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.timestamps import format_timestamp_micros, seconds_behind
from spanner_cdc.schemas.wire import WriterSchema, encode

log = logging.getLogger(__name__)
#: How long the sender may keep the event loop before it lets the other tasks run.
LOOP_TURN_SECONDS = 0.01


@dataclass(frozen=True)
class Route:
    """Where the events of one table version go, their writer schemas (both published), and the
    headers that name those schemas in front of each value and key (producer.publish.framing)."""

    topic: str
    writer: WriterSchema
    key_writer: WriterSchema
    value_header: bytes
    key_header: bytes


class Outgoing:
    """A batch: the events a partition run sends to one table's topic within one transaction
    (producer.publish.transactions), and what their delivery report (``__call__``), staging
    (:meth:`staged`) and a refusal (:meth:`refused`) need — counts by change type and commit
    timestamp, not the events: a report waits for its transaction's commit, and thousands of
    whole events kept that long cost the garbage collector more than the producer's own work
    (measured). One object and one report per batch, the tracker and the metrics moved once
    per commit timestamp in it, where all of them were per event (docs/producer.md,
    Performance)."""

    __slots__ = ("changes", "live", "pending", "sender", "shard", "table", "topic", "tracker")

    def __init__(
        self,
        sender: EventSender,
        tracker: AckTracker,
        shard: int | None,
        *,
        topic: str,
        table: str,
        live: bool,
    ) -> None:
        self.sender = sender
        self.tracker = tracker
        self.shard = shard
        self.topic = topic
        self.table = table
        #: Whether the events are changes, whose commit-to-acknowledgement lag is measured (a
        #: backfill row's "commit" is its snapshot).
        self.live = live
        #: Events by (change type, commit timestamp): what the metrics count.
        self.changes: dict[tuple[str, int], int] = {}
        #: Messages — events and their tombstones — by commit timestamp: what the tracker counts.
        self.pending: dict[int, int] = {}

    def __call__(self, error: KafkaError | None, message: Message | None) -> None:
        """The batch's delivery report: acknowledged and counted, or settled as failed — once,
        whichever of its messages failed."""
        sender, tracker = self.sender, self.tracker
        if error is not None:
            sender.metrics.delivery_errors.inc()
            messages = sum(self.pending.values())
            if error.code() == KafkaError.MSG_SIZE_TOO_LARGE and message is not None:
                tracker.give_up(refused_by_broker(self.table, message, error.str()), messages)
            else:
                settle_failure(tracker, error, messages)
            return
        for commit, count in self.pending.items():
            tracker.acknowledged(commit, count)
        count_acknowledged, table, live = sender.metrics.acknowledged.count, self.table, self.live
        for (change, commit), events in self.changes.items():
            sender.acknowledged += events
            count_acknowledged(table, change, seconds_behind(commit) if live else None, events)

    def staged(self) -> None:
        """The broker took the batch into the open transaction."""
        tracker = self.tracker
        for commit, count in self.pending.items():
            tracker.staged(commit, count)

    def refused(self, message: Outbound, reason: str) -> None:
        """librdkafka refused one of the batch's messages for its size as it was produced: an
        event goes to the dead letters (its tracker count then settles with the letter's), a
        tombstone — its key alone over the limit, so its event was refused too — is settled
        here: nothing of the change can reach the table's topic."""
        key, value, event = message
        commit = event.commit_timestamp
        take(self.pending, commit)
        if value is None:
            self.tracker.acknowledged(commit)
            return
        take(self.changes, (event.change_type, commit))
        self.sender.too_large(self, event, key, len(value), reason)


class EventSender:
    """Events → Kafka: writer schemas published first, key and value encoded, acks counted.

    An event larger than Kafka accepts (``message.max.bytes`` of the client or the broker) can
    never be delivered; retrying would loop forever. ``on_oversize`` decides: ``dead-letter``
    writes what identifies it (uuid, table, key, commit timestamp, size, reason — not the payload,
    which is the part too large) to ``_spanner-cdc.{prefix}.dead_letters`` and counts it as delivered;
    ``fail`` stops the producer with one line.

    With ``delete_tombstones`` every DELETE event is followed by a tombstone: its key and no
    value, on the same partition (same key), so a compacted topic forgets the row once the
    broker's ``delete.retention.ms`` has passed. The tombstone counts as part of the change: the
    partition's checkpoint passes the change only when both are acknowledged.
    """

    def __init__(
        self,
        kafka: KafkaClient,
        metrics: ProducerMetrics,
        on_oversize: str = "dead-letter",
        delete_tombstones: bool = False,
        framing: Framing | None = None,
        *,
        json_events: bool = False,
    ) -> None:
        self.kafka = kafka
        #: JSON documents instead of Avro (schemas.json_events); ``framing`` then unused.
        self.json_events = json_events
        self.metrics = metrics
        self.framing: Framing = framing or SingleObjectFraming()
        self.on_oversize = on_oversize
        self.delete_tombstones = delete_tombstones
        #: Events Kafka acknowledged since start (the progress line).
        self.acknowledged = 0
        #: By (table, schema_key): one per table version, however often the catalog is reread.
        self._routes: dict[tuple[str, str], Route] = {}
        #: The publication of each table version's route, shared by all who wait for it.
        self._publishing: dict[tuple[str, str], asyncio.Future[Route]] = {}
        self._next_turn = 0.0
        #: The batch last produced, which the next events join when the writer lets them.
        self._latest: Outgoing | None = None

    async def send(self, events: Sequence[Event], tracker: AckTracker, shard: int | None = None) -> None:
        """Produce ``events`` through ``shard``'s writer (None: the one writer of a producer on
        its own), each table version's run of them as one batch; ``tracker`` counts each until
        Kafka acknowledges it. Nothing once a delivery of the run failed: the run restarts
        before its failed event and reads these again — sent now, they could commit in a later
        transaction than the one that failed."""
        if tracker.failed is not None or tracker.fatal is not None:
            return
        start = 0
        while start < len(events):
            table = events[start].table
            route = self._routes.get((table.table, table.schema_key))
            if route is None:
                route = await self._route(table, shard)
            start = self._send_batch(events, start, route, tracker, shard)
        if time.monotonic() >= self._next_turn:
            # A partition with a backlog never waits for its reader: without a turn of the loop
            # now and then the transaction's commit (KafkaClient.serving) would wait for the
            # backlog's end. Not at every batch: a turn costs about as much as encoding an
            # event, and serving the delivery reports (librdkafka's poll) more than that.
            self.kafka.poll()
            await asyncio.sleep(0)
            self._next_turn = time.monotonic() + LOOP_TURN_SECONDS

    def _send_batch(
        self, events: Sequence[Event], start: int, route: Route, tracker: AckTracker, shard: int | None
    ) -> int:
        """Encode and produce the events from ``start`` on that share its table version, in the
        writer's latest batch when they may join it (a run of small records then makes one batch
        a transaction), else in a new one; returns where the next table version's begin."""
        first = events[start]
        table = first.table
        live = first.read_method != READ_METHOD_BACKFILL
        writer = self.kafka.writer(shard)
        batch = self._latest
        if (
            batch is None
            or batch.tracker is not tracker
            or batch.live is not live
            or not writer.joins(route.topic, batch)
        ):
            batch = self._latest = Outgoing(
                self, tracker, shard, topic=route.topic, table=table.table, live=live
            )
        changes, pending = batch.changes, batch.pending
        fresh: dict[int, int] = {}
        messages: list[Outbound] = []
        end = start
        for event in events[start:]:
            if event.table is not table:
                break
            end += 1
            change, commit = event.change_type, event.commit_timestamp
            changes[change, commit] = changes.get((change, commit), 0) + 1
            fresh[commit] = fresh.get(commit, 0) + 1
            if self.json_events:
                value, key = event_document(event), key_document(event)
            else:
                value = encode(route.writer, event.fields, route.value_header)
                key = encode(route.key_writer, event.key, route.key_header)
            messages.append((key, value, event))
            if self.delete_tombstones and change == "DELETE":
                fresh[commit] += 1
                messages.append((key, None, event))
        for commit, count in fresh.items():
            pending[commit] = pending.get(commit, 0) + count
            tracker.sent(commit, count)
        writer.produce_batch(route.topic, messages, batch, on_staged=batch.staged, on_refused=batch.refused)
        return end

    def too_large(self, batch: Outgoing, event: Event, key: bytes, size: int, reason: str) -> None:
        """``event`` of ``batch`` is larger than Kafka accepts (the client's limit)."""
        tracker, commit = batch.tracker, event.commit_timestamp
        what = f"event {event.uuid} of table {batch.table} ({size:,} bytes) is larger than Kafka accepts"
        if self.on_oversize == "fail":
            tracker.give_up(
                f"{what} ({reason}); raise message.max.bytes on the producer (--kafka-config) and the "
                "broker, or run with --on-oversize-event dead-letter"
            )
            return
        self.metrics.dead_letters.inc()
        log.warning("%s: written to %s instead", what, self.kafka.topics.dead_letters)
        letter = {
            "uuid": event.uuid,
            "topic": batch.topic,
            "object": batch.table,
            "commit_timestamp": format_timestamp_micros(commit),
            "sort_keys": event.sort_keys,
            "size_bytes": size,
            "reason": reason,
        }
        self.kafka.produce(
            self.kafka.topics.dead_letters,
            key,
            json.dumps(letter).encode(),
            _acknowledging(tracker, commit),
            shard=batch.shard,
            on_staged=partial(tracker.staged, commit),
        )

    async def prepare(self, table: TableSchema, shard: int | None = None) -> None:
        """Publish the table version's topic and writer schemas now, so that its first event need
        not wait for them: a read calls this while its first rows are on their way."""
        if (table.table, table.schema_key) not in self._routes:
            await self._route(table, shard)

    async def _route(self, table: TableSchema, shard: int | None) -> Route:
        """The table version's route, published once however many wait for it at a time; a
        publication that failed is tried again by the next caller."""
        version = (table.table, table.schema_key)
        publishing = self._publishing.get(version)
        if publishing is None or (publishing.done() and (publishing.cancelled() or publishing.exception())):
            publishing = self._publishing[version] = asyncio.ensure_future(self._publish_route(table, shard))
        route = await asyncio.shield(publishing)
        self._routes[version] = route
        return route

    async def _publish_route(self, table: TableSchema, shard: int | None) -> Route:
        """The table version's topic and writer schemas, published (topic, then schemas)."""
        topic = self.kafka.topics.event(table.table)
        writer = WriterSchema.from_schema(table.event_schema)
        key_writer = WriterSchema.from_schema(table.key_schema)
        await self.kafka.ensure_topic(topic)
        # In one transaction: each publication waits for a commit.
        publications: list[Awaitable[None]] = [
            self.kafka.ensure_schema(w, shard) for w in (writer, key_writer)
        ]
        if self.json_events:  # what JSON readers type the table's values by
            publications.append(
                self.kafka.produce_acknowledged(
                    self.kafka.topics.schemas, *version_record(table), shard=shard
                )
            )
        await asyncio.gather(*publications)
        route = Route(
            topic,
            writer,
            key_writer,
            await self.framing.header(value_subject(topic), writer),
            await self.framing.header(key_subject(topic), key_writer),
        )
        log.info(
            "table %s: schema %s published (fingerprint %s)",
            table.table,
            table.schema_key[:12],
            route.writer.fingerprint_hex,
        )
        return route


def _acknowledging(tracker: AckTracker, commit: int) -> DeliveryCallback:
    """A delivery report that settles one message of the change committed at ``commit``."""

    def delivered(error: KafkaError | None, _message: Message | None) -> None:
        if error is not None:
            settle_failure(tracker, error)
        else:
            tracker.acknowledged(commit)

    return delivered


def refused_by_broker(table: str, message: Message, reason: str) -> str:
    """The one line for an event the broker refused for its size: that fails its whole
    transaction, and so would a dead letter written into it; the producer avoids it by keeping
    to its topics' limits, which it reads as it starts (KafkaClient.fit_to_topics)."""
    return (
        f"an event of table {table} ({len(message.value() or b''):,} bytes) is larger than topic "
        f"{message.topic()} accepts ({reason}): raise the topic's max.message.bytes, or let the "
        "producer read it (DescribeConfigs, docs/security.md)"
    )


def settle_failure(tracker: AckTracker, error: KafkaError, count: int = 1) -> None:
    """A failed delivery of ``count`` messages: retried from the checkpoint, unless the client
    failed for good (then every retry would fail the same way: the producer stops, see
    KafkaClientLostError)."""
    if lost_for_good(error):
        tracker.give_up(client_lost(error), count)
    else:
        tracker.delivery_failed(error.str(), count)


class EventPublisher:
    """Data change records → events (table versions from the catalog) → :class:`EventSender`."""

    def __init__(
        self,
        sender: EventSender,
        catalog: TableCatalog,
        builder: EventBuilder,
        rows: RowFiller | None = None,
    ) -> None:
        self.sender = sender
        self.kafka = sender.kafka
        self.catalog = catalog
        self.builder = builder
        #: With ``--payload whole-row``: completes records that lack whole rows.
        self.rows = rows

    async def publish(
        self,
        record: DataChangeRecord,
        partition_token: str | None,
        tracker: AckTracker,
        shard: int | None = None,
    ) -> None:
        """Produce the record's events through ``shard``'s writer (see EventSender.send);
        ``tracker`` counts them until Kafka acknowledges each."""
        table = self.catalog.cached_schema(record.table_name, record.column_types)
        if table is None:  # a table version not seen yet: no coroutine per record for the others
            table = await self._table_schema(record)
        if self.rows is not None:
            record = await self.rows.complete(record, table)
        events = self.builder.build(record, partition_token, int(time.time() * 1000), table)
        await self.sender.send(events, tracker, shard)

    async def _table_schema(self, record: DataChangeRecord) -> TableSchema:
        """The version of the record's table that its column list names, every column listed (see
        producer.spanner.catalog), the catalog read again first when it lacks a named column."""
        if self.catalog.needs_refresh(record.table_name, record.column_types):
            log.info("table %s: columns differ from the catalog; reading it again", record.table_name)
            await asyncio.to_thread(self.catalog.refresh)
        return self.catalog.table_schema(record.table_name, record.column_types)
