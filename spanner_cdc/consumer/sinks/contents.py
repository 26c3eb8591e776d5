"""What one micro-batch hands every sink, and the interface they share."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from spanner_cdc.consumer.change_rows import TableChanges
from spanner_cdc.consumer.decoded import DecodedEvent, Quarantined, WatermarkSeen


@dataclass(frozen=True)
class BatchContents:
    #: Events delivered for the first time (duplicates dropped), in Kafka order.
    fresh: list[DecodedEvent]
    quarantined: list[Quarantined]
    watermarks: list[WatermarkSeen]
    #: ``fresh`` by table, tables in name order.
    tables: list[TableChanges] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", by_table(self.fresh))


class Sink(Protocol):
    def write(self, batch_id: int, contents: BatchContents) -> None: ...


def by_table(events: Sequence[DecodedEvent]) -> list[TableChanges]:
    grouped: dict[str, list[DecodedEvent]] = defaultdict(list)
    for event in events:
        grouped[event.record["object"]].append(event)
    return [TableChanges(table, grouped[table]) for table in sorted(grouped)]
