"""Types of the compiled ``change_events`` extension (its source: ``change_events.pyx``)."""

from collections.abc import Callable, Iterable, Sequence
from typing import Any

EMULATOR_PENDING_COMMIT_TIMESTAMP: str

class ChangeEvents:
    def __init__(
        self, event_type: type[Any], database: str, default_schema: str, stream_name: str, read_method: str
    ) -> None: ...
    def build(
        self, record: Any, table: Any, partition_token: str | None, read_timestamp_millis: int
    ) -> list[Any]: ...

class RowEvents:
    def __init__(
        self, event_type: type[Any], database: str, default_schema: str, stream_name: str
    ) -> None: ...
    def build(
        self,
        table: Any,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
        stamps: Iterable[int],
        change_types: Iterable[str],
        uuid_of: Callable[[str, int, str, dict[str, Any]], str],
        read_method: str,
        read_timestamp_millis: int,
    ) -> list[Any]: ...
