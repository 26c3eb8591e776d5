"""Avro binary decoding compiled once per writer schema into generated Python functions.

The consumer's tasks spend most of their Python time decoding events (docs/consumer.md,
Performance). fastavro's ``schemaless_reader`` interprets the schema for every record, through a
file-like object, one call per field. Compiled once per writer schema — one straight-line
function per record, reading a ``bytes`` object by position, a nullable field one byte test, a
small long one byte — the same records cost less (``make bench`` measures both in one run).

The output is fastavro's: the same dicts, lists and values, logical types made by fastavro's own
converters (``fastavro.read.LOGICAL_READERS``: ``datetime`` for timestamps, ``date``,
``Decimal``), unknown logical types left as their primitive (``tests/unit/test_avro_reader.py``
compares both over generated events of every column type). Bytes that are not a record of the
schema raise what fastavro raises for them — ``EOFError`` when they end too early, ``ValueError``
(or ``UnicodeDecodeError``, ``OverflowError``) when they say something impossible — and
``schemas.wire.read_body`` turns those into the quarantine's ``truncated`` and ``corrupt``. Where
fastavro reads garbage leniently (a negative union index counts from the last branch, a varint
may be longer than ten bytes), this reader refuses it as corrupt; and a message cut short is
``truncated`` every time (fastavro raised IndexError for some, which read as corrupt).

Types the contract never writes (``enum``, ``fixed``) are refused when the schema is compiled.
Schemas come from ``schemas.schema_check`` (bounded depth and size, no recursion, no item that
takes zero bytes); the generated source is safe against their names (``schemas.avro_codegen``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

from fastavro.read import LOGICAL_READERS

from spanner_cdc.schemas.avro_codegen import SchemaCompiler

#: ``(message, position)`` → the value read from ``position`` on and the position after it.
Reader = Callable[[bytes, int], tuple[Any, int]]

_unpack_double = struct.Struct("<d").unpack_from
_unpack_float = struct.Struct("<f").unpack_from
_LONGEST_VARINT = 10  # bytes of a 64-bit zig-zag varint


def compile_reader(parsed_schema: Any) -> Reader:
    """The reader for a schema as ``fastavro.parse_schema`` returns it (names fully qualified)."""
    return _SourceCompiler().compile(parsed_schema)


def read_long(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint of any length up to ten bytes (the one-byte case is inlined)."""
    byte = data[pos]  # IndexError past the end: EOFError at the top (_SourceCompiler)
    number, shift, end = byte & 0x7F, 7, pos + _LONGEST_VARINT
    pos += 1
    while byte & 0x80:
        if pos == end:
            raise ValueError(f"a varint longer than {_LONGEST_VARINT} bytes")
        byte = data[pos]
        number |= (byte & 0x7F) << shift
        shift += 7
        pos += 1
    return (number >> 1) ^ -(number & 1), pos


def bad_span(data: bytes, pos: int, length: int) -> None:
    """``length`` bytes from ``pos`` are not in the message: EOFError, or ValueError below 0."""
    if length < 0:
        raise ValueError(f"a negative length ({length})")
    raise EOFError(f"expected {length} bytes, {len(data) - pos} left")


def bad_branch(index: int, branches: int) -> None:
    raise ValueError(f"union branch {index} of {branches}")


#: Generated statements reading each fixed-size primitive into ``{var}``.
_FIXED = {
    "null": ["{var} = None"],
    "boolean": ["{var} = data[pos] != 0", "pos += 1"],
    "float": ["{var}, = unpack_float(data, pos)", "pos += 4"],
    "double": ["{var}, = unpack_double(data, pos)", "pos += 8"],
}


