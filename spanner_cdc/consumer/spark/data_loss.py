"""With ``--fail-on-data-loss false`` Spark's Kafka source goes on from the earliest records
Kafka still has, and only logs what it skipped. This counts it, once per batch on the driver.

A batch's planned range of each partition is in Spark's offsets log
(consumer.spark.offsets_log). Offsets below both Kafka's earliest offset now and the first the
batch read were gone when it read them — removed by retention (or by a delete-records request).
Not counted: a topic deleted, or deleted and created again (its old offsets mean nothing in the
new one; Spark reads it from its new end), a batch whose previous offsets Spark no longer keeps,
and anything with the default ``--fail-on-data-loss true`` (Spark stops the query instead).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pyarrow as pa
from confluent_kafka import Consumer

from spanner_cdc.common.kafka_offsets import READER_SETTINGS, offset_ranges
from spanner_cdc.consumer.spark.offsets_log import OffsetsLog, Place

log = logging.getLogger("spanner_cdc.consumer")


def lost_offsets(
    start: Mapping[Place, int],
    end: Mapping[Place, int],
    earliest: Mapping[Place, int],
    first_read: Mapping[Place, int],
) -> dict[Place, int]:
    """Per partition, the planned offsets no longer in Kafka that the batch did not read."""
    lost = {}
    for place, begin in start.items():
        if place not in end or place not in earliest:
            continue
        gone_below = min(earliest[place], first_read.get(place, end[place]))
        if gone_below > begin:
            lost[place] = gone_below - begin
    return lost


def first_offsets(outline: pa.Table) -> dict[Place, int]:
    """(topic, partition) → the first offset a batch read (its outline's rows)."""
    if not outline.num_rows:
        return {}
    grouped = outline.group_by(["topic", "partition"]).aggregate([("offset", "min")])
    return {
        (str(t), int(p)): int(o)
        for t, p, o in zip(
            grouped.column("topic").to_pylist(),
            grouped.column("partition").to_pylist(),
            grouped.column("offset_min").to_pylist(),
            strict=True,
        )
    }


class DataLossCounter:
    """Counts, logs (one line per batch that lost any) and reports what a batch could not read.
    Its Kafka client is made at the first batch that has a previous one, and kept until
    :meth:`close`."""

    def __init__(self, offsets: OffsetsLog, client_config: Mapping[str, str]) -> None:
        self.offsets = offsets
        self.client_config = dict(client_config)
        self._consumer: Consumer | None = None

    def count(self, batch_id: int, outline: pa.Table) -> int:
        planned = self.offsets.planned(batch_id)
        if planned is None:
            return 0
        start, end = planned
        if not start or not end:
            return 0
        earliest = self._earliest(list(start))
        lost = lost_offsets(
            start, end, earliest, first_offsets(outline.select(["topic", "partition", "offset"]))
        )
        total = sum(lost.values())
        if total:
            places = ", ".join(f"{t}[{p}] {n}" for (t, p), n in sorted(lost.items()))
            log.warning(
                "batch %d: %d offsets were gone from Kafka before they were read (%s); "
                "going on (--fail-on-data-loss false)",
                batch_id,
                total,
                places,
            )
        return total

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _earliest(self, places: list[Place]) -> dict[Place, int]:
        """Kafka's earliest offset of each partition whose topic still exists."""
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    **READER_SETTINGS,
                    **self.client_config,
                    "group.id": "spanner-cdc-data-loss",
                    "enable.auto.commit": False,
                }
            )
        existing = self._consumer.list_topics(timeout=10).topics
        known = [place for place in places if place[0] in existing]
        return {place: low for place, (low, _) in offset_ranges(self._consumer, known).items()}
