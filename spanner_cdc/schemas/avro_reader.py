"""Avro binary decoding: a writer schema turned once into a tree of C steps (``avro_steps``).

The consumer's tasks spend most of their Python time decoding events (docs/consumer.md,
Performance). fastavro's ``schemaless_reader`` interprets the schema for every record, through a
file-like object, one Python call per field. Here each writer schema becomes, once per schema and
process, a tree of :class:`~spanner_cdc.schemas.avro_steps.Step` — one per record, field, union
and array — that the compiled ``avro_steps`` walks over a message's bytes by position: a varint,
a length, a UTF-8 string, a float in C (``make bench`` measures it beside fastavro in one run).

The output is fastavro's: the same dicts, lists and values; logical types made by fastavro's own
converters (``fastavro.read.LOGICAL_READERS``: ``Decimal``, ``UUID``), except timestamps and
dates, which the C steps make equal to the converters' ``datetime`` and ``date``; unknown logical
types left as their primitive (``tests/unit/schemas/test_avro_reader.py`` compares both over generated
events of every column type). Bytes that are not a record of the schema raise what fastavro
raises for them — ``EOFError`` when they end too early, ``ValueError`` (or
``UnicodeDecodeError``, ``OverflowError``) when they say something impossible — and
``schemas.wire.read_body`` turns those into the quarantine's ``truncated`` and ``corrupt``. Where
fastavro reads garbage leniently (a negative union index counts from the last branch, a varint
may be longer than ten bytes or hold more than 64 bits), this reader refuses it as corrupt; and
a message cut short is ``truncated`` every time (fastavro raised IndexError for some, which read
as corrupt).

Types the contract never writes (``enum``, ``fixed``) are refused when the schema is compiled.
Schemas come from ``schemas.schema_check`` (bounded depth and size, no recursion, no item that
takes zero bytes: ``avro_steps`` relies on the last to end a huge item count early).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastavro.read import LOGICAL_READERS

from spanner_cdc.schemas.avro_steps import CompiledReader
from spanner_cdc.schemas.avro_tree import CALENDAR_KINDS, schema_steps

#: ``(message, position)`` → the value read from ``position`` on and the position after it.
Reader = Callable[[bytes, int], tuple[Any, int]]


def compile_reader(parsed_schema: Any, *, calendar_numbers: bool = False) -> CompiledReader:
    """The reader for a schema as ``fastavro.parse_schema`` returns it (names fully qualified).
    With ``calendar_numbers``, timestamps and dates read as the numbers written (micros, millis,
    days since the epoch: what an Arrow column of their type holds), still refused outside the
    years 1-9999 as fastavro refuses them."""
    return CompiledReader(schema_steps(parsed_schema, calendar_numbers=calendar_numbers))


def calendar_converter(avro_type: Any) -> Callable[[int], Any] | None:
    """For a timestamp or date type, which ``calendar_numbers`` reads as a number: fastavro's
    converter of that number to the ``datetime`` or ``date`` it reads the same bytes as (what
    the reader without ``calendar_numbers`` makes); None for any other type."""
    if not isinstance(avro_type, dict):
        return None
    logical = f"{avro_type.get('type')}-{avro_type.get('logicalType')}"
    if logical not in CALENDAR_KINDS:
        return None
    convert = LOGICAL_READERS[logical]
    return lambda number: convert(number, avro_type, None)
