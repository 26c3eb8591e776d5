"""Generated Python source for a schema, one function per record: the compiled Avro writer's
(``schemas.avro_writer``) walk, constants and names.

The writer turns a schema, as ``fastavro.parse_schema`` returns it, into Python source and
executes it once (the reader did too, until its steps moved to C: ``schemas.avro_reader``).
Names from the schema appear in that source only as ``repr`` literals, and values only as
constants passed in (``C[i]``), so a schema cannot inject code. Named records are looked up when
called, so a reference may precede the end of its definition.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from spanner_cdc.schemas.errors import ContractError

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


class SchemaCompiler(ABC):
    """The walk over a schema; subclasses say what each kind of type becomes."""

    #: How generated code calls a named record's function, ``{function}`` and ``{var}`` filled in.
    call: str

    def __init__(self) -> None:
        self.functions: list[list[str]] = []
        self.records: dict[str, str] = {}
        self.constants: list[Any] = []
        self.temporaries = 0

    def build(self, entry: list[str], helpers: Mapping[str, Any], filename: str) -> Any:
        """Execute every generated function plus ``entry`` (the top one, named ``top``)."""
        self.functions.append(entry)
        source = "\n\n".join("\n".join(lines) for lines in self.functions)
        namespace: dict[str, Any] = {"C": tuple(self.constants), **helpers}
        exec(compile(source, filename, "exec"), namespace)
        return namespace["top"]

    def temporary(self, stem: str) -> str:
        self.temporaries += 1
        return f"{stem}{self.temporaries}"

    def constant(self, value: Any) -> str:
        self.constants.append(value)
        return f"C[{len(self.constants) - 1}]"

    def emit(self, schema: Any, var: str, depth: int) -> list[str]:
        """Lines (indented ``depth`` levels) that handle one value of ``schema`` in ``var``."""
        pad = "    " * depth
        if isinstance(schema, list):
            if any(isinstance(branch, list) for branch in schema):
                raise ContractError("a union directly inside a union")
            return self.union(schema, var, depth)
        if isinstance(schema, str):
            if schema in PRIMITIVES:
                return self.primitive(schema, var, depth)
            if schema not in self.records:
                raise ContractError(f"the schema references {schema!r} before defining it")
            return [pad + self.call.format(function=self.records[schema], var=var)]
        kind = schema["type"]
        if kind == "record":
            return [pad + self.call.format(function=self.record(schema), var=var)]
        if kind in ("array", "map"):
            return self.repeated(schema, var, depth)
        if isinstance(kind, str) and kind in PRIMITIVES:  # a primitive, perhaps with a logicalType
            return self.annotated(schema, var, depth)
        raise ContractError(f"the compiled Avro code does not support type {kind!r}")

    @abstractmethod
    def record(self, schema: Mapping[str, Any]) -> str:
        """Generate the function of a record (registered in :attr:`records`); its name."""

    @abstractmethod
    def repeated(self, schema: Mapping[str, Any], var: str, depth: int) -> list[str]:
        """An array or a map."""

    @abstractmethod
    def union(self, branches: list[Any], var: str, depth: int) -> list[str]: ...

    @abstractmethod
    def primitive(self, kind: str, var: str, depth: int) -> list[str]: ...

    def annotated(self, schema: Mapping[str, Any], var: str, depth: int) -> list[str]:
        """A primitive with a ``logicalType``: by default, as the primitive."""
        return self.primitive(schema["type"], var, depth)
