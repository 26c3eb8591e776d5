"""Per-table JSON records on a compacted control topic, the newest per table: where each
backfilled table (``producer.backfill.store``) and each polled table (``producer.poll.store``)
stands.

The key is ``{kind}/{table}``; the value, the record (a dataclass) as JSON. Like the partition checkpoints, a
record that does not parse stops the producer with one line: guessing could skip rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import closing
from dataclasses import fields
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from spanner_cdc.producer.errors import CheckpointError
from spanner_cdc.producer.publish.kafka import KafkaClient


class TableRecord(Protocol):
    """A flat dataclass instance (its fields JSON values) with the table it is about."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def table(self) -> str: ...


R = TypeVar("R", bound=TableRecord)


class ControlRecords(Generic[R]):
    """Records of one kind on ``topic``. ``parse`` builds one from its JSON (raising ValueError,
    KeyError or TypeError for one it cannot use); ``remedy`` is what the error tells a user to do
    about a record that does not parse."""

    def __init__(
        self,
        kafka: KafkaClient,
        topic: str,
        kind: str,
        parse: Callable[[dict[str, Any]], R],
        remedy: str,
    ) -> None:
        self.kafka = kafka
        self.topic = topic
        self._prefix = f"{kind}/"
        self._parse = parse
        self._remedy = remedy

    def read(self, timeout: float = 30.0) -> dict[str, R]:
        """Every table's newest record (blocking)."""
        metadata = self.kafka.admin.list_topics(timeout=timeout)
        if self.topic not in metadata.topics:
            return {}
        records: dict[str, R] = {}
        with closing(self.kafka.read_topic(self.topic, timeout)) as messages:
            for offset, key, value in messages:
                name = (key or b"").decode(errors="replace")
                try:
                    if not name.startswith(self._prefix) or value is None:
                        raise ValueError(f"unexpected key {name[:60]!r}")
                    record = self._parse(json.loads(value))
                    if name != self._prefix + record.table:
                        raise ValueError(f"key {name[:60]!r} names another record than {record.table!r}")
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    raise CheckpointError(
                        f"{self.topic} offset {offset} does not parse ({exc}); {self._remedy}"
                    ) from None
                records[record.table] = record
        return records

    async def write(self, record: R) -> None:
        """Write ``record`` and wait until Kafka acknowledged it."""
        await self.kafka.ensure_topic(self.topic, compacted=True)
        key = (self._prefix + record.table).encode()
        # The fields as they are, not ``asdict``'s deep copy: a poll's boundary may list
        # thousands of keys, and the text is made before anything can change them.
        value = json.dumps({field.name: getattr(record, field.name) for field in fields(record)})
        await self.kafka.produce_acknowledged(self.topic, key, value.encode())
