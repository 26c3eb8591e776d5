"""Where the polling of a table stands: one compacted record per table on
``_spanner-cdc.{prefix}.polls``, key ``table/{table}`` (``producer.publish.control_records``).

The record is written only for rows Kafka acknowledged: the boundary (the newest commit
timestamp whose rows are all on Kafka, in poll order) with the keys already published at exactly
that timestamp, and the read timestamp of the last poll that finished. A restart polls from the
boundary again and skips those keys, so nothing is lost and a row published twice (after a
crash, before the record moved) keeps its uuid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spanner_cdc.producer.publish.control_records import ControlRecords
from spanner_cdc.producer.publish.kafka import KafkaClient


@dataclass
class PollPosition:
    table: str
    column: str
    #: Read timestamp of the last poll whose rows are all acknowledged: a watermark may say
    #: every commit up to it is on Kafka, and a row that existed then is an UPDATE.
    polled_micros: int
    #: Rows whose commit timestamp is at or after this are read by the next poll.
    boundary_micros: int
    #: Keys (JSON-form values, key order) published with a commit timestamp of exactly the boundary.
    boundary_keys: list[list[Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        #: The same keys, for lookups (a transaction may stamp thousands of rows alike).
        self._boundary_set: set[tuple[Any, ...]] = {tuple(key) for key in self.boundary_keys}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PollPosition:
        keys = data["boundary_keys"]
        if not isinstance(keys, list) or not all(isinstance(key, list) for key in keys):
            raise ValueError("boundary_keys is not a list of keys")
        return cls(
            table=str(data["table"]),
            column=str(data["column"]),
            polled_micros=int(data["polled_micros"]),
            boundary_micros=int(data["boundary_micros"]),
            boundary_keys=keys,
        )

    def passed(self, stamp_micros: int, key: tuple[Any, ...]) -> None:
        """Kafka acknowledged the row ``key`` stamped ``stamp_micros`` and every row before it."""
        if stamp_micros != self.boundary_micros:
            self.boundary_micros, self.boundary_keys, self._boundary_set = stamp_micros, [], set()
        elif key in self._boundary_set:
            return
        self.boundary_keys.append(list(key))
        self._boundary_set.add(key)

    def published(self, stamp_micros: int, key: tuple[Any, ...]) -> bool:
        """Whether the row version is one this position says is on Kafka already."""
        return stamp_micros < self.boundary_micros or (
            stamp_micros == self.boundary_micros and key in self._boundary_set
        )


def poll_store(kafka: KafkaClient) -> ControlRecords[PollPosition]:
    return ControlRecords(
        kafka,
        kafka.topics.polls,
        "table",
        PollPosition.from_json,
        "the poller will not guess which rows were published: restore the topic, or poll afresh "
        "with a new --topic-prefix",
    )
