"""The event contract between producer and consumer (docs/design.md §3), and what a third-party
reader needs to read the project's topics.

Everything that decides how a Spanner change becomes bytes on Kafka lives here, so that the
producer, the consumer and third-party readers agree by construction: Spanner → Avro type
mapping and value conversion, per-table Avro schemas, ``schema_key``, the deterministic event
uuid, ``sort_keys``, the CRC-64-AVRO fingerprint and Avro single-object encoding. The names
below are the public surface (each has its own docstring); the field-by-field contract is in
``schemas/README.md``.

Reading a topic: collect writer schemas from ``Topics(prefix).schemas`` into a
:class:`SchemaStore`; for each message, :func:`read_fingerprint` (or :func:`read_schema_id`
when :func:`is_registry_framed`) names its :class:`WriterSchema`, :func:`is_watermark` tells a
watermark record (:class:`Watermark`) from an event, and :func:`read_body` from
:func:`body_start` on gives the record. Order a table's events by ``sort_keys`` and drop
events with a ``uuid`` seen before: :func:`change_uuid` and its siblings say how each is made.
"""

from spanner_cdc.schemas.errors import ContractError, DecodeError
from spanner_cdc.schemas.events import (
    READ_METHOD_BACKFILL,
    READ_METHOD_CHANGE_STREAMS,
    READ_METHOD_POLL,
    Event,
)
from spanner_cdc.schemas.identity import backfill_uuid, change_uuid, polled_uuid, row_id, sort_keys
from spanner_cdc.schemas.table import TableSchema, table_namespace
from spanner_cdc.schemas.timestamps import format_timestamp_micros, parse_timestamp_micros
from spanner_cdc.schemas.topics import CONTROL_NAMESPACE, Topics
from spanner_cdc.schemas.watermark import KIND_HEADER, WATERMARK_KIND, Watermark, is_watermark
from spanner_cdc.schemas.wire import (
    SchemaStore,
    WriterSchema,
    body_start,
    encode,
    is_registry_framed,
    read_body,
    read_fingerprint,
    read_schema_id,
)

__all__ = [
    "CONTROL_NAMESPACE",
    "KIND_HEADER",
    "READ_METHOD_BACKFILL",
    "READ_METHOD_CHANGE_STREAMS",
    "READ_METHOD_POLL",
    "WATERMARK_KIND",
    "ContractError",
    "DecodeError",
    "Event",
    "SchemaStore",
    "TableSchema",
    "Topics",
    "Watermark",
    "WriterSchema",
    "backfill_uuid",
    "body_start",
    "change_uuid",
    "encode",
    "format_timestamp_micros",
    "is_registry_framed",
    "is_watermark",
    "parse_timestamp_micros",
    "polled_uuid",
    "read_body",
    "read_fingerprint",
    "read_schema_id",
    "row_id",
    "sort_keys",
    "table_namespace",
]
