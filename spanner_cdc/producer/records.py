"""Change-stream rows of both dialects → typed records.

GoogleSQL returns ``ChangeRecord`` as ``ARRAY<STRUCT<data_change_record ARRAY<STRUCT>, …>>``
(positional lists in the Python client); the PostgreSQL dialect returns one JSON object. Both
are turned into the JSON form here, named by the result set's own field metadata rather than by
hard-coded positions, so a field Spanner adds later cannot shift the others.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from google.cloud.spanner_v1 import TypeCode

from spanner_cdc.schemas.events import DataChangeRecord
from spanner_cdc.schemas.spanner_types import parse_timestamp_micros

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class HeartbeatRecord:
    """Everything at or before ``timestamp_micros`` in this partition has been returned."""

    timestamp_micros: int


@dataclass(frozen=True)
class ChildPartition:
    token: str
    parent_tokens: tuple[str, ...]


@dataclass(frozen=True)
class ChildPartitionsRecord:
    """Children to query from ``start_timestamp_micros`` once all their parents finished."""

    start_timestamp_micros: int
    record_sequence: str
    children: tuple[ChildPartition, ...]


ChangeStreamRecord = DataChangeRecord | HeartbeatRecord | ChildPartitionsRecord


def timestamp_micros(value: Any) -> int:
    """A TIMESTAMP as the client returns it (datetime) or as JSON text → microseconds."""
    if isinstance(value, dt.datetime):
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return parse_timestamp_micros(value)


def micros_to_datetime(micros: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=micros)


def records_from_json(change_record: Mapping[str, Any]) -> Iterator[ChangeStreamRecord]:
    """One ChangeRecord in JSON form (PostgreSQL dialect, or a converted GoogleSQL row)."""
    for kind, body in change_record.items():
        items = body if isinstance(body, list) else [body]
        for item in items:
            if not item:
                continue
            if kind == "data_change_record":
                yield DataChangeRecord.from_json(
                    {**item, "commit_timestamp": timestamp_micros(item["commit_timestamp"])}
                )
            elif kind == "heartbeat_record":
                yield HeartbeatRecord(timestamp_micros(item["timestamp"]))
            elif kind == "child_partitions_record":
                yield ChildPartitionsRecord(
                    start_timestamp_micros=timestamp_micros(item["start_timestamp"]),
                    record_sequence=str(item["record_sequence"]),
                    children=tuple(
                        ChildPartition(
                            token=str(child["token"]),
                            parent_tokens=tuple(str(p) for p in child["parent_partition_tokens"] or () if p),
                        )
                        for child in item["child_partitions"]
                    ),
                )


def struct_to_json(value: Any, spanner_type: Any) -> Any:
    """A GoogleSQL value with its ``Type`` proto → the same value with STRUCTs as dicts."""
    code = TypeCode(int(spanner_type.code)).name  # proto-plus enum or raw protobuf int alike
    if value is None:
        return None
    if code == "ARRAY":
        return [struct_to_json(item, spanner_type.array_element_type) for item in value]
    if code == "STRUCT":
        fields = spanner_type.struct_type.fields
        return {
            field.name: struct_to_json(item, field.type_) for field, item in zip(fields, value, strict=True)
        }
    return value


def records_from_googlesql_row(row: list[Any], fields: Any) -> Iterator[ChangeStreamRecord]:
    """A ``SELECT ChangeRecord FROM READ_…`` row, named by the result set's field metadata."""
    for change_record in struct_to_json(row[0], fields[0].type_):
        yield from records_from_json(change_record)
