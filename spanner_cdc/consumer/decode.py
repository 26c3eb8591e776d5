"""Kafka rows → decoded events and watermarks, or quarantine rows that say why a message
could not be decoded.

The writer schema of every message is looked up by fingerprint in ``_spanner-cdc.{prefix}.schemas``; the
producer publishes a schema before the first event that uses it, so an unknown fingerprint
first re-reads that topic (at most once per micro-batch) and only then counts as undecodable.
A message in the Schema Registry's wire format names its schema by registry id instead: the
registry's schema for that id gives the fingerprint, and the schema used is still the one the
schema topic holds under it (common.schema_registry). A JSON event (``--format json``, a value
that starts with ``{``) names its table version by ``object`` and ``schema_key``, whose columns
the producer publishes on the schema topic too (schemas.json_events); it is turned into the Avro
record it stands for and read through the same path, so both formats meet the same checks.
Nothing is dropped: a message becomes an event, a watermark (schemas.watermark) or a
quarantine row with topic, partition, offset, raw bytes and reason.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer
from fastavro.validation import validate

from spanner_cdc.common.kafka_offsets import SHORT_FETCH_WAIT, read_to_end
from spanner_cdc.common.schema_registry import (
    NOT_FOUND,
    RegistryError,
    SchemaRegistry,
    SchemaRegistryRefusedError,
)
from spanner_cdc.consumer.event_rules import check_event, check_version, check_watermark
from spanner_cdc.consumer.table_version import TableVersion
from spanner_cdc.schemas.errors import ContractError, DecodeError
from spanner_cdc.schemas.json_events import (
    VERSION_KEY_PREFIX,
    avro_event,
    avro_watermark,
    version_from_record,
)
from spanner_cdc.schemas.schema_check import SchemaRejectedError, check_writer_schema, reading_form
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.timestamps import now_micros
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import WATERMARK_SCHEMA, WATERMARK_WRITER, Watermark, is_watermark
from spanner_cdc.schemas.wire import (
    HEADER_LENGTH,
    REGISTRY_HEADER_LENGTH,
    SchemaStore,
    WriterSchema,
    encode,
    is_registry_framed,
    read_body,
    read_fingerprint,
    read_schema_id,
)

log = logging.getLogger("spanner_cdc.consumer")


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
    #: Keyed messages without a value: a producer's --delete-tombstones, for compaction; skipped.
    tombstones: int = 0


@dataclass(frozen=True)
class Quarantined:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    detail: str


#: Refused fingerprints remembered with the reason why; the events of further refused ones are
#: quarantined as ``unknown-fingerprint`` — a flood of garbage on the schema topic must not fill memory.
MAX_REFUSED_SCHEMAS = 1_000
#: Table versions for JSON events kept at most (each is checked, but a flood must not fill memory).
MAX_JSON_VERSIONS = 100_000
#: Refused schema records logged one by one per consumer run; a flood must not fill the screen.
MAX_SCHEMA_WARNINGS = 20


class SchemaTopic:
    """The writer schemas on ``_spanner-cdc.{prefix}.schemas``, read incrementally on demand, each checked
    (schemas.schema_check) before it is used.

    A schema that fails the check is not used; events of its fingerprint are quarantined with
    the reason, unless a schema that passes is (or becomes) known under that fingerprint — so
    garbage published under a real schema's key changes nothing. A second *valid* schema under a
    known fingerprint that would be read differently (Avro's fingerprint leaves out ``sqlName``
    and ``logicalType``, so a lookalike can share it) makes the fingerprint ambiguous: which one
    the events were written with cannot be known, so they are quarantined, never misread. With
    ``remember_in``, accepted schemas are kept in the consumer's checkpoint, so a lookalike that
    compaction left as the only record under a fingerprint is still told apart.
    """

    def __init__(self, client_config: dict[str, str], prefix: str, remember_in: Path | None = None) -> None:
        self.topic = Topics(prefix).schemas
        self.store = SchemaStore({WATERMARK_WRITER.fingerprint: WATERMARK_WRITER})
        #: Fingerprint → why events written with it cannot be read (reason, detail).
        self.refused: dict[int, tuple[str, str]] = {}
        self._reading_forms = {WATERMARK_WRITER.fingerprint: reading_form(WATERMARK_SCHEMA)}
        #: (table, schema_key) → the table version JSON events of it are read with.
        self.versions: dict[tuple[str, str], TableSchema] = {}
        self._client_config = client_config
        self._positions: dict[int, int] = {}
        self._remember_in = remember_in
        self._warnings = 0
        if remember_in is not None:
            remember_in.mkdir(parents=True, exist_ok=True)
            for path in sorted(remember_in.glob("*.avsc")):
                self.accept(path.stem.encode(), path.read_bytes())

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
            with closing(read_to_end(consumer, self.topic, self._positions)) as records:
                for _, _, key, value in records:
                    self.accept(key, value)
        finally:
            consumer.close()

    def accept(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the schema topic: the key is the fingerprint in hex, the value the schema."""
        if not value:
            return  # a tombstone: compaction's way of deleting; nothing to read
        if key is not None and key.startswith(VERSION_KEY_PREFIX.encode()):
            self._accept_version(key, value)
            return
        try:
            fingerprint = int((key or b"").decode("ascii"), 16)
        except (UnicodeDecodeError, ValueError):
            self._warn("%s: a record whose key is not a fingerprint was ignored", self.topic)
            return
        try:
            text = value.decode()
            schema = check_writer_schema(text)
            writer = WriterSchema.from_schema(schema)
        except (UnicodeDecodeError, SchemaRejectedError, ValueError, TypeError, KeyError) as exc:
            self._reject(fingerprint, f"schema {fingerprint:016x} is not the contract's: {exc}")
            return
        if writer.fingerprint != fingerprint:
            self._reject(fingerprint, f"the schema under key {fingerprint:016x} has another fingerprint")
            return
        form = reading_form(schema)
        known = self._reading_forms.setdefault(fingerprint, form)
        if known != form:
            detail = f"two valid schemas with fingerprint {fingerprint:016x} read differently"
            if self.refused.get(fingerprint, ("",))[0] != "ambiguous-schema":
                self._warn("%s: %s; its events are quarantined", self.topic, detail)
            self.refused[fingerprint] = ("ambiguous-schema", detail)
            return
        self.store.schemas.setdefault(fingerprint, writer)
        self._remember(fingerprint, value)

    def _accept_version(self, key: bytes, value: bytes) -> None:
        """A table version for JSON events, used only if its columns hash to the key's schema_key."""
        if len(self.versions) >= MAX_JSON_VERSIONS:
            self._warn("%s: more than %d table versions; the rest are ignored", self.topic, MAX_JSON_VERSIONS)
            return
        try:
            version = version_from_record(key.decode(), value)
        except (UnicodeDecodeError, ContractError, ValueError, TypeError, KeyError) as exc:
            self._warn("%s: a table-version record was ignored: %s", self.topic, str(exc)[:200])
            return
        self.versions.setdefault((version.table, version.schema_key), version)

    def _reject(self, fingerprint: int, detail: str) -> None:
        if fingerprint in self.refused or len(self.refused) >= MAX_REFUSED_SCHEMAS:
            return  # its events are quarantined all the same: as unknown-fingerprint
        self._warn("%s: %s; ignored", self.topic, detail)
        self.refused[fingerprint] = ("rejected-schema", detail)

    def _warn(self, message: str, *args: object) -> None:
        """A line for each of the first few refused records, then one saying the rest are not shown."""
        self._warnings += 1
        if self._warnings <= MAX_SCHEMA_WARNINGS:
            log.warning(message, *args)
        elif self._warnings == MAX_SCHEMA_WARNINGS + 1:
            log.warning(
                "%s: more records refused; not shown one by one (their events are quarantined)", self.topic
            )

    def why_unreadable(self, fingerprint: int) -> tuple[str, str] | None:
        """(reason, detail) when events of this fingerprint must not be read; None when they may."""
        refused = self.refused.get(fingerprint)
        if refused is not None and (
            refused[0] == "ambiguous-schema" or fingerprint not in self.store.schemas
        ):
            return refused
        return None

    def _remember(self, fingerprint: int, value: bytes) -> None:
        if self._remember_in is None:
            return
        path = self._remember_in / f"{fingerprint:016x}.avsc"
        if not path.exists():
            partial = path.with_suffix(".partial")
            partial.write_bytes(value)
            partial.replace(path)


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

    Reading the broker's metadata takes a client and a round trip — about 24 ms of every
    micro-batch in the demo's profile — and counts seldom change, so they are kept for up to
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
        """DecodeError when the watermark disagrees with the broker (event_rules.check_watermark)."""
        try:
            check_watermark(watermark, topic, partition, self._kept(), now)
        except DecodeError:
            if self._read_this_batch:
                raise
            check_watermark(watermark, topic, partition, self._reread(), now)

    def _kept(self) -> Mapping[str, int]:
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
    """Decodes micro-batches through one gate: every message becomes an event, a watermark or a
    quarantine row with its reason.

    The line between the two kinds of failure is drawn here, once: reading the schema topic, the
    schema registry or the broker's metadata is infrastructure (its errors propagate, Spark
    retries the batch);
    everything about one message's bytes and content is that message's fault (quarantined, the
    batch goes on) — whatever exception the content provokes, not only the ones foreseen.
    """

    schemas: SchemaTopic
    topics: Topics
    partitions: BrokerPartitions
    #: With ``--schema-registry-url``: resolves the ids of registry-framed messages.
    registry: SchemaRegistry | None = None
    _versions: dict[tuple[int, tuple[str, ...]], TableVersion] = field(default_factory=dict)
    #: Registry id → its schema's fingerprint, or why its messages cannot be read.
    _registry_ids: dict[int, int | DecodeError] = field(default_factory=dict)
    #: (table, schema_key) → the writer schema a JSON event of that version stands for.
    _json_writers: dict[tuple[str, str], WriterSchema] = field(default_factory=dict)
    #: Whether this batch re-read the schema topic already (at most once per batch: the producer
    #: publishes a schema or table version before its first event, so one read finds them all).
    _refreshed: bool = False

    def decode(self, rows: pa.Table) -> DecodedBatch:
        """``rows`` has the Kafka columns key, value, topic, partition and offset."""
        batch = DecodedBatch([], [], [])
        tombstones = 0
        self._refreshed = False
        values = rows.column("value").to_pylist()
        self._refresh_for(values)
        now = now_micros()
        self.partitions.start_batch()
        columns = (rows.column(name).to_pylist() for name in ("key", "topic", "partition", "offset"))
        for value, key, topic, partition, offset in zip(values, *columns, strict=True):
            if value is None and key is not None:
                tombstones += 1
                continue
            try:
                record, writer = self._read(value, key)
                if is_watermark(writer):
                    watermark = Watermark.from_record(record)
                    self.partitions.check(watermark, topic, partition, now)
                    batch.watermarks.append(WatermarkSeen(topic, partition, offset, watermark))
                    continue
                version = self._version(writer, record)
                order = check_event(self.topics, topic, record, version, now)
            except DecodeError as exc:
                batch.quarantined.append(
                    Quarantined(topic, partition, offset, key, value, exc.reason, exc.detail)
                )
                continue
            except RegistryError:
                raise  # infrastructure, as the schema topic's reads are
            except Exception as exc:  # the content provoked it; see the class docstring
                detail = f"{type(exc).__name__}: {exc}"
                batch.quarantined.append(
                    Quarantined(topic, partition, offset, key, value, "not-an-event", detail)
                )
                continue
            batch.events.append(DecodedEvent(topic, partition, offset, key, value, version, record, order))
        return replace(batch, tombstones=tombstones)

    def _refresh_for(self, values: list[bytes | None]) -> None:
        """Re-read the schema topic before decoding when a fingerprint in the batch is not known yet."""
        store, refused = self.schemas.store.schemas, self.schemas.refused
        for value in values:
            try:
                fingerprint = self._locate(value)[0] if value else None
            except DecodeError:
                continue  # quarantined when the message is read
            if fingerprint is not None and fingerprint not in store and fingerprint not in refused:
                self._refresh()
                return

    def _refresh(self) -> None:
        self._refreshed = True
        self.schemas.refresh()

    def _read(self, value: bytes | None, key: bytes | None) -> tuple[dict[str, Any], WriterSchema]:
        if not value:
            raise DecodeError("empty", "the message has no value (and no key: not a tombstone)")
        if value[:1] == b"{":
            return self._read_json(value, key)
        fingerprint, body_start = self._locate(value)
        unreadable = self.schemas.why_unreadable(fingerprint)
        if unreadable is not None:
            raise DecodeError(*unreadable)
        return self.schemas.store.read_body(value, fingerprint, body_start)

    def _read_json(self, value: bytes, key: bytes | None) -> tuple[dict[str, Any], WriterSchema]:
        """A JSON event (a keyed message) or watermark record (no key) → the Avro record it
        stands for, validated against its writer schema, encoded and read back: the record is
        then exactly what the Avro event would have decoded to."""
        try:
            document = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise DecodeError("undecodable-json", f"{type(exc).__name__}: {str(exc)[:200]}") from None
        if not isinstance(document, dict):
            raise DecodeError("undecodable-json", "not a JSON object")
        try:
            if key is None:
                writer, ready = WATERMARK_WRITER, avro_watermark(document)
            else:
                table = self._json_version(document)
                writer, ready = self._json_writer(table), avro_event(document, table)
            validate(ready, writer.parsed, raise_errors=True)
        except DecodeError:
            raise
        except (ValueError, TypeError, KeyError, ContractError) as exc:
            raise DecodeError("undecodable-json", f"{type(exc).__name__}: {str(exc)[:200]}") from None
        return read_body(writer, encode(writer, ready), HEADER_LENGTH), writer

    def _json_version(self, document: Mapping[str, Any]) -> TableSchema:
        """The table version a JSON event names; the schema topic re-read when it is not known
        yet, unless this batch read it already."""
        named = (str(document.get("object")), str(document.get("schema_key")))
        version = self.schemas.versions.get(named)
        if version is None and not self._refreshed:
            self._refresh()
            version = self.schemas.versions.get(named)
        if version is None:
            raise DecodeError(
                "unknown-table-version",
                f"no table version {named[1][:64]!r} of {named[0][:120]!r} on the schema topic",
            )
        return version

    def _json_writer(self, table: TableSchema) -> WriterSchema:
        named = (table.table, table.schema_key)
        writer = self._json_writers.get(named)
        if writer is None:
            writer = self._json_writers[named] = WriterSchema.from_schema(table.event_schema)
        return writer

    def _locate(self, value: bytes) -> tuple[int, int]:
        """(the writer schema's fingerprint, where the Avro body starts), whichever way the
        message's header names its schema (schemas.wire)."""
        if is_registry_framed(value):
            return self._registered_fingerprint(read_schema_id(value)), REGISTRY_HEADER_LENGTH
        return read_fingerprint(value), HEADER_LENGTH

    def _registered_fingerprint(self, schema_id: int) -> int:
        """The fingerprint of the registry's schema ``schema_id``; DecodeError when the message's
        id cannot be read (no registry configured, an id the registry does not have, a schema
        that is not the contract's). A registry that does not answer or refuses the consumer's
        credentials is infrastructure: that error propagates and the batch is tried again."""
        known = self._registry_ids.get(schema_id)
        if known is None:
            known = self._ask_registry(schema_id)
            if isinstance(known, int) or len(self._registry_ids) < MAX_REFUSED_SCHEMAS:
                self._registry_ids[schema_id] = known
        if isinstance(known, DecodeError):
            raise known
        return known

    def _ask_registry(self, schema_id: int) -> int | DecodeError:
        if self.registry is None:
            return DecodeError(
                "registry-framed",
                f"in the Schema Registry wire format (schema id {schema_id}); "
                "start the consumer with --schema-registry-url",
            )
        try:
            text = self.registry.schema_text(schema_id)
        except SchemaRegistryRefusedError as exc:
            if exc.http_status != NOT_FOUND:
                raise
            return DecodeError("unknown-schema-id", f"the schema registry has no schema id {schema_id}")
        try:
            return WriterSchema.from_schema(check_writer_schema(text)).fingerprint
        except (SchemaRejectedError, ValueError, TypeError, KeyError) as exc:
            return DecodeError(
                "rejected-schema", f"registry schema id {schema_id} is not the contract's: {exc}"
            )

    def _version(self, writer: WriterSchema, record: dict[str, Any]) -> TableVersion:
        primary_keys = tuple(record["source_metadata"]["primary_keys"])
        cache_key = (writer.fingerprint, primary_keys)
        version = self._versions.get(cache_key)
        if version is None:
            try:
                version = TableVersion.from_writer(writer, primary_keys)
            except ContractError as exc:
                raise DecodeError("not-an-event", f"decodes, but is not a change event: {exc}") from exc
            check_version(version)
            self._versions[cache_key] = version
        return version
