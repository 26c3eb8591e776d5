"""Avro binary encoding: a writer schema turned once into the tree of C steps the reader walks
too (``schemas.avro_tree``), walked over each value by ``avro_steps.CompiledWriter``.

fastavro's ``schemaless_writer`` interprets the schema for every record and resolves each union
by trying its branches; the event envelope has about thirty fields, most in unions. The steps
write each value's bytes in C — a varint, a length and UTF-8, a float — into one buffer that
starts with the message's header (the bench's producer part measures it beside fastavro).

Values must already be in Avro's primitive forms — what ``schemas.spanner_types``' converters
and the event builder produce: ints for timestamps and dates, bytes for decimals, text for JSON —
so a logical type is written as its underlying type. For such values the output is
byte-identical to fastavro's (``tests/unit/schemas/test_avro_writer.py`` compares them over
generated events of every column type). A value the schema cannot hold is refused, not written
(``CompiledWriter`` says how).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spanner_cdc.schemas.avro_steps import CompiledWriter
from spanner_cdc.schemas.avro_tree import schema_steps

#: ``(header, value)`` → ``header`` followed by the Avro body of ``value``.
Writer = Callable[[bytes, Any], bytes]


def compile_writer(parsed_schema: Any) -> CompiledWriter:
    """The writer for a schema as ``fastavro.parse_schema`` returns it (names fully qualified)."""
    return CompiledWriter(schema_steps(parsed_schema))
