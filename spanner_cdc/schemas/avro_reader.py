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

from spanner_cdc.schemas.avro_steps import CompiledReader, Kind, Step
from spanner_cdc.schemas.errors import ContractError

#: ``(message, position)`` → the value read from ``position`` on and the position after it.
Reader = Callable[[bytes, int], tuple[Any, int]]

_PRIMITIVE_KINDS = {
    "null": Kind.NULL_VALUE,
    "boolean": Kind.BOOLEAN,
    "int": Kind.LONG,
    "long": Kind.LONG,
    "float": Kind.FLOAT,
    "double": Kind.DOUBLE,
    "string": Kind.STRING,
    "bytes": Kind.BYTES,
}
#: Logical types the C steps make themselves (``avro_steps.calendar_value``), by fastavro's
#: ``LOGICAL_READERS`` key; fastavro's converter stays the step's, for values out of range.
_CALENDAR_KINDS = {
    "long-timestamp-micros": Kind.UTC_MICROS,
    "long-timestamp-millis": Kind.UTC_MILLIS,
    "int-date": Kind.DAYS,
}


def compile_reader(parsed_schema: Any, *, calendar_numbers: bool = False) -> CompiledReader:
    """The reader for a schema as ``fastavro.parse_schema`` returns it (names fully qualified).
    With ``calendar_numbers``, timestamps and dates read as the numbers written (micros, millis,
    days since the epoch: what an Arrow column of their type holds), still refused outside the
    years 1-9999 as fastavro refuses them."""
    return CompiledReader(_StepBuilder(calendar_numbers).step(parsed_schema))


def calendar_converter(avro_type: Any) -> Callable[[int], Any] | None:
    """For a timestamp or date type, which ``calendar_numbers`` reads as a number: fastavro's
    converter of that number to the ``datetime`` or ``date`` it reads the same bytes as (what
    the reader without ``calendar_numbers`` makes); None for any other type."""
    if not isinstance(avro_type, dict):
        return None
    logical = f"{avro_type.get('type')}-{avro_type.get('logicalType')}"
    if logical not in _CALENDAR_KINDS:
        return None
    convert = LOGICAL_READERS[logical]
    return lambda number: convert(number, avro_type, None)


class _StepBuilder:
    """Walks a parsed schema into steps. A named record's step is registered before its fields
    are built, so later references (``"type": "ns.Name"``) share it."""

    def __init__(self, calendar_numbers: bool) -> None:
        self.records: dict[str, Step] = {}
        self.calendar_numbers = calendar_numbers

    def step(self, schema: Any) -> Step:
        if isinstance(schema, list):
            if any(isinstance(branch, list) for branch in schema):
                raise ContractError("a union directly inside a union")
            if len(schema) == 2 and schema[0] == "null":
                return Step(Kind.NULLABLE, child=self.step(schema[1]))
            return Step(Kind.UNION, branches=tuple(self.step(branch) for branch in schema))
        if isinstance(schema, str):
            if schema in _PRIMITIVE_KINDS:
                return Step(_PRIMITIVE_KINDS[schema])
            if schema not in self.records:
                raise ContractError(f"the schema references {schema!r} before defining it")
            return self.records[schema]
        kind = schema["type"]
        if kind == "record":
            record = self.records[schema["name"]] = Step(Kind.RECORD)
            fields = schema["fields"]
            record.set_fields(
                tuple(field["name"] for field in fields), tuple(self.step(field["type"]) for field in fields)
            )
            return record
        if kind == "array":
            return Step(Kind.ARRAY, child=self.step(schema["items"]))
        if kind == "map":
            return Step(Kind.MAP, child=self.step(schema["values"]))
        if isinstance(kind, str) and kind in _PRIMITIVE_KINDS:  # a primitive, perhaps with a logicalType
            logical = f"{kind}-{schema.get('logicalType')}"
            step_kind = _CALENDAR_KINDS.get(logical, _PRIMITIVE_KINDS[kind])
            return Step(
                step_kind,
                convert=LOGICAL_READERS.get(logical),
                schema=schema,
                as_number=self.calendar_numbers,
            )
        raise ContractError(f"the compiled Avro reader does not support type {kind!r}")
