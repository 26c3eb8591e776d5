"""Avro single-object encoding: ``C3 01`` + CRC-64-AVRO fingerprint (little-endian) + body.

Readers find the writer schema by fingerprint (published on ``_spanner-cdc.{prefix}.schemas``), so every
message is self-describing without a schema registry, and any Avro implementation that supports
the specification's single-object encoding (Java's ``BinaryMessageDecoder`` among them) reads it.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

import fastavro
from fastavro.schema import fingerprint as _fingerprint_hex
from fastavro.schema import to_parsing_canonical_form

from spanner_cdc.schemas.avro_writer import Writer, compile_writer
from spanner_cdc.schemas.errors import DecodeError

MAGIC = b"\xc3\x01"
HEADER_LENGTH = len(MAGIC) + 8


@dataclass(frozen=True)
class WriterSchema:
    """A parsed schema with its fingerprint, ready for fast encoding."""

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
        only decode, never compile the schemas they are handed."""
        return compile_writer(self.parsed)

    @cached_property
    def reading(self) -> Any:
        """The schema decoding uses: ``parsed`` without ``uuid`` logical types, so UUID columns
        decode as the text they were written as (fastavro would make ``uuid.UUID`` objects, which
        Arrow and the replicas' loaders do not take). A logical type never changes the bytes."""
        if '"uuid"' not in self.schema_json:
            return self.parsed
        return fastavro.parse_schema(_without_uuid_logical_types(json.loads(self.schema_json)))

    @classmethod
    def from_schema(cls, schema: Mapping[str, Any] | str) -> WriterSchema:
        raw = json.loads(schema) if isinstance(schema, str) else dict(schema)
        parsed = fastavro.parse_schema(raw)
        # fastavro renders the fingerprint as its little-endian bytes; the number (what Java's
        # SchemaNormalization.parsingFingerprint64 returns, and our topic key) is read from them.
        wire_bytes = bytes.fromhex(_fingerprint_hex(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
        fingerprint = int.from_bytes(wire_bytes, "little")
        return cls(json.dumps(raw, separators=(",", ":")), parsed, fingerprint)


def _without_uuid_logical_types(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_without_uuid_logical_types(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        name: _without_uuid_logical_types(value)
        for name, value in schema.items()
        if not (name == "logicalType" and value == "uuid")
    }


def encode(writer: WriterSchema, record: Mapping[str, Any]) -> bytes:
    """One record (its values in Avro's primitive forms) → single-object-encoded bytes."""
    buffer = bytearray(writer.header)
    writer.writer(buffer, record)
    return bytes(buffer)


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
        """Bytes → record and the writer schema it was written with."""
        fingerprint = read_fingerprint(message)
        writer = self.schemas.get(fingerprint)
        if writer is None:
            raise DecodeError("unknown-fingerprint", f"no writer schema with fingerprint {fingerprint:016x}")
        body = io.BytesIO(message)
        body.seek(HEADER_LENGTH)
        try:
            record = cast(dict[str, Any], fastavro.schemaless_reader(body, writer.reading, None))
        except (EOFError, StopIteration) as exc:
            raise DecodeError("truncated", "body ends before the record does") from exc
        except (ValueError, UnicodeDecodeError, IndexError, struct.error, OverflowError) as exc:
            raise DecodeError("corrupt", f"{type(exc).__name__}: {exc}") from exc
        if body.tell() != len(message):
            raise DecodeError("corrupt", f"{len(message) - body.tell()} bytes left after the record")
        return record, writer
