"""Where each table's backfill stands: one compacted record per table on
``_spanner-cdc.{prefix}.backfills``, key ``table/{table}``.

The record holds the snapshot timestamp, the columns read, the key of the last row whose event
Kafka acknowledged (every row before it, in key order, is acknowledged too) and whether the
table finished. It is written before the first row is read, so a restart reads the same
snapshot from that key on instead of starting over.

Like the partition checkpoints, a record that does not parse stops the producer: guessing could
skip rows.
"""

from __future__ import annotations

import json
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from spanner_cdc.producer.errors import CheckpointError
from spanner_cdc.producer.kafka import KafkaClient

_TABLE = "table/"


@dataclass
class TablePlan:
    """One table's backfill: which snapshot, which columns, how far, whether done."""

    table: str
    snapshot_micros: int
    columns: list[str]
    #: The key (JSON-form values, key order) of the last acknowledged row; None: none yet.
    after_key: list[Any] | None = None
    finished: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "snapshot_micros": self.snapshot_micros,
            "columns": self.columns,
            "after_key": self.after_key,
            "finished": self.finished,
        }

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


class BackfillStore:
    def __init__(self, kafka: KafkaClient) -> None:
        self.kafka = kafka
        self.topic = kafka.topics.backfills

    def read(self, timeout: float = 30.0) -> dict[str, TablePlan]:
        """Every table's newest record (blocking)."""
        metadata = self.kafka.admin.list_topics(timeout=timeout)
        if self.topic not in metadata.topics:
            return {}
        plans: dict[str, TablePlan] = {}
        with closing(self.kafka.read_topic(self.topic, timeout)) as records:
            for offset, key, value in records:
                name = (key or b"").decode(errors="replace")
                try:
                    if not name.startswith(_TABLE) or value is None:
                        raise ValueError(f"unexpected key {name[:60]!r}")
                    plan = TablePlan.from_json(json.loads(value))
                    if name != _TABLE + plan.table:
                        raise ValueError(f"key {name[:60]!r} names another table than {plan.table!r}")
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    raise CheckpointError(
                        f"{self.topic} offset {offset} is not a backfill record ({exc}); the producer "
                        "will not guess which rows were published: restore the topic, or backfill "
                        "afresh with a new --topic-prefix"
                    ) from None
                plans[plan.table] = plan
        return plans

    async def write(self, plan: TablePlan) -> None:
        """Write the plan and wait until Kafka acknowledged it."""
        await self.kafka.ensure_topic(self.topic, compacted=True)
        key = (_TABLE + plan.table).encode()
        await self.kafka.produce_acknowledged(self.topic, key, json.dumps(plan.to_json()).encode())
