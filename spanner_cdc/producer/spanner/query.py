"""Change-stream query text and parameters, per dialect.

The stream name is spliced into SQL (a table-valued function name cannot be a parameter), so it
is accepted only when it is a plain identifier (``change_stream_rules``); everything else is
bound as a parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.cloud.spanner_v1 import param_types

from spanner_cdc.producer.change_stream_rules import (
    MAX_HEARTBEAT_MS,
    MIN_HEARTBEAT_MS,
    POSTGRESQL,
    validate_stream_name,
)
from spanner_cdc.schemas.timestamps import datetime_from_micros


@dataclass(frozen=True)
class ChangeStreamQuery:
    """Builds the statement for one partition token (None for the initial query)."""

    stream: str
    dialect: str
    heartbeat_ms: int
    end_timestamp_micros: int | None

    def __post_init__(self) -> None:
        validate_stream_name(self.stream)
        if not MIN_HEARTBEAT_MS <= self.heartbeat_ms <= MAX_HEARTBEAT_MS:
            raise ValueError(
                f"heartbeat must be {MIN_HEARTBEAT_MS}-{MAX_HEARTBEAT_MS} ms, got {self.heartbeat_ms}"
            )

    @property
    def sql(self) -> str:
        if self.dialect == POSTGRESQL:
            return f'SELECT * FROM "spanner"."read_json_{self.stream}"($1, $2, $3, $4, null)'
        return (
            f"SELECT ChangeRecord FROM READ_{self.stream}(start_timestamp => @start, end_timestamp => @end, "
            "partition_token => @token, heartbeat_milliseconds => @heartbeat)"
        )

    def params(self, token: str | None, start_micros: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(params, param_types) for the client's ``execute_sql``."""
        end = (
            datetime_from_micros(self.end_timestamp_micros) if self.end_timestamp_micros is not None else None
        )
        values: list[Any] = [datetime_from_micros(start_micros), end, token, self.heartbeat_ms]
        types = [param_types.TIMESTAMP, param_types.TIMESTAMP, param_types.STRING, param_types.INT64]
        names = (
            ["p1", "p2", "p3", "p4"] if self.dialect == POSTGRESQL else ["start", "end", "token", "heartbeat"]
        )
        return dict(zip(names, values, strict=True)), dict(zip(names, types, strict=True))
