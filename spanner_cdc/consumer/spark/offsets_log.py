"""Spark's offsets log: what the streaming query planned each batch to read.

A batch's planned range of each Kafka partition starts where the previous batch ended
(``offsets/<batch - 1>``) and ends at ``offsets/<batch>``; each file's third line is the Kafka
source's offsets. Spark writes a batch's file before it runs the batch. The ranges count
offsets, not records: a transaction marker among them counts too.
"""

from __future__ import annotations

import json
from typing import Any

from spanner_cdc.consumer.locations import Location

Place = tuple[str, int]


def planned_offsets(spark_checkpoint: Location, batch_id: int) -> dict[Place, int] | None:
    """(topic, partition) → the offset Spark planned batch ``batch_id`` to read up to; None
    when its offsets log has no such batch."""
    path = spark_checkpoint / "offsets" / str(batch_id)
    if batch_id < 0 or not path.is_file():
        return None
    lines = path.read_text().splitlines()
    if len(lines) < 3:
        return None
    offsets: Any = json.loads(lines[2])
    return {(topic, int(p)): int(o) for topic, parts in offsets.items() for p, o in parts.items()}


class OffsetsLog:
    """One query's offsets log as its batches come: each file read once, a batch's end offsets
    being the next batch's start (and what the data-loss count asks of the same batch)."""

    def __init__(self, spark_checkpoint: Location) -> None:
        self.spark_checkpoint = spark_checkpoint
        #: The offsets of the last batch asked for and of the one before it.
        self._read: dict[int, dict[Place, int] | None] = {}

    def planned(self, batch_id: int) -> tuple[dict[Place, int], dict[Place, int]] | None:
        """The offsets batch ``batch_id`` planned to start and to end at, per partition; None
        when that is not known (the first batch, or one whose previous batch Spark no longer
        keeps)."""
        start, end = self._offsets(batch_id - 1), self._offsets(batch_id)
        self._read = {batch_id - 1: start, batch_id: end}
        return None if start is None or end is None else (start, end)

    def planned_span(self, batch_id: int) -> int | None:
        """How many offsets batch ``batch_id`` planned to read, over every partition (None: not
        known). A partition the previous batch did not have counts from offset 0: never fewer
        than planned."""
        planned = self.planned(batch_id)
        if planned is None:
            return None
        start, end = planned
        return sum(max(offset - start.get(place, 0), 0) for place, offset in end.items())

    def _offsets(self, batch_id: int) -> dict[Place, int] | None:
        if batch_id in self._read:
            return self._read[batch_id]
        return planned_offsets(self.spark_checkpoint, batch_id)
