"""Decoded events grouped by table (and, for the replica, by primary key): how the tasks hand them
to the changelog and the replica. Nothing here touches a database: the tasks import it, and a
Python worker that imported DuckDB and psycopg for it paid for them at every start."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from spanner_cdc.consumer.decode.change_rows import TableChanges
from spanner_cdc.consumer.decode.decoded import DecodedEvent
from spanner_cdc.consumer.decode.table_version import PayloadColumn, merged_or_none


def by_table(events: Sequence[DecodedEvent]) -> list[TableChanges]:
    """``events`` per table, tables in name order; a table's events split, in ``sort_keys``
    order, where a column's type changes in a way one column cannot hold (only STRING <-> BYTES
    can: ``table_version.merged``) — a table dropped and created again under its name with
    other types — so each part is one table of one set of column types."""
    grouped: dict[str, list[DecodedEvent]] = defaultdict(list)
    for event in events:
        grouped[event.table].append(event)
    return [
        part for table in sorted(grouped) for part in _by_column_types(TableChanges(table, grouped[table]))
    ]


def _by_column_types(changes: TableChanges) -> list[TableChanges]:
    every = (column for version in changes.versions for column in version.columns)
    if len(changes.versions) == 1 or merged_or_none(changes.table, every) is not None:
        return [changes]
    runs: list[list[DecodedEvent]] = []
    columns: tuple[PayloadColumn, ...] = ()
    version = None
    for event in changes.events:
        if event.version is not version:  # the types change only where the version does
            version = event.version
            joined = merged_or_none(changes.table, (*columns, *version.columns)) if runs else None
            if joined is None:
                runs.append([])
                joined = version.columns
            columns = joined
        runs[-1].append(event)
    return [TableChanges(changes.table, run) for run in runs]


def by_primary_key(changes: TableChanges) -> list[TableChanges]:
    """``changes`` split where the primary key differs (events of two generations in one batch),
    each part in ``sort_keys`` order, parts in the order of their first event."""
    parts: dict[tuple[str, ...], list[DecodedEvent]] = {}
    for event in changes.events:
        parts.setdefault(event.version.key, []).append(event)
    if len(parts) == 1:
        return [changes]
    split = [TableChanges(changes.table, events) for events in parts.values()]
    return sorted(split, key=lambda part: part.events[0].sort_key)
