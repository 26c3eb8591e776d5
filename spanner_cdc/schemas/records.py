"""The change-stream record model : data change, heartbeat and child partitions records.

Both dialects end up here: the PostgreSQL dialect returns each ChangeRecord as JSON, and the
producer turns GoogleSQL's STRUCT rows into the same JSON form (``spanner_cdc.producer.spanner.rows``),
so one parser and one set of types serve both, and the event builder sees one record type.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.json_text import parse_json
from spanner_cdc.schemas.timestamps import parse_timestamp_micros, timestamp_micros

MOD_TYPES = ("INSERT", "UPDATE", "DELETE")


class Mod(NamedTuple):
    """One row change inside a data change record."""

    keys: Mapping[str, Any]
    new_values: Mapping[str, Any]
    old_values: Mapping[str, Any]


#: A ``Mod`` made from its fields in order, without the named tuple's Python ``__new__``: a
#: reader thread makes one per mod, under the interpreter lock the event loop needs too.
_new_mod = tuple.__new__


class DataChangeRecord(NamedTuple):
    """A data change record with its timestamp already in microseconds.

    Named tuples, this and :class:`Mod`: immutable like a frozen dataclass, and made in a
    fraction of its time (a frozen dataclass sets each field through ``object.__setattr__``),
    once per record the change stream returns."""

    commit_timestamp_micros: int
    record_sequence: str
    server_transaction_id: str
    is_last_record_in_transaction_in_partition: bool
    table_name: str
    column_types: Sequence[Mapping[str, Any]]
    mods: tuple[Mod, ...]
    mod_type: str
    value_capture_type: str
    number_of_records_in_transaction: int
    number_of_partitions_in_transaction: int
    transaction_tag: str
    is_system_transaction: bool

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> DataChangeRecord:
        """Parse the JSON form of a ``data_change_record``."""
        mod_type = str(record["mod_type"])
        if mod_type not in MOD_TYPES:
            raise ContractError(f"data change record has unknown mod_type {mod_type!r}")
        commit = record["commit_timestamp"]
        return cls(
            commit_timestamp_micros=commit if isinstance(commit, int) else parse_timestamp_micros(commit),
            record_sequence=str(record["record_sequence"]),
            server_transaction_id=str(record["server_transaction_id"]),
            is_last_record_in_transaction_in_partition=bool(
                record["is_last_record_in_transaction_in_partition"]
            ),
            table_name=str(record["table_name"]),
            column_types=[_as_mapping(entry) for entry in record["column_types"]],
            mods=tuple(
                _new_mod(
                    Mod,
                    (
                        _as_mapping(mod.get("keys")),
                        _as_mapping(mod.get("new_values")),
                        _as_mapping(mod.get("old_values")),
                    ),
                )
                for mod in map(_as_mapping, record["mods"])
            ),
            mod_type=mod_type,
            value_capture_type=str(record["value_capture_type"]),
            number_of_records_in_transaction=int(record["number_of_records_in_transaction"]),
            number_of_partitions_in_transaction=int(record["number_of_partitions_in_transaction"]),
            transaction_tag=str(record.get("transaction_tag") or ""),
            is_system_transaction=bool(record.get("is_system_transaction", False)),
        )


def _as_mapping(value: Any) -> Mapping[str, Any]:
    """Change records nest JSON; clients hand it over as text, dicts or dict subclasses."""
    if isinstance(value, dict):  # the common case, told apart without the Mapping ABC's check
        return value
    if value is None:
        return {}
    if isinstance(value, str):
        value = parse_json(value) if value else {}
    if not isinstance(value, Mapping):
        raise ContractError(f"expected a JSON object in a change record, got {value!r}")
    return value


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
            else:
                # Skipping a record kind could skip changes or a partition's end; say so instead.
                raise ContractError(
                    f"change record of kind {kind!r}, which the producer does not read (streams with "
                    "partition_mode = 'MUTABLE_KEY_RANGE' send such records; use 'IMMUTABLE_KEY_RANGE')"
                )
