"""The two ways a message names its writer schema in front of the Avro body.

- Avro single-object encoding (the default): ``C3 01`` + CRC-64-AVRO fingerprint (little-endian).
  Readers find the writer schema by fingerprint (published on ``_spanner-cdc.{prefix}.schemas``),
  so every message is self-describing without a schema registry, and any Avro implementation
  that supports the specification's single-object encoding (Java's ``BinaryMessageDecoder``
  among them) reads it.
- Confluent's Schema Registry wire format (``--schema-registry-url``): ``00`` + the schema's
  registry id (4 bytes, big-endian), what Kafka Connect's AvroConverter, ksqlDB and Flink read.
  The id means something only to the registry that handed it out (common.schema_registry).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import fastavro
from fastavro.schema import fingerprint as _fingerprint_hex
from fastavro.schema import to_parsing_canonical_form

from spanner_cdc.schemas.avro_reader import Reader, compile_reader
from spanner_cdc.schemas.avro_steps import CompiledReader
from spanner_cdc.schemas.avro_writer import Writer, compile_writer
from spanner_cdc.schemas.errors import DecodeError

MAGIC = b"\xc3\x01"
HEADER_LENGTH = len(MAGIC) + 8
REGISTRY_MAGIC = b"\x00"
REGISTRY_HEADER_LENGTH = len(REGISTRY_MAGIC) + 4


@dataclass(frozen=True)
class WriterSchema:
    """A parsed schema with its fingerprint, ready for fast encoding and decoding."""

    schema_json: str
    parsed: Any
    fingerprint: int

    @property
    def fingerprint_hex(self) -> str:
        """The form used as the key on ``_spanner-cdc.{prefix}.schemas``."""
        return f"{self.fingerprint:016x}"

    @cached_property
    def header(self) -> bytes:
        return MAGIC + struct.pack("<Q", self.fingerprint)

    @cached_property
    def writer(self) -> Writer:
        """The compiled encoder (``schemas.avro_writer``), built on first use: readers, which
        only decode, never compile an encoder for the schemas they are handed."""
        return compile_writer(self.parsed)

    @cached_property
    def reader(self) -> Reader:
        """The compiled decoder of :attr:`reading` (``schemas.avro_reader``), built on first use."""
        return compile_reader(self.reading)

    @cached_property
    def column_reader(self) -> CompiledReader:
        """:attr:`reader`, but timestamps and dates read as the numbers an Arrow column of their
        type holds (``compile_reader``'s ``calendar_numbers``): what the consumer reads events
        with, since every value it decodes goes to Arrow."""
        return compile_reader(self.reading, calendar_numbers=True)

    @cached_property
    def reading(self) -> Any:
        """The schema decoding uses: ``parsed`` without ``uuid`` logical types, so UUID columns
        decode as the text they were written as (fastavro would make ``uuid.UUID`` objects, which
        Arrow and the replicas' loaders do not take). A logical type never changes the bytes."""
        if '"uuid"' not in self.schema_json:
            return self.parsed
        return fastavro.parse_schema(without_logical_types(json.loads(self.schema_json), ("uuid",)))

    @classmethod
    def from_schema(cls, schema: Mapping[str, Any] | str) -> WriterSchema:
        raw = json.loads(schema) if isinstance(schema, str) else dict(schema)
        parsed = fastavro.parse_schema(raw)
        # fastavro renders the fingerprint as its little-endian bytes; the number (what Java's
        # SchemaNormalization.parsingFingerprint64 returns, and our topic key) is read from them.
        wire_bytes = bytes.fromhex(_fingerprint_hex(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
        fingerprint = int.from_bytes(wire_bytes, "little")
        return cls(json.dumps(raw, separators=(",", ":")), parsed, fingerprint)


def without_logical_types(schema: Any, logical_types: Collection[str]) -> Any:
    """``schema`` (as JSON) with the ``logicalType`` annotations named in ``logical_types``
    removed, wherever they are: their values read as the primitive written."""
    if isinstance(schema, list):
        return [without_logical_types(branch, logical_types) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        name: without_logical_types(value, logical_types)
        for name, value in schema.items()
        if not (name == "logicalType" and value in logical_types)
    }


def encode(
    writer: WriterSchema, record: Mapping[str, Any] | tuple[Any, ...], header: bytes | None = None
) -> bytes:
    """One record (its values in Avro's primitive forms; by field name, or as a tuple of its
    fields in order) → ``header`` + its Avro body; the header is the single-object one unless
    another is given (:func:`registry_header`)."""
    return writer.writer(writer.header if header is None else header, record)


def registry_header(schema_id: int) -> bytes:
    """The Schema Registry wire format's header for the schema the registry calls ``schema_id``."""
    return REGISTRY_MAGIC + struct.pack(">I", schema_id)


def is_registry_framed(message: bytes) -> bool:
    """Whether ``message`` carries the Schema Registry's header (else the single-object one)."""
    return message[:1] == REGISTRY_MAGIC


def body_start(message: bytes) -> int:
    """Where the Avro body of a message whose header was read without error starts."""
    return REGISTRY_HEADER_LENGTH if is_registry_framed(message) else HEADER_LENGTH


def read_schema_id(message: bytes) -> int:
    """The registry id of a Schema Registry-framed message, or DecodeError when it is too short."""
    if len(message) < REGISTRY_HEADER_LENGTH:
        raise DecodeError("truncated", f"{len(message)} bytes is shorter than the 5-byte registry header")
    schema_id: int = struct.unpack_from(">I", message, 1)[0]
    return schema_id


def read_fingerprint(message: bytes) -> int:
    """The writer schema's fingerprint, or DecodeError when the bytes are not single-object."""
    if len(message) < HEADER_LENGTH:
        raise DecodeError("truncated", f"{len(message)} bytes is shorter than the 10-byte header")
    if message[:2] != MAGIC:
        raise DecodeError("bad-magic", f"starts with {message[:2].hex()}, expected c301")
    fingerprint: int = struct.unpack_from("<Q", message, 2)[0]
    return fingerprint


@dataclass
class SchemaStore:
    """Writer schemas by fingerprint, as a reader accumulates them from ``_spanner-cdc.{prefix}.schemas``."""

    schemas: dict[int, WriterSchema] = field(default_factory=dict)

    def add(self, schema: Mapping[str, Any] | str) -> WriterSchema:
        writer = WriterSchema.from_schema(schema)
        self.schemas[writer.fingerprint] = writer
        return writer

    def decode(self, message: bytes) -> dict[str, Any]:
        """Bytes → record, with DecodeError naming why it failed (never a partial record)."""
        return self.read(message)[0]

    def read(self, message: bytes) -> tuple[dict[str, Any], WriterSchema]:
        """Single-object bytes → record and the writer schema it was written with."""
        return self.read_body(message, read_fingerprint(message), HEADER_LENGTH)

    def read_body(self, message: bytes, fingerprint: int, start: int) -> tuple[dict[str, Any], WriterSchema]:
        """The Avro body from ``start`` on, written with the schema of ``fingerprint`` (however
        the header named it) → record and writer schema."""
        writer = self.schemas.get(fingerprint)
        if writer is None:
            raise DecodeError("unknown-fingerprint", f"no writer schema with fingerprint {fingerprint:016x}")
        return read_body(writer, message, start), writer


def body_error(exc: BaseException) -> DecodeError:
    """Why an Avro body could not be read, from what reading it raised (the compiled steps:
    ``EOFError``, ``ValueError``, ``UnicodeDecodeError``, a converter's ``ArithmeticError``;
    schemas.avro_steps): ``truncated`` where it ends early, ``corrupt`` where its bytes say
    something impossible, ``not-an-event`` for anything else."""
    if isinstance(exc, EOFError):
        return DecodeError("truncated", "body ends before the record does")
    reason = "corrupt" if isinstance(exc, ValueError | ArithmeticError) else "not-an-event"
    return DecodeError(reason, f"{type(exc).__name__}: {exc}")


def read_body(
    writer: WriterSchema, message: bytes, start: int, *, calendar_numbers: bool = False
) -> dict[str, Any]:
    """The Avro body of ``message`` from ``start`` on, written with ``writer`` → the record, or
    DecodeError naming why not (never a partial record). With ``calendar_numbers``, timestamps
    and dates are the numbers written (:attr:`WriterSchema.column_reader`)."""
    reader = writer.column_reader if calendar_numbers else writer.reader
    try:
        record, end = reader(message, start)
        if end != len(message):
            raise ValueError(f"{len(message) - end} bytes left after the record")
    except (EOFError, ValueError, ArithmeticError) as exc:
        raise body_error(exc) from exc
    decoded: dict[str, Any] = record  # every writer schema's top level is a record (schema_check)
    return decoded
