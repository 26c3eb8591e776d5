"""Data change records → Datastream-shaped events, one per mod (docs/design.md §3); and rows
read from a table (a backfill's, a poll's) → events, one per row.

The record form accepted here is the change record as JSON (the PostgreSQL dialect's native
form and Spanner's documented examples); the GoogleSQL reader turns its STRUCT rows into the same mapping,
so both dialects share one event builder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

from spanner_cdc.schemas.change_events import ChangeEvents, RowEvents
from spanner_cdc.schemas.identity import SortKeys, backfill_uuid, polled_uuid
from spanner_cdc.schemas.records import DataChangeRecord
from spanner_cdc.schemas.table import TableSchema, TableVersions

READ_METHOD_CHANGE_STREAMS = "spanner-cdc-change-streams"
READ_METHOD_BACKFILL = "spanner-backfill"
#: Rows found by ``spanner-cdc poll`` (a commit-timestamp column compared with the last poll).
READ_METHOD_POLL = "spanner-commit-timestamp-poll"


#: The envelope's fields (``avsc/envelope.avsc``) in its order: an event's :attr:`Event.fields`.
ENVELOPE_FIELDS = (
    "uuid",
    "read_timestamp",
    "source_timestamp",
    "object",
    "read_method",
    "stream_name",
    "schema_key",
    "sort_keys",
    "source_metadata",
    "payload",
)
#: ``source_metadata``'s fields in the envelope's order.
METADATA_FIELDS = (
    "database",
    "schema",
    "table",
    "change_type",
    "is_deleted",
    "primary_keys",
    "tx_id",
    "commit_timestamp",
    "record_sequence",
    "mod_index",
    "partition_token",
    "value_capture_type",
    "number_of_records_in_transaction",
    "number_of_partitions_in_transaction",
    "is_last_record_in_transaction_in_partition",
    "transaction_tag",
    "is_system_transaction",
    "number_of_mods_in_record",
    "changed_columns",
    "old_values",
)
_UUID, _READ_METHOD, _SORT_KEYS, _METADATA = (
    ENVELOPE_FIELDS.index(name) for name in ("uuid", "read_method", "sort_keys", "source_metadata")
)
_CHANGE_TYPE, _COMMIT = (METADATA_FIELDS.index(name) for name in ("change_type", "commit_timestamp"))


class Event(NamedTuple):
    """One event ready to encode: its table version, Kafka key record, and its envelope record as
    a tuple of :data:`ENVELOPE_FIELDS` (``source_metadata`` a tuple of :data:`METADATA_FIELDS`;
    the rows are dicts by field name).

    The tuple is what the compiled writer writes (``avro_steps``: a record as its fields in
    order): a dict of thirty names per event, looked up by name again while writing, cost the
    producer more than writing the bytes. :attr:`value` is the same record by name, for readers
    and the JSON form."""

    table: TableSchema
    key: dict[str, Any]
    fields: tuple[Any, ...]

    @property
    def value(self) -> dict[str, Any]:
        """The envelope record by field name (a new dict per call)."""
        value = dict(zip(ENVELOPE_FIELDS, self.fields, strict=True))
        value["source_metadata"] = dict(zip(METADATA_FIELDS, self.fields[_METADATA], strict=True))
        return value

    @property
    def uuid(self) -> str:
        uuid: str = self.fields[_UUID]
        return uuid

    @property
    def read_method(self) -> str:
        method: str = self.fields[_READ_METHOD]
        return method

    @property
    def sort_keys(self) -> SortKeys:
        keys: SortKeys = self.fields[_SORT_KEYS]
        return keys

    @property
    def change_type(self) -> str:
        change_type: str = self.fields[_METADATA][_CHANGE_TYPE]
        return change_type

    @property
    def commit_timestamp(self) -> int:
        """The change's commit timestamp in microseconds (a backfill row's: its snapshot)."""
        commit: int = self.fields[_METADATA][_COMMIT]
        return commit


@dataclass
class EventBuilder:
    """Builds events for one change stream.

    The producer hands it each record's table version from its catalog (every column listed,
    commit-timestamp columns known); without one, the record's own ``column_types`` define it.
    """

    stream_name: str
    database: str
    default_schema: str = ""
    _tables: TableVersions = field(default_factory=TableVersions, repr=False)
    _changes: ChangeEvents = field(init=False, repr=False, compare=False)
    _rows: RowEvents = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._changes = ChangeEvents(
            Event, self.database, self.default_schema, self.stream_name, READ_METHOD_CHANGE_STREAMS
        )
        self._rows = RowEvents(Event, self.database, self.default_schema, self.stream_name)

    def table_schema(self, table_name: str, column_types: Sequence[Mapping[str, Any]]) -> TableSchema:
        schema = self._tables.get(table_name, column_types)
        if schema is None:
            schema = self._tables.put(
                table_name, column_types, TableSchema.from_column_types(table_name, column_types)
            )
        return schema

    def build(
        self,
        record: DataChangeRecord,
        partition_token: str | None,
        read_timestamp_millis: int,
        table: TableSchema | None = None,
    ) -> list[Event]:
        """Every mod of ``record`` as an event, in mod order.

        ``table`` is the record's table version when the caller already resolved it (the
        producer does, from the catalog); otherwise it is looked up from ``column_types``.
        """
        table = table or self.table_schema(record.table_name, record.column_types)
        return self._changes.build(record, table, partition_token, read_timestamp_millis)

    def build_snapshot_rows(
        self,
        table: TableSchema,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        *,
        snapshot_micros: int,
        read_timestamp_millis: int,
    ) -> list[Event]:
        """Backfill rows (values in ``columns`` order, as read): each row as it was at
        ``snapshot_micros``, as an INSERT.

        Their sort keys are ``[snapshot, "", "", 0]``: before every change committed after the
        snapshot (a later commit timestamp), and before a change committed at the snapshot
        itself (same timestamp, a non-empty transaction id), which the change stream also
        delivers, so a sink that keeps the newest event per key never lets a backfill row
        overwrite a change. The transaction and partition facts they cannot know are null.
        """
        return self._rows.build(
            table,
            columns,
            rows,
            repeat(snapshot_micros, len(rows)),
            repeat("INSERT", len(rows)),
            backfill_uuid,
            READ_METHOD_BACKFILL,
            read_timestamp_millis,
        )

    def build_polled_rows(
        self,
        table: TableSchema,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        *,
        stamps_micros: Sequence[int],
        existed_before: Sequence[bool],
        read_timestamp_millis: int,
    ) -> list[Event]:
        """Row versions found by commit-timestamp polling (values in ``columns`` order, as
        read): each the whole row, stamped by its commit-timestamp column (``stamps_micros``:
        its commit time and sort keys ``[stamp, "", "", 0]``). An UPDATE when the row
        ``existed_before`` (at the previous poll), else an INSERT. The transaction and partition
        facts a poll cannot know are null."""
        return self._rows.build(
            table,
            columns,
            rows,
            stamps_micros,
            ["UPDATE" if existed else "INSERT" for existed in existed_before],
            polled_uuid,
            READ_METHOD_POLL,
            read_timestamp_millis,
        )
