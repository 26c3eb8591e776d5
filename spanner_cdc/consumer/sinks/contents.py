"""Decoded events grouped by table (and, for the replica, by primary key): how the tasks hand them
to the changelog and the replica. Nothing here touches a database: the tasks import it, and a
Python worker that imported DuckDB and psycopg for it paid about 0.3 s more at every start."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from spanner_cdc.consumer.change_rows import TableChanges
from spanner_cdc.consumer.decoded import DecodedEvent


def by_table(events: Sequence[DecodedEvent]) -> list[TableChanges]:
    """``events`` per table, tables in name order."""
    grouped: dict[str, list[DecodedEvent]] = defaultdict(list)
    for event in events:
        grouped[event.table].append(event)
    return [TableChanges(table, grouped[table]) for table in sorted(grouped)]


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