class _SourceCompiler(SchemaCompiler):
    """Generates the Python source of one function per record, array and map of a schema.

    Arrays and maps get functions of their own so that a deeply nested schema never nests more
    blocks in one function than Python compiles (20). Reading past the end of the message raises
    IndexError (a byte) or struct.error (a float) somewhere in the generated code; the top
    function turns both into EOFError, as fastavro's reader ends. The walk, the constants and
    the records' names are ``schemas.avro_codegen``'s.
    """

    call = "{var}, pos = {function}(data, pos)"

    def compile(self, schema: Any) -> Reader:
        reader: Reader = self.build(
            [
                "def top(data, pos):",
                "    try:",
                *self.emit(schema, "value", 2),
                "    except (IndexError, StructError):",
                "        raise EOFError('the message ends before the record does') from None",
                "    return value, pos",
            ],
            {
                "read_long": read_long,
                "bad_span": bad_span,
                "bad_branch": bad_branch,
                "unpack_double": _unpack_double,
                "unpack_float": _unpack_float,
                "StructError": struct.error,
            },
            "<compiled Avro reader>",
        )
        return reader

    def annotated(self, schema: Mapping[str, Any], var: str, depth: int) -> list[str]:
        """The primitive, then fastavro's own converter: the same values, the same errors."""
        kind, lines = schema["type"], self.primitive(schema["type"], var, depth)
        convert = LOGICAL_READERS.get(f"{kind}-{schema.get('logicalType')}")
        if convert is not None:
            lines.append(
                f"{'    ' * depth}{var} = {self.constant(convert)}({var}, {self.constant(schema)}, None)"
            )
        return lines

    def record(self, schema: Mapping[str, Any]) -> str:
        name = f"read_record{len(self.records)}"
        self.records[schema["name"]] = name
        lines, fields = [f"def {name}(data, pos):"], []
        for field in schema["fields"]:
            var = self.temporary("v")
            fields.append(f"{field['name']!r}: {var}")
            lines += self.emit(field["type"], var, 1)
        lines.append(f"    return {{{', '.join(fields)}}}, pos")
        self.functions.append(lines)
        return name

    def repeated(self, schema: Mapping[str, Any], var: str, depth: int) -> list[str]:
        """Blocks of items until a zero count, in a function of their own; a negative count is
        followed by the block's size in bytes (which a reader may skip by), as the
        specification allows."""
        name, item, count = self.temporary("read_repeated"), self.temporary("v"), self.temporary("n")
        if schema["type"] == "array":
            start, store = "found = []", [f"        found.append({item})"]
            body = self.emit(schema["items"], item, 2)
        else:
            key = self.temporary("k")
            start, store = "found = {}", [f"        found[{key}] = {item}"]
            body = self.primitive("string", key, 2) + self.emit(schema["values"], item, 2)
        self.functions.append(
            [
                f"def {name}(data, pos):",
                f"    {start}",
                *self.primitive("long", count, 1),
                f"    while {count}:",
                f"        if {count} < 0:",
                f"            {count} = -{count}",
                "            _, pos = read_long(data, pos)",
                f"        for _ in range({count}):",
                *["    " + line for line in body],
                *["    " + line for line in store],
                *self.primitive("long", count, 2),
                "    return found, pos",
            ]
        )
        return ["    " * depth + self.call.format(function=name, var=var)]

    def union(self, branches: list[Any], var: str, depth: int) -> list[str]:
        pad, index = "    " * depth, self.temporary("u")
        if len(branches) == 2 and branches[0] == "null":  # the nullable field: one byte, 0 or 2
            return [
                f"{pad}{index} = data[pos]",
                f"{pad}pos += 1",
                f"{pad}if {index} == 0:",
                f"{pad}    {var} = None",
                f"{pad}elif {index} == 2:",
                *self.emit(branches[1], var, depth + 1),
                f"{pad}else:",
                f"{pad}    bad_branch(({index} >> 1) ^ -({index} & 1), 2)",
            ]
        lines = [f"{pad}{index}, pos = read_long(data, pos)"]
        for number, branch in enumerate(branches):
            lines.append(f"{pad}{'if' if number == 0 else 'elif'} {index} == {number}:")
            lines += self.emit(branch, var, depth + 1)
        return [*lines, f"{pad}else:", f"{pad}    bad_branch({index}, {len(branches)})"]

    def primitive(self, kind: str, var: str, depth: int) -> list[str]:
        pad = "    " * depth
        if kind in ("int", "long"):
            byte = self.temporary("b")
            return [
                f"{pad}{byte} = data[pos]",
                f"{pad}if {byte} < 128:",
                f"{pad}    {var} = ({byte} >> 1) ^ -({byte} & 1)",
                f"{pad}    pos += 1",
                f"{pad}else:",
                f"{pad}    {var}, pos = read_long(data, pos)",
            ]
        if kind in ("string", "bytes"):
            length, end = self.temporary("n"), self.temporary("e")
            text = ".decode()" if kind == "string" else ""
            return [
                *self.primitive("long", length, depth),
                f"{pad}{end} = pos + {length}",
                f"{pad}if {length} < 0 or {end} > len(data):",
                f"{pad}    bad_span(data, pos, {length})",
                f"{pad}{var} = data[pos:{end}]{text}",
                f"{pad}pos = {end}",
            ]
        return [pad + line.format(var=var) for line in _FIXED[kind]]
