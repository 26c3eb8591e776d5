"""A parsed Avro schema turned into the tree of C steps (``avro_steps.Step``) that the compiled
reader (``schemas.avro_reader``) and writer (``schemas.avro_writer``) both walk: one definition
of how each schema node is read and written.

A named record's step is registered before its fields are built, so later references
(``"type": "ns.Name"``) share it. Types the contract never writes (``enum``, ``fixed``) and a
union directly inside a union are refused here, when a schema is compiled.
"""

from __future__ import annotations

from typing import Any

from fastavro.read import LOGICAL_READERS

from spanner_cdc.schemas.avro_steps import Kind, Step
from spanner_cdc.schemas.errors import ContractError

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
CALENDAR_KINDS = {
    "long-timestamp-micros": Kind.UTC_MICROS,
    "long-timestamp-millis": Kind.UTC_MILLIS,
    "int-date": Kind.DAYS,
}


def schema_steps(parsed_schema: Any, *, calendar_numbers: bool = False) -> Step:
    """The top step of a schema as ``fastavro.parse_schema`` returns it (names fully qualified).
    ``calendar_numbers``: timestamps and dates read as the numbers written (the writer ignores it)."""
    return _StepBuilder(calendar_numbers).step(parsed_schema)


class _StepBuilder:
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
                return Step(_PRIMITIVE_KINDS[schema], int32=schema == "int")
            if schema not in self.records:
                raise ContractError(f"the schema references {schema!r} before defining it")
            return self.records[schema]
        kind = schema["type"]
        if kind == "record":
            record = self.records[schema["name"]] = Step(Kind.RECORD)
            fields = schema["fields"]
            record.set_fields(
                tuple(field["name"] for field in fields),
                tuple(self.step(field["type"]) for field in fields),
                {field["name"]: field["default"] for field in fields if "default" in field},
            )
            return record
        if kind == "array":
            return Step(Kind.ARRAY, child=self.step(schema["items"]))
        if kind == "map":
            return Step(Kind.MAP, child=self.step(schema["values"]))
        if isinstance(kind, str) and kind in _PRIMITIVE_KINDS:  # a primitive, perhaps with a logicalType
            logical = f"{kind}-{schema.get('logicalType')}"
            return Step(
                CALENDAR_KINDS.get(logical, _PRIMITIVE_KINDS[kind]),
                convert=LOGICAL_READERS.get(logical),
                schema=schema,
                as_number=self.calendar_numbers,
                int32=kind == "int",
            )
        raise ContractError(f"the compiled Avro steps do not support type {kind!r}")
