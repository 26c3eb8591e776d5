"""The driver's side of decoding: what a batch may be read with, learning what it names, and
checking its watermarks against the broker.

Messages are read by consumer.decode.gate under a :class:`DecodeContext` the driver fixes
when a batch starts. The writer schema of every message is looked up by fingerprint in
``_spanner-cdc.{prefix}.schemas`` (consumer.decode.schema_topic); the producer publishes a schema
before the first event that uses it, so when a read quarantines messages as naming something
unknown (``Quarantined.unknown``: the name, never the message), the driver reads that topic
again — at most once per batch — or asks the Schema Registry for a message's id
(common.schema_registry), and the batch is read again with what it learnt. Reading the schema
topic, the registry or the broker's metadata is infrastructure: its errors propagate and Spark
retries the batch. Nothing is dropped: a message becomes an event, a watermark (schemas.watermark) or a
quarantine row with topic, partition, offset, raw bytes and reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import pyarrow as pa
from cachetools import LRUCache
from confluent_kafka import Consumer

from spanner_cdc.common.schema_registry import (
    NOT_FOUND,
    SchemaRegistry,
    SchemaRegistryRefusedError,
)
from spanner_cdc.consumer.decode.decoded import DecodedBatch, Quarantined, Unknown, WatermarkSeen
from spanner_cdc.consumer.decode.gate import DecodeContext, MessageReader
from spanner_cdc.consumer.decode.rules import check_watermark
from spanner_cdc.consumer.decode.schema_topic import MAX_REFUSED_SCHEMAS, SchemaTopic
from spanner_cdc.schemas.errors import DecodeError
from spanner_cdc.schemas.schema_check import check_writer_schema
from spanner_cdc.schemas.timestamps import now_micros
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import Watermark
from spanner_cdc.schemas.wire import WriterSchema

#: Registry ids refused past those the batches' context carries, remembered at most.
MAX_REMEMBERED_REFUSALS = 20_000


def partition_counts(client_config: dict[str, str]) -> dict[str, int]:
    """Every topic on the broker and its partition count (watermarks are checked against it)."""
    consumer = Consumer({**client_config, "group.id": "spanner-cdc-metadata"})
    try:
        metadata = consumer.list_topics(timeout=30)
    finally:
        consumer.close()
    return {name: len(topic.partitions) for name, topic in metadata.topics.items() if topic.error is None}


@dataclass
class BrokerPartitions:
    """Topic → partition count on the broker, for checking watermarks (event_rules).

    Reading the broker's metadata takes a client and a round trip — visible in every
    micro-batch of the demo's profile — and counts seldom change, so they are kept for up to
    ``max_age_seconds``. A watermark the kept counts refuse is checked again against counts read
    afresh, at most once per batch: a topic created or grown since is seen at once, and a flood
    of forged watermarks costs one read per batch, not one each.
    """

    read: Callable[[], Mapping[str, int]]
    max_age_seconds: float = 30.0
    _counts: Mapping[str, int] | None = None
    _read_at: float = 0.0
    _read_this_batch: bool = False

    def start_batch(self) -> None:
        self._read_this_batch = False

    def check(self, watermark: Watermark, topic: str, partition: int, now: int) -> None:
        """DecodeError when the watermark disagrees with the broker (decode.rules.check_watermark)."""
        try:
            check_watermark(watermark, topic, partition, self.counts(), now)
        except DecodeError:
            if self._read_this_batch:
                raise
            check_watermark(watermark, topic, partition, self._reread(), now)

    def counts(self) -> Mapping[str, int]:
        """Topic → partition count, as kept (read again once ``max_age_seconds`` old)."""
        if self._counts is None or time.monotonic() - self._read_at > self.max_age_seconds:
            return self._reread()
        return self._counts

    def _reread(self) -> Mapping[str, int]:
        self._counts = self.read()
        self._read_at = time.monotonic()
        self._read_this_batch = True
        return self._counts


@dataclass
class BatchDecoder:
    """The driver's decoder: :meth:`start_batch` for what a batch is read with, :meth:`learn`
    when a read found something unknown, :meth:`checked` for its watermarks — and
    :meth:`decode`, all three in turn over rows held on the driver (the consistent cut's held
    events, the replica's batch)."""

    schemas: SchemaTopic
    topics: Topics
    partitions: BrokerPartitions
    #: With ``--schema-registry-url``: resolves the ids of registry-framed messages.
    registry: SchemaRegistry | None = None
    #: Registry id → its schema's fingerprint, or why its messages cannot be read.
    _registry_ids: dict[int, int | tuple[str, str]] = field(default_factory=dict)
    #: Refusals past the first MAX_REFUSED_SCHEMAS (which every batch's context carries), the
    #: most recently asked kept: a flood of made-up ids costs one request per id, not one per
    #: id and batch, and bounded memory.
    _refused_ids: LRUCache[int, tuple[str, str]] = field(
        default_factory=lambda: LRUCache(MAX_REMEMBERED_REFUSALS)
    )

    def start_batch(self) -> DecodeContext:
        """What a batch starting now is read with."""
        self.partitions.start_batch()
        return self._context(now_micros())

    def _context(self, now: int) -> DecodeContext:
        return DecodeContext(
            self.topics,
            now,
            dict(self.schemas.texts),
            self._unreadable(),
            dict(self._registry_ids),
            dict(self.schemas.versions),
        )

    def _unreadable(self) -> dict[int, tuple[str, str]]:
        return {
            fingerprint: why
            for fingerprint in self.schemas.refused
            if (why := self.schemas.why_unreadable(fingerprint)) is not None
        }

    def learn(self, context: DecodeContext, names: Iterable[Unknown]) -> DecodeContext | None:
        """After a read of ``context`` quarantined messages naming what it did not know
        (``Quarantined.unknown``): the schema topic read again if a fingerprint or JSON table
        version is new, the registry asked for new ids. The context to read the batch again
        with, or None when nothing was learnt (the quarantine reasons are then final)."""
        registry_ids = dict(context.registry_ids)
        stale = False
        for name in names:
            if name.table_version is not None:
                stale |= name.table_version not in self.schemas.versions
                continue
            fingerprint = name.fingerprint
            if name.schema_id is not None:
                known = registry_ids.get(name.schema_id)
                if known is None:
                    known = registry_ids[name.schema_id] = self._registered(name.schema_id)
                if isinstance(known, tuple):
                    continue
                fingerprint = known
            stale |= fingerprint not in self.schemas.texts and fingerprint not in self.schemas.refused
        if stale:
            self.schemas.refresh()
        if not stale and registry_ids == context.registry_ids:
            return None
        learnt = self._context(context.now_micros)
        return replace(learnt, registry_ids={**registry_ids, **learnt.registry_ids})

    def refuted(
        self, seen: list[WatermarkSeen], context: DecodeContext
    ) -> tuple[list[WatermarkSeen], list[Quarantined]]:
        """The watermarks the broker's partitions bear out, and the others as quarantine rows."""
        watermarks: list[WatermarkSeen] = []
        quarantined: list[Quarantined] = []
        for mark in seen:
            try:
                self.partitions.check(mark.watermark, mark.topic, mark.partition, context.now_micros)
            except DecodeError as exc:
                quarantined.append(
                    Quarantined(
                        mark.topic, mark.partition, mark.offset, None, mark.value, exc.reason, exc.detail
                    )
                )
                continue
            watermarks.append(mark)
        return watermarks, quarantined

    def decode(self, rows: pa.Table) -> DecodedBatch:
        """Rows held on the driver (``kafka_rows.DECODE_SCHEMA``), read as a batch of their own,
        learnt from and checked."""
        context, batch = self.read(rows, self.start_batch())
        watermarks, refuted = self.refuted(batch.watermarks, context)
        return replace(batch, watermarks=watermarks, quarantined=[*batch.quarantined, *refuted])

    def read(self, rows: pa.Table, context: DecodeContext) -> tuple[DecodeContext, DecodedBatch]:
        """``rows`` read on the driver with ``context``, and read again, once, with what the
        driver learnt if messages named something it lacked; the context they were read with."""
        batch = MessageReader(context).read(rows)
        unknown = {q.unknown for q in batch.quarantined if q.unknown is not None}
        learnt = self.learn(context, unknown) if unknown else None
        if learnt is None:
            return context, batch
        return learnt, MessageReader(learnt).read(rows)

    def _registered(self, schema_id: int) -> int | tuple[str, str]:
        """The fingerprint of the registry's schema ``schema_id``, or why its messages cannot be
        read (no registry configured, an id the registry does not have, a schema that is not the
        contract's). A registry that does not answer or refuses the consumer's credentials is
        infrastructure: that error propagates and the batch is tried again."""
        known = self._registry_ids.get(schema_id)
        if known is None:
            known = self._refused_ids.get(schema_id)
        if known is None:
            known = self._ask_registry(schema_id)
            if isinstance(known, int) or len(self._registry_ids) < MAX_REFUSED_SCHEMAS:
                self._registry_ids[schema_id] = known
            else:
                self._refused_ids[schema_id] = known
        return known

    def _ask_registry(self, schema_id: int) -> int | tuple[str, str]:
        if self.registry is None:
            return (
                "registry-framed",
                f"in the Schema Registry wire format (schema id {schema_id}); "
                "start the consumer with --schema-registry-url",
            )
        try:
            text = self.registry.schema_text(schema_id)
        except SchemaRegistryRefusedError as exc:
            if exc.http_status != NOT_FOUND:
                raise
            return ("unknown-schema-id", f"the schema registry has no schema id {schema_id}")
        try:
            return WriterSchema.from_schema(check_writer_schema(text)).fingerprint
        except Exception as exc:  # a hostile schema: whatever fails reading it costs its messages only
            return ("rejected-schema", f"registry schema id {schema_id} is not the contract's: {exc}")
