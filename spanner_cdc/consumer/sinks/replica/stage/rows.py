"""The replica's stage rows, built where the events were decoded: in the executors' tasks.

A task that decoded a share of a micro-batch builds, per table and primary key
(contents.by_primary_key), the rows the merge loads into its stage table
(change_rows.TableChanges.replica_stage) with each event's Kafka coordinates, and writes them
to the batch's replica staging directory as Arrow IPC files (:class:`ReplicaStaging`). The driver
maps the files into memory (on an object store: reads them) and hands their rows to the
database (DuckDB reads Arrow in place; a PostgreSQL replica's larger parts the task loaded
itself, stage/loaded.py, and a row names where: :data:`STAGED_IN`): the kept events are not
decoded a second time on the driver, nor held there as Python objects. The task also stages
its events' Kafka messages, which the consistent cut holds (in ``cdc$pending``) for the events
past the cut; when the cut passes them they are staged again from their bytes
(:class:`StagedEvents`) — by tasks, as the batch's own, unless they are a few (consumer.batch).

A task stages every event it read, duplicates too: the driver decides what is kept after the
tasks ran, and takes the kept rows by their commit times or coordinates (:func:`parts_of_events`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from spanner_cdc.consumer.decode.change_rows import SET_PREFIX, SORT_COLUMNS, TableChanges
from spanner_cdc.consumer.decode.decoded import DecodedBatch, DecodedEvent
from spanner_cdc.consumer.decode.outline_rows import outline_batch, row_numbers
from spanner_cdc.consumer.decode.table_version import ColumnType, PayloadColumn, merged, merged_or_none
from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.sinks.changelog import COORDINATES
from spanner_cdc.consumer.sinks.contents import by_primary_key, by_table

#: A staged event's Kafka message, as the consistent cut holds it (sinks.replica.cut).
MESSAGES_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("commit_micros", pa.int64()),
    ]
)
#: The schema metadata key of a staged file's table, key and columns.
_HEADER = b"spanner_cdc.staged_part"
#: Where a stage row was also loaded by its task (stage/loaded.py): the PostgreSQL table, and
#: its number there; null when only the file holds it. A row keeps them through every filter,
#: take and concatenation, so the merge takes exactly the rows it was handed from that table.
STAGED_IN = "cdc$staged_in"
STAGED_ROW = "cdc$staged_row"
_LOCATION = (STAGED_IN, STAGED_ROW)


@dataclass(frozen=True)
class StagedPart:
    """One table's stage rows of one primary key (a table created again with another key is
    another part), with their Kafka coordinates."""

    table: str
    key: tuple[str, ...]
    columns: tuple[PayloadColumn, ...]
    rows: pa.Table

    @classmethod
    def of(cls, changes: TableChanges) -> StagedPart:
        events = changes.events
        rows = changes.replica_stage()
        rows = rows.append_column(COORDINATES[0], pa.array([e.topic for e in events], pa.string()))
        rows = rows.append_column(COORDINATES[1], pa.array([e.partition for e in events], pa.int32()))
        rows = rows.append_column(COORDINATES[2], pa.array([e.offset for e in events], pa.int64()))
        return cls(changes.table, changes.key, changes.columns, _located(rows, None))

    @property
    def commits(self) -> pa.ChunkedArray:
        return self.rows.column(SORT_COLUMNS[0])

    @property
    def first_commit(self) -> int:
        return int(pc.min(self.commits).as_py())

    def stage_rows(self) -> pa.Table:
        """The rows as the stage table takes them: without their coordinates and location."""
        return self.rows.drop_columns([*COORDINATES, *_LOCATION])

    def loaded_into(self, table: str) -> StagedPart:
        """The part, its rows numbered as loaded into ``table`` (in their order)."""
        return self.with_rows(_located(self.rows.drop_columns(list(_LOCATION)), table))

    def unloaded(self) -> StagedPart:
        """The part as only its file holds it (the tables a batch's tasks loaded go with the batch)."""
        return self.with_rows(_located(self.rows.drop_columns(list(_LOCATION)), None))

    def loaded(self) -> list[tuple[str, pa.Array]]:
        """Each table rows of the part were loaded into, and their numbers there."""
        tables = self.rows.column(STAGED_IN)
        found = []
        for table in pc.unique(tables).drop_null().to_pylist():
            own = self.rows.filter(pc.equal(tables, table))
            found.append((table, own.column(STAGED_ROW).combine_chunks()))
        return found

    def as_bytes(self, names: Collection[str]) -> StagedPart:
        """The part with its STRING columns ``names`` (and their arrays) as BYTES, each text its
        UTF-8."""
        columns = tuple(replace(c, type=c.type.as_bytes()) if c.name in names else c for c in self.columns)
        rows = self.rows
        for column in columns:
            if column.name in names:
                at = rows.schema.get_field_index(column.name)
                rows = rows.set_column(at, column.name, rows.column(at).cast(column.type.arrow))
        return replace(self, columns=columns, rows=rows)

    def committed_from(self, micros: int) -> StagedPart:
        """The rows committed at or after ``micros``."""
        return self.with_rows(self.rows.filter(pc.greater_equal(self.commits, micros)))

    def with_rows(self, rows: pa.Table) -> StagedPart:
        return StagedPart(self.table, self.key, self.columns, rows)


@dataclass(frozen=True)
class StagedEvents:
    """Messages read again and staged for the replica: one outline row per message
    (consumer.decode.outline_rows; a held message should be an event again) and the events' stage rows."""

    outline: pa.Table
    parts: list[StagedPart]

    @classmethod
    def of(cls, decoded: DecodedBatch) -> StagedEvents:
        """Messages read on the driver."""
        return cls(pa.Table.from_batches([outline_batch(decoded)]), staged_parts(decoded.events))


def taken(rows: pa.Table, coordinates: Sequence[str], messages: pa.Table) -> pa.Table:
    """The ``rows`` (their Kafka coordinates in the columns ``coordinates``) of the messages
    ``messages`` names (columns ``topic``, ``partition``, ``offset``), in their order."""
    return rows.take(row_numbers(rows, coordinates, messages, named=True))


def rows_of_events(
    tables: Sequence[pa.Table], commits: str, coordinates: Sequence[str], events: pa.Table
) -> list[pa.Table]:
    """Each of ``tables``' rows of ``events`` (outline rows, each with its one row in one of the
    tables; a row's commit time in the column ``commits``, its Kafka coordinates in
    ``coordinates``), in the tables' order.

    A row carries its event's commit time, so the rows committed within ``events``' commit times
    include every one of theirs; when they are no more than ``events``, they are exactly theirs.
    That is a filter on one column, where taking them by coordinates is a join over every row;
    when other rows fall in that range — a duplicate, or an
    event held back — the coordinates decide."""
    if sum(t.num_rows for t in tables) == events.num_rows:
        return list(tables)
    if events.num_rows:
        low, high = pc.min_max(events.column("commit_micros")).values()
        within = [
            t.filter(
                pc.and_(pc.greater_equal(t.column(commits), low), pc.less_equal(t.column(commits), high))
            )
            for t in tables
        ]
        if sum(t.num_rows for t in within) == events.num_rows:
            return within
    return [taken(t, coordinates, events) for t in tables]


def parts_of_events(parts: Sequence[StagedPart], events: pa.Table) -> list[StagedPart]:
    """The rows of ``events`` (outline rows, every one staged in one of ``parts``), per part."""
    rows = rows_of_events([p.rows for p in parts], SORT_COLUMNS[0], COORDINATES, events)
    return [part.with_rows(own) for part, own in zip(parts, rows, strict=True)]


def staged_parts(events: Sequence[DecodedEvent]) -> list[StagedPart]:
    """The stage rows of decoded ``events``, per table and primary key."""
    return parts_of_tables(by_table(events))


def parts_of_tables(tables: Sequence[TableChanges]) -> list[StagedPart]:
    """The stage rows of each table's changes (a table's key generations apart)."""
    return [StagedPart.of(part) for changes in tables for part in by_primary_key(changes)]


def combined(parts: Sequence[StagedPart]) -> list[StagedPart]:
    """``parts`` of the same table and key (from several tasks, or held and fresh) as one part
    each: the columns of every part (first seen first; table_version.merged), a column a part
    lacks null and not set — or as several, where their column types cannot be one table's
    (contents.by_table). Tables in name order; a table's parts in the order of their first
    commit."""
    grouped: dict[tuple[str, tuple[str, ...]], list[list[StagedPart]]] = {}
    for part in sorted(parts, key=lambda p: p.first_commit if p.rows.num_rows else 0):
        if part.rows.num_rows:
            groups = grouped.setdefault((part.table, part.key), [])
            fits = (
                g
                for g in groups
                if merged_or_none(part.table, (c for p in (*g, part) for c in p.columns)) is not None
            )
            group = next(fits, None)
            if group is None:
                groups.append([part])
            else:
                group.append(part)
    joined = [_concatenated(group) for groups in grouped.values() for group in groups]
    return sorted(joined, key=lambda p: (p.table, p.first_commit))


def _concatenated(parts: list[StagedPart]) -> StagedPart:
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    columns = {c.name: c for c in merged(first.table, (c for part in parts for c in part.columns))}
    own = {c.name for c in first.columns}  # a Spanner name has no "$": set$ columns are ours
    names = [
        *(c.name for c in columns.values()),
        *(SET_PREFIX + c.name for c in columns.values() if c.name not in first.key),
        *(n for n in first.rows.column_names if n not in own and not n.startswith(SET_PREFIX)),
    ]
    types = {c.name: c.type.arrow for c in columns.values()}
    aligned = []
    for part in parts:
        rows = part.rows
        arrays = []
        for name in names:
            if name in rows.column_names:
                arrays.append(rows.column(name).cast(types.get(name, rows.column(name).type)))
            elif name.startswith(SET_PREFIX):
                arrays.append(pa.array([False] * rows.num_rows, pa.bool_()))
            else:
                arrays.append(pa.nulls(rows.num_rows, types[name]))
        aligned.append(pa.table(arrays, names=names))
    return StagedPart(first.table, first.key, tuple(columns.values()), pa.concat_tables(aligned))


def event_messages(events: Sequence[DecodedEvent]) -> pa.Table:
    """The Kafka messages of ``events`` (``MESSAGES_SCHEMA``): what the consistent cut holds."""
    return pa.table(
        {
            "key": [e.key for e in events],
            "value": [e.value for e in events],
            "topic": [e.topic for e in events],
            "partition": [e.partition for e in events],
            "offset": [e.offset for e in events],
            "commit_micros": [e.commit_micros for e in events],
        },
        schema=MESSAGES_SCHEMA,
    )


class ReplicaStaging:
    """One micro-batch's staged rows: a directory of Arrow IPC files, per task the stage rows of
    each table and key, and its events' Kafka messages. Files appear whole
    (``Location.write_whole``)."""

    def __init__(self, root: Location) -> None:
        self.root = root

    def write(self, task: int, parts: Sequence[StagedPart], messages: pa.Table | None) -> None:
        """Task ``task``'s stage rows and the messages they came from (``MESSAGES_SCHEMA``;
        None: not staged)."""
        for number, part in enumerate(parts):
            header = {
                "table": part.table,
                "key": list(part.key),
                "columns": [[c.name, c.field, c.type.avro] for c in part.columns],
            }
            rows = part.rows.replace_schema_metadata({_HEADER: json.dumps(header).encode()})
            (self.root / f"part-{task:05d}-{number:05d}.arrow").write_arrow(rows)
        if messages is not None:
            (self.root / f"messages-{task:05d}.arrow").write_arrow(messages)

    def write_outline(self, rows: pa.Table) -> None:
        """The outline rows (consumer.decode.outline_rows) of the staged events."""
        (self.root / "outline.arrow").write_arrow(rows)

    def outline(self) -> pa.Table:
        """The outline rows written by :meth:`write_outline`, memory-mapped."""
        return (self.root / "outline.arrow").read_arrow()

    def messages(self) -> pa.Table:
        """Every task's messages, memory-mapped."""
        tables = [path.read_arrow() for path in self.root.files("messages-*.arrow")]
        return pa.concat_tables(tables) if tables else MESSAGES_SCHEMA.empty_table()

    def read(self) -> list[StagedPart]:
        """Every staged part, memory-mapped (their rows are not copied into the driver's heap)."""
        parts = []
        for path in self.root.files("part-*.arrow"):
            rows = path.read_arrow()
            header = json.loads(rows.schema.metadata[_HEADER])
            columns = tuple(PayloadColumn(n, f, ColumnType(avro)) for n, f, avro in header["columns"])
            parts.append(
                StagedPart(header["table"], tuple(header["key"]), columns, rows.replace_schema_metadata(None))
            )
        return parts

    def clear(self) -> None:
        self.root.delete_tree()


def _located(rows: pa.Table, table: str | None) -> pa.Table:
    """``rows`` with their location: loaded into ``table`` in their order, or only in a file (None)."""
    count = rows.num_rows
    if table is None:
        tables, numbers = pa.nulls(count, pa.string()), pa.nulls(count, pa.int64())
    else:
        tables, numbers = pa.array([table] * count, pa.string()), pa.array(range(count), pa.int64())
    return rows.append_column(STAGED_IN, tables).append_column(STAGED_ROW, numbers)
