"""``_spanner-cdc.{prefix}.schemas``: the writer schemas (and JSON table versions) the producer
publishes before the first event that uses them, read incrementally and checked before use."""

from __future__ import annotations

import hashlib
import logging
from contextlib import closing

from confluent_kafka import Consumer

from spanner_cdc.common.kafka_offsets import READER_SETTINGS, read_to_end
from spanner_cdc.consumer.config import MAX_WRITER_SCHEMAS
from spanner_cdc.consumer.decode.gate import parsed_schema
from spanner_cdc.consumer.locations import Location
from spanner_cdc.schemas.json_events import VERSION_KEY_PREFIX, version_from_record
from spanner_cdc.schemas.schema_check import MAX_SCHEMA_BYTES, check_writer_schema, reading_form, without_docs
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import WATERMARK_SCHEMA, WATERMARK_WRITER
from spanner_cdc.schemas.wire import SchemaStore, WriterSchema

log = logging.getLogger("spanner_cdc.consumer")

#: Refused fingerprints remembered with the reason why; the events of further refused ones are
#: quarantined as ``unknown-fingerprint`` — a flood of garbage on the schema topic must not fill memory.
MAX_REFUSED_SCHEMAS = 1_000
#: Table versions for JSON events kept at most (each is checked, but a flood must not fill memory).
MAX_JSON_VERSIONS = 100_000
#: Schema text kept at most, in all (docs left out): a flood of large valid-looking schemas is
#: stopped there, whatever their number.
MAX_KEPT_SCHEMA_BYTES = 256 << 20
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

    def __init__(
        self,
        client_config: dict[str, str],
        prefix: str,
        remember_in: Location | None = None,
        max_schemas: int = MAX_WRITER_SCHEMAS,
        max_bytes: int = MAX_KEPT_SCHEMA_BYTES,
    ) -> None:
        self.topic = Topics(prefix).schemas
        #: Fingerprint → the text of its schema, for schemas that passed the checks (the text,
        #: not the parsed schema: a tenth of the memory; readers parse what they use).
        self.texts = {WATERMARK_WRITER.fingerprint: WATERMARK_WRITER.schema_json}
        #: Fingerprint → why events written with it cannot be read (reason, detail).
        self.refused: dict[int, tuple[str, str]] = {}
        #: Fingerprint → a digest of its schema's reading form (a lookalike's differs).
        self._reading_forms = {WATERMARK_WRITER.fingerprint: _digest(reading_form(WATERMARK_SCHEMA))}
        self._max_schemas = max_schemas
        self._max_bytes = max_bytes
        self._kept_bytes = sum(len(text) for text in self.texts.values())
        #: (table, schema_key) → the table version JSON events of it are read with.
        self.versions: dict[tuple[str, str], TableSchema] = {}
        self._client_config = client_config
        self._positions: dict[int, int] = {}
        self._remember_in = remember_in
        #: The names of the schema files kept in ``remember_in``.
        self._remembered: set[str] = set()
        self._warnings = 0
        if remember_in is not None:
            for path in remember_in.files("*.avsc"):
                self._remembered.add(path.name)
                self.accept(path.name.removesuffix(".avsc").encode(), path.read_bytes())

    def refresh(self) -> None:
        consumer = Consumer(
            {
                **READER_SETTINGS,
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
            schema = without_docs(check_writer_schema(text))
            writer = WriterSchema.from_schema(schema)
        except Exception as exc:  # a hostile record: whatever fails reading it costs that record only
            self._reject(fingerprint, f"schema {fingerprint:016x} is not the contract's: {str(exc)[:200]}")
            return
        if writer.fingerprint != fingerprint:
            self._reject(fingerprint, f"the schema under key {fingerprint:016x} has another fingerprint")
            return
        if fingerprint not in self.texts and self._kept_bytes + len(writer.schema_json) > self._max_bytes:
            self._warn(
                "%s: more than %s bytes of writer schemas; %016x and later ones are ignored and "
                "their events quarantined as unknown-fingerprint",
                self.topic,
                f"{self._max_bytes:,}",
                fingerprint,
            )
            return
        if fingerprint not in self.texts and len(self.texts) >= self._max_schemas:
            self._warn(
                "%s: more than %d writer schemas (--max-writer-schemas); %016x and later ones are "
                "ignored and their events quarantined as unknown-fingerprint",
                self.topic,
                self._max_schemas,
                fingerprint,
            )
            return
        form = _digest(reading_form(schema))
        known = self._reading_forms.setdefault(fingerprint, form)
        if known != form:
            detail = f"two valid schemas with fingerprint {fingerprint:016x} read differently"
            if self.refused.get(fingerprint, ("",))[0] != "ambiguous-schema":
                self._warn("%s: %s; its events are quarantined", self.topic, detail)
            self.refused[fingerprint] = ("ambiguous-schema", detail)
            return
        if fingerprint not in self.texts:
            self.texts[fingerprint] = writer.schema_json
            self._kept_bytes += len(writer.schema_json)
        self._remember(fingerprint, writer.schema_json.encode())

    def _accept_version(self, key: bytes, value: bytes) -> None:
        """A table version for JSON events, used only if its columns hash to the key's schema_key."""
        if len(value) > MAX_SCHEMA_BYTES:
            self._warn("%s: a table-version record of %d bytes was ignored", self.topic, len(value))
            return
        if len(self.versions) >= MAX_JSON_VERSIONS:
            self._warn("%s: more than %d table versions; the rest are ignored", self.topic, MAX_JSON_VERSIONS)
            return
        try:
            version = version_from_record(key.decode(), value)
        except Exception as exc:  # a hostile record (also nested ~1,000 deep: RecursionError)
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
        if refused is not None and (refused[0] == "ambiguous-schema" or fingerprint not in self.texts):
            return refused
        return None

    def store(self) -> SchemaStore:
        """The accepted schemas, parsed, to decode single-object messages with (the demo's
        sample event; the consumer reads through consumer.decode.gate)."""
        return SchemaStore({fingerprint: parsed_schema(text) for fingerprint, text in self.texts.items()})

    def _remember(self, fingerprint: int, value: bytes) -> None:
        if self._remember_in is None:
            return
        name = f"{fingerprint:016x}.avsc"
        if name not in self._remembered:
            (self._remember_in / name).write_bytes(value)
            self._remembered.add(name)


def _digest(form: str) -> bytes:
    """A reading form kept as its SHA-256 (forms are as long as their schemas)."""
    return hashlib.sha256(form.encode()).digest()
