"""Kafka rows → decoded events and watermarks, or quarantine rows that say why a message
could not be decoded.

The writer schema of every message is looked up by fingerprint in ``{prefix}._schemas``; the
producer publishes a schema before the first event that uses it, so an unknown fingerprint
first re-reads that topic (at most once per micro-batch) and only then counts as undecodable.
Nothing is dropped: a message becomes an event, a watermark (schemas.watermark) or a
quarantine row with topic, partition, offset, raw bytes and reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer

from spanner_cdc.common.kafka_offsets import SHORT_FETCH_WAIT, read_to_end
from spanner_cdc.consumer.table_version import TableVersion
from spanner_cdc.schemas.errors import ContractError, DecodeError
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import WATERMARK_WRITER, Watermark, is_watermark
from spanner_cdc.schemas.wire import SchemaStore, WriterSchema

UNKNOWN_FINGERPRINT = "unknown-fingerprint"


@dataclass(frozen=True)
class DecodedEvent:
    """One event, where it came from, and its bytes (kept for transactions held back)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    version: TableVersion
    record: dict[str, Any]
    #: ``sort_keys`` as a comparable tuple: (commit micros, tx id, record sequence, mod index).
    sort_key: tuple[int, str, str, int]

    @property
    def commit_micros(self) -> int:
        return self.sort_key[0]


@dataclass(frozen=True)
class WatermarkSeen:
    """A watermark record and the partition it was read from."""

    topic: str
    partition: int
    offset: int
    watermark: Watermark


@dataclass(frozen=True)
class DecodedBatch:
    events: list[DecodedEvent]
    watermarks: list[WatermarkSeen]
    quarantined: list[Quarantined]


@dataclass(frozen=True)
class Quarantined:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    detail: str


class SchemaTopic:
    """The writer schemas on ``{prefix}._schemas``, read incrementally on demand."""

    def __init__(self, client_config: dict[str, str], prefix: str) -> None:
        self.topic = Topics(prefix).schemas
        self.store = SchemaStore({WATERMARK_WRITER.fingerprint: WATERMARK_WRITER})
        self._client_config = client_config
        self._positions: dict[int, int] = {}

    def refresh(self) -> None:
        consumer = Consumer(
            {
                **SHORT_FETCH_WAIT,
                **self._client_config,
                "group.id": "spanner-cdc-schemas",
                "enable.auto.commit": False,
            }
        )
        try:
            for _, _, _, value in read_to_end(consumer, self.topic, self._positions):
                if value:
                    self.store.add(value.decode())
        finally:
            consumer.close()


@dataclass
class BatchDecoder:
    """Decodes micro-batches; keeps one TableVersion per writer schema and key."""

    schemas: SchemaTopic
    _versions: dict[tuple[int, tuple[str, ...]], TableVersion] = field(default_factory=dict)
    _refreshed_in_batch: bool = False

    def decode(self, rows: pa.Table) -> DecodedBatch:
        """``rows`` has the Kafka columns key, value, topic, partition and offset."""
        self._refreshed_in_batch = False
        values = rows.column("value").to_pylist()
        keys = rows.column("key").to_pylist()
        topics = rows.column("topic").to_pylist()
        partitions = rows.column("partition").to_pylist()
        offsets = rows.column("offset").to_pylist()
        batch = DecodedBatch([], [], [])
        for key, value, topic, partition, offset in zip(
            keys, values, topics, partitions, offsets, strict=True
        ):
            try:
                record, writer = self._read(value)
                if is_watermark(writer):
                    batch.watermarks.append(
                        WatermarkSeen(topic, partition, offset, Watermark.from_record(record))
                    )
                    continue
                version = self._version(writer, record)
            except DecodeError as exc:
                batch.quarantined.append(
                    Quarantined(topic, partition, offset, key, value, exc.reason, str(exc))
                )
                continue
            micros, tx_id, record_sequence, mod_index = record["sort_keys"]
            order = (int(micros), str(tx_id), str(record_sequence), int(mod_index))
            batch.events.append(DecodedEvent(topic, partition, offset, key, value, version, record, order))
        return batch

    def _read(self, value: bytes | None) -> tuple[dict[str, Any], WriterSchema]:
        """Decode; on an unknown fingerprint re-read the schema topic (once per batch) and retry."""
        if not value:
            raise DecodeError("empty", "the message has no value (a tombstone or an empty message)")
        try:
            return self.schemas.store.read(value)
        except DecodeError as exc:
            if exc.reason != UNKNOWN_FINGERPRINT or self._refreshed_in_batch:
                raise
        self._refreshed_in_batch = True
        self.schemas.refresh()
        return self.schemas.store.read(value)

    def _version(self, writer: WriterSchema, record: dict[str, Any]) -> TableVersion:
        try:
            primary_keys = tuple(record["source_metadata"]["primary_keys"])
            cache_key = (writer.fingerprint, primary_keys)
            version = self._versions.get(cache_key)
            if version is None:
                version = self._versions[cache_key] = TableVersion.from_writer(writer, primary_keys)
        except (KeyError, TypeError, ContractError) as exc:
            raise DecodeError("not-an-event", f"decodes, but is not a change event: {exc}") from exc
        return version
