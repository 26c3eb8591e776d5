"""Types of the compiled ``row_values`` extension (its source: ``row_values.pyx``)."""

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

OTHER: int
STRING: int
INT64: int
TIMESTAMP: int
FLOAT: int
BOOL: int

class RowConverter:
    def __init__(
        self,
        columns: Iterable[tuple[str, str, int, Callable[[Any], Any]]],
        unknown: Callable[[str], None],
    ) -> None: ...
    def convert(self, values: Mapping[str, Any]) -> dict[str, Any]: ...
    def convert_columns(self, names: Sequence[str], values: Sequence[Any]) -> dict[str, Any]: ...
