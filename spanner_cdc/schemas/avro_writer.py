"""Avro binary encoding compiled once per writer schema into generated Python functions.

fastavro's ``schemaless_writer`` interprets the schema for every record it writes, resolving each
union by trying its branches; for the event envelope (about thirty fields, most in unions) that
took longer than building the event. Compiling the schema once — first into a tree of small
writer functions, now into one straight-line function per record, with the large longs every
event repeats (its times) encoded once — cuts the cost per event to under half (the bench's
producer part has fastavro beside it).

Values must already be in Avro's primitive forms — what ``schemas.spanner_types``' converters
and the event builder produce: ints for timestamps and dates, bytes for decimals, text for JSON —
so a logical type is written as its underlying type. For such values the output is
byte-identical to fastavro's (``tests/unit/schemas/test_avro_writer.py`` compares them over generated
events of every column type). Types the project's schemas never use (enum, fixed) are refused
when the schema is compiled, not guessed at.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

from spanner_cdc.schemas.avro_codegen import PRIMITIVES, SchemaCompiler
from spanner_cdc.schemas.errors import ContractError

#: Appends one value's encoding to the buffer.
Writer = Callable[[bytearray, Any], None]

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_pack_double = struct.Struct("<d").pack
_pack_float = struct.Struct("<f").pack


def compile_writer(parsed_schema: Any) -> Writer:
    """The writer for a schema as ``fastavro.parse_schema`` returns it (names fully qualified)."""
    return _SourceCompiler().compile(parsed_schema)


#: Encodings of large longs seen lately. The same few recur in every event — the read time, the
#: commit time (twice, in micros) and its milliseconds — and each takes a nine-step loop in
#: Python; looking one up is a twentieth of that. Emptied when full, so it stays small. Shared
#: by every writer of the process: a get or set of a dict is atomic, and an entry lost to a
#: concurrent emptying only costs its recomputation.
_RECENT_LONGS: dict[int, bytes] = {}
_RECENT_LONGS_KEPT = 4096


def write_long(out: bytearray, value: int) -> None:
    """Zig-zag variable-length encoding (Avro ``long``)."""
    if 0 <= value < 64:  # one byte: lengths, counts, indexes, small numbers
        out.append(value << 1)
        return
    encoded = _RECENT_LONGS.get(value) if type(value) is int else None
    if encoded is None:
        encoded = _zigzag_bytes(value)
        if len(_RECENT_LONGS) >= _RECENT_LONGS_KEPT:
            _RECENT_LONGS.clear()
        _RECENT_LONGS[value] = encoded
    out += encoded


def _zigzag_bytes(value: int) -> bytes:
    if not _LONG_MIN <= value <= _LONG_MAX:
        raise ValueError(f"{value} is out of the range of an Avro long")
    number = (value << 1) ^ (value >> 63)
    out = bytearray()
    while number > 0x7F:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def write_int(out: bytearray, value: int) -> None:
    if not _INT_MIN <= value <= _INT_MAX:
        raise ValueError(f"{value} is out of the range of an Avro int")
    write_long(out, value)


def write_null(_out: bytearray, value: None) -> None:
    if value is not None:
        raise ValueError(f"{value!r} is not null")


#: The one statement that writes each primitive the generated code does not spell out, ``{}``
#: standing for the value (long, bytes and string are written in place: ``_primitive``).
_PRIMITIVE_STATEMENTS = {
    "null": "write_null(out, {})",
    "boolean": "out.append(1 if {} else 0)",
    "int": "write_int(out, {})",
    "float": "out += pack_float({})",
    "double": "out += pack_double({})",
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


class _SourceCompiler(SchemaCompiler):
    """Generates the Python source of one function per record of a schema and executes it.

    Straight-line code per record — each field's value looked up once, a nullable field one
    ``is None`` test, strings and small longs encoded in place — costs a fraction of calling one
    small function per field (docs/producer.md, Performance). The walk, the constants and the
    records' names are ``schemas.avro_codegen``'s.
    """

    call = "{function}(out, {var})"

    def compile(self, schema: Any) -> Writer:
        writer: Writer = self.build(
            ["def top(out, value):", *self.emit(schema, "value", 1)],
            {
                "write_long": write_long,
                "write_int": write_int,
                "write_null": write_null,
                "pack_double": _pack_double,
                "pack_float": _pack_float,
                "no_branch": _no_branch,
            },
            "<compiled Avro writer>",
        )
        return writer

    def record(self, schema: Mapping[str, Any]) -> str:
        name = f"write_record{len(self.records)}"
        self.records[schema["name"]] = name
        lines = [f"def {name}(out, value):"]
        for field in schema["fields"]:
            var = self.temporary("v")
            if "default" in field:
                lines.append(f"    {var} = value.get({field['name']!r}, {self.constant(field['default'])})")
            else:
                lines.append(f"    {var} = value[{field['name']!r}]")
            lines += self.emit(field["type"], var, 1)
        if len(lines) == 1:
            lines.append("    return")
        self.functions.append(lines)
        return name

    def repeated(self, schema: Mapping[str, Any], var: str, depth: int) -> list[str]:
        pad, item = "    " * depth, self.temporary("v")
        if schema["type"] == "array":
            loop, body = f"for {item} in {var}:", self.emit(schema["items"], item, depth + 2)
        else:
            key = self.temporary("k")
            loop = f"for {key}, {item} in {var}.items():"
            body = self.primitive("string", key, depth + 2) + self.emit(schema["values"], item, depth + 2)
        return [
            f"{pad}if {var}:",
            f"{pad}    write_long(out, len({var}))",
            f"{pad}    {loop}",
            *body,
            f"{pad}out.append(0)",
        ]

    def union(self, branches: list[Any], var: str, depth: int) -> list[str]:
        pad = "    " * depth
        if len(branches) == 2 and branches[0] == "null":  # the nullable field: one test, no search
            return [
                f"{pad}if {var} is None:",
                f"{pad}    out.append(0)",
                f"{pad}else:",
                f"{pad}    out.append(2)",
                *self.emit(branches[1], var, depth + 1),
            ]
        lines = []
        for index, branch in enumerate(branches):
            accepts, tag = self.constant(_accepts(self._kind(branch))), self.constant(_zigzag_bytes(index))
            lines += [f"{pad}{'if' if index == 0 else 'elif'} {accepts}({var}):", f"{pad}    out += {tag}"]
            lines += self.emit(branch, var, depth + 1)
        return [*lines, f"{pad}else:", f"{pad}    no_branch({var})"]

    @staticmethod
    def _kind(branch: Any) -> str:
        """A union branch's type: a name (no nested union reaches here: ``SchemaCompiler.emit``)."""
        if isinstance(branch, str):
            return branch if branch in PRIMITIVES else "record"
        return str(branch["type"])

    def primitive(self, kind: str, var: str, depth: int) -> list[str]:
        pad = "    " * depth
        if kind == "long":
            return [
                f"{pad}if 0 <= {var} < 64:",
                f"{pad}    out.append({var} << 1)",
                f"{pad}else:",
                f"{pad}    write_long(out, {var})",
            ]
        if kind in ("string", "bytes"):
            data, length = (self.temporary("b"), self.temporary("n"))
            encoded = f"{var}.encode()" if kind == "string" else var
            return [
                f"{pad}{data} = {encoded}",
                f"{pad}{length} = len({data})",
                f"{pad}if {length} < 64:",
                f"{pad}    out.append({length} << 1)",
                f"{pad}else:",
                f"{pad}    write_long(out, {length})",
                f"{pad}out += {data}",
            ]
        return [f"{pad}{_PRIMITIVE_STATEMENTS[kind].format(var)}"]


def _no_branch(value: Any) -> None:
    raise ValueError(f"{value!r} matches no branch of the union")


def _accepts(kind: str) -> Callable[[Any], bool]:
    accepts = _BRANCH_VALUES.get(kind)
    if accepts is None:
        raise ContractError(f"the Avro writer does not support type {kind!r} in a union")
    return accepts
