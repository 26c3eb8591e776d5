"""Avro binary encoding compiled once per writer schema: a tree of small writer functions.

fastavro's ``schemaless_writer`` interprets the schema for every record it writes, resolving each
union by trying its branches; for the event envelope (about thirty fields, most in unions) that
took longer than building the event. Compiling the schema once into one writer per node cuts
the cost per event from about 27 to about 16 µs (docs/producer.md, Performance: figures, profile).

Values must already be in Avro's primitive forms — what ``schemas.spanner_types``' converters
and the event builder produce: ints for timestamps and dates, bytes for decimals, text for JSON —
so a logical type is written as its underlying type. For such values the output is
byte-identical to fastavro's (``tests/unit/test_avro_writer.py`` compares them over generated
events of every column type). Types the project's schemas never use (enum, fixed) are refused
when the schema is compiled, not guessed at.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

from spanner_cdc.schemas.errors import ContractError

#: Appends one value's encoding to the buffer.
Writer = Callable[[bytearray, Any], None]

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_pack_double = struct.Struct("<d").pack
_pack_float = struct.Struct("<f").pack


def compile_writer(parsed_schema: Any) -> Writer:
    """The writer for a schema as ``fastavro.parse_schema`` returns it (names fully qualified)."""
    return _Compiler().compile(parsed_schema)


def write_long(out: bytearray, value: int) -> None:
    """Zig-zag variable-length encoding (Avro ``long``)."""
    if 0 <= value < 64:  # one byte: lengths, counts, indexes, small numbers
        out.append(value << 1)
        return
    if not _LONG_MIN <= value <= _LONG_MAX:
        raise ValueError(f"{value} is out of the range of an Avro long")
    number = (value << 1) ^ (value >> 63)
    while number > 0x7F:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)


def write_int(out: bytearray, value: int) -> None:
    if not _INT_MIN <= value <= _INT_MAX:
        raise ValueError(f"{value} is out of the range of an Avro int")
    write_long(out, value)


def write_bytes(out: bytearray, value: bytes) -> None:
    length = len(value)
    if length < 64:
        out.append(length << 1)
    else:
        write_long(out, length)
    out += value


def write_string(out: bytearray, value: str) -> None:
    write_bytes(out, value.encode())


def write_boolean(out: bytearray, value: bool) -> None:
    out.append(1 if value else 0)


def write_double(out: bytearray, value: float) -> None:
    out += _pack_double(value)


def write_float(out: bytearray, value: float) -> None:
    out += _pack_float(value)


def write_null(_out: bytearray, value: None) -> None:
    if value is not None:
        raise ValueError(f"{value!r} is not null")


_PRIMITIVES: dict[str, Writer] = {
    "null": write_null,
    "boolean": write_boolean,
    "int": write_int,
    "long": write_long,
    "float": write_float,
    "double": write_double,
    "bytes": write_bytes,
    "string": write_string,
}


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_mapping(value: Any) -> bool:
    return isinstance(value, Mapping)


#: Which Python values a union branch of each type takes, as fastavro decides it.
_BRANCH_VALUES: dict[str, Callable[[Any], bool]] = {
    "null": lambda value: value is None,
    "boolean": lambda value: isinstance(value, bool),
    "int": _is_integer,
    "long": _is_integer,
    "float": _is_number,
    "double": _is_number,
    "bytes": lambda value: isinstance(value, bytes),
    "string": lambda value: isinstance(value, str),
    "record": _is_mapping,
    "array": lambda value: isinstance(value, list | tuple),
    "map": _is_mapping,
}


class _Compiler:
    """Compiles one schema; named records are looked up late, so a reference may precede the
    end of its definition (a record that contains itself)."""

    def __init__(self) -> None:
        self.named: dict[str, Writer] = {}

    def compile(self, schema: Any) -> Writer:
        if isinstance(schema, str):
            return self._reference(schema)
        if isinstance(schema, list):
            return self._union(schema)
        kind = schema["type"]
        if kind == "record":
            return self._record(schema)
        if kind == "array":
            return self._array(schema)
        if kind == "map":
            return self._map(schema)
        if isinstance(kind, str) and kind in _PRIMITIVES:  # a primitive, perhaps with a logicalType
            return _PRIMITIVES[kind]
        raise ContractError(f"the Avro writer does not support type {kind!r}")

    def _reference(self, name: str) -> Writer:
        if name in _PRIMITIVES:
            return _PRIMITIVES[name]
        if name not in self.named:
            raise ContractError(f"the schema references {name!r} before defining it")
        named = self.named

        def write_named(out: bytearray, value: Any) -> None:
            named[name](out, value)

        return write_named

    def _record(self, schema: Mapping[str, Any]) -> Writer:
        fields: list[tuple[str, bool, Any, Writer]] = []

        def write_record(out: bytearray, value: Mapping[str, Any]) -> None:
            for name, has_default, default, write in fields:
                write(out, value.get(name, default) if has_default else value[name])

        self.named[schema["name"]] = write_record
        for field in schema["fields"]:
            fields.append(
                (field["name"], "default" in field, field.get("default"), self.compile(field["type"]))
            )
        return write_record

    def _array(self, schema: Mapping[str, Any]) -> Writer:
        write_item = self.compile(schema["items"])

        def write_array(out: bytearray, value: list[Any]) -> None:
            if value:
                write_long(out, len(value))
                for item in value:
                    write_item(out, item)
            out.append(0)

        return write_array

    def _map(self, schema: Mapping[str, Any]) -> Writer:
        write_value = self.compile(schema["values"])

        def write_map(out: bytearray, value: Mapping[str, Any]) -> None:
            if value:
                write_long(out, len(value))
                for key, item in value.items():
                    write_string(out, key)
                    write_value(out, item)
            out.append(0)

        return write_map

    def _union(self, branches: list[Any]) -> Writer:
        if len(branches) == 2 and branches[0] == "null":  # the nullable field: one test, no search
            write_value = self.compile(branches[1])

            def write_nullable(out: bytearray, value: Any) -> None:
                if value is None:
                    out.append(0)
                else:
                    out.append(2)
                    write_value(out, value)

            return write_nullable
        choices = [
            (_accepts(self._kind(branch)), bytes(_zigzag_bytes(index)), self.compile(branch))
            for index, branch in enumerate(branches)
        ]

        def write_union(out: bytearray, value: Any) -> None:
            for accepts, index, write in choices:
                if accepts(value):
                    out += index
                    write(out, value)
                    return
            raise ValueError(f"{value!r} matches no branch of the union")

        return write_union

    def _kind(self, branch: Any) -> str:
        if isinstance(branch, str):
            return branch if branch in _PRIMITIVES else "record"
        if isinstance(branch, Mapping):
            return str(branch["type"])
        raise ContractError("a union directly inside a union")


def _accepts(kind: str) -> Callable[[Any], bool]:
    accepts = _BRANCH_VALUES.get(kind)
    if accepts is None:
        raise ContractError(f"the Avro writer does not support type {kind!r} in a union")
    return accepts


def _zigzag_bytes(value: int) -> bytearray:
    out = bytearray()
    write_long(out, value)
    return out
