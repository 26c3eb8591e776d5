"""Where each table's backfill stands: one compacted record per table on
``_spanner-cdc.{prefix}.backfills``, key ``table/{table}`` (``producer.publish.control_records``).

The record holds the snapshot timestamp, the columns read, the key of the last row whose event
Kafka acknowledged (every row before it, in key order, is acknowledged too) and whether the
table finished. It is written before the first row is read, so a restart reads the same
snapshot from that key on instead of starting over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spanner_cdc.producer.publish.control_records import ControlRecords
from spanner_cdc.producer.publish.kafka import KafkaClient


@dataclass
class TablePlan:
    """One table's backfill: which snapshot, which columns, how far, whether done."""

    table: str
    snapshot_micros: int
    columns: list[str]
    #: The key (JSON-form values, key order) of the last acknowledged row; None: none yet.
    after_key: list[Any] | None = None
    finished: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TablePlan:
        after_key = data["after_key"]
        if after_key is not None and not isinstance(after_key, list):
            raise ValueError("after_key is not a list")
        return cls(
            table=str(data["table"]),
            snapshot_micros=int(data["snapshot_micros"]),
            columns=[str(name) for name in data["columns"]],
            after_key=after_key,
            finished=bool(data["finished"]),
        )


def backfill_store(kafka: KafkaClient) -> ControlRecords[TablePlan]:
    return ControlRecords(
        kafka,
        kafka.topics.backfills,
        "table",
        TablePlan.from_json,
        "the producer will not guess which rows were published: restore the topic, or backfill "
        "afresh with a new --topic-prefix",
    )
