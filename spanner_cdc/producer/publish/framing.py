"""The header in front of each message's Avro body (schemas.wire): which framing, and its bytes.

Headers are asked for once per topic and writer schema (a table version's first event, a
topic's first watermark round) and reused for every message after, so the registry is asked
nothing on the hot path.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from spanner_cdc.common.schema_registry import SchemaRegistry
from spanner_cdc.schemas.wire import WriterSchema, registry_header


class Framing(Protocol):
    async def header(self, subject: str, writer: WriterSchema) -> bytes:
        """The bytes that name ``writer`` in front of a body meant for ``subject``."""
        ...


class SingleObjectFraming:
    """Avro single-object encoding: the header is the writer schema's fingerprint."""

    async def header(self, subject: str, writer: WriterSchema) -> bytes:
        return writer.header


class RegistryFraming:
    """Confluent's wire format: ``writer`` is registered under ``subject`` (which may refuse
    it, e.g. as incompatible with the subject's earlier schemas: the producer stops with the
    registry's reason) and its id is the header."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry

    async def header(self, subject: str, writer: WriterSchema) -> bytes:
        return registry_header(await asyncio.to_thread(self.registry.register, subject, writer))
