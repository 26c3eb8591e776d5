"""Types of the compiled ``avro_steps`` extension (its source: ``avro_steps.pyx``)."""

import enum
from collections.abc import Callable
from typing import Any

import pyarrow as pa

#: The field of a union read as a struct that holds the branch each value took (``ColumnsReader``).
UNION_BRANCH: str

class Kind(enum.IntEnum):
    NULL_VALUE = 0
    BOOLEAN = 1
    LONG = 2
    FLOAT = 3
    DOUBLE = 4
    STRING = 5
    BYTES = 6
    RECORD = 7
    NULLABLE = 8
    UNION = 9
    ARRAY = 10
    MAP = 11
    UTC_MICROS = 12
    UTC_MILLIS = 13
    DAYS = 14

class Step:
    def __init__(
        self,
        kind: Kind,
        convert: Callable[[Any, Any, Any], Any] | None = None,
        schema: Any = None,
        child: Step | None = None,
        branches: tuple[Step, ...] = (),
        as_number: bool = False,
        int32: bool = False,
    ) -> None: ...
    def set_fields(
        self, names: tuple[str, ...], steps: tuple[Step, ...], defaults: dict[str, Any] | None = None
    ) -> None: ...

class CompiledReader:
    def __init__(self, top: Step) -> None: ...
    def __call__(self, data: bytes, pos: int) -> tuple[Any, int]: ...

class CompiledWriter:
    def __init__(self, top: Step) -> None: ...
    def __call__(self, header: bytes, value: Any) -> bytes: ...

class ColumnsReader:
    def __init__(self, reader: CompiledReader, arrow_type: pa.StructType) -> None: ...
    def __call__(self, messages: list[bytes], starts: list[int]) -> pa.StructArray: ...
