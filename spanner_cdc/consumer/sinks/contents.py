"""Decoded events grouped by table: how the tasks hand them to the changelog and the replica."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from spanner_cdc.consumer.change_rows import TableChanges
from spanner_cdc.consumer.decoded import DecodedEvent


def by_table(events: Sequence[DecodedEvent]) -> list[TableChanges]:
    """``events`` per table, tables in name order."""
    grouped: dict[str, list[DecodedEvent]] = defaultdict(list)
    for event in events:
        grouped[event.record["object"]].append(event)
    return [TableChanges(table, grouped[table]) for table in sorted(grouped)]
