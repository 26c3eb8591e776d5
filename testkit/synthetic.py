"""Change events built and published exactly as the producer does, without an emulator.

Consumer tests need precise control (the same change twice, a key's changes out of order,
a column added mid-stream), which a live change stream cannot give on demand.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from spanner_cdc.producer.lineage.acks import AckTracker
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.publish.framing import Framing
from spanner_cdc.producer.publish.kafka import KafkaClient
from spanner_cdc.producer.publish.publisher import EventSender
from spanner_cdc.producer.publish.watermarks import WatermarkEmitter
from spanner_cdc.schemas.events import ENVELOPE_FIELDS, METADATA_FIELDS, Event, EventBuilder
from spanner_cdc.schemas.records import DataChangeRecord

STREAM = "projects/p/instances/i/databases/d/changeStreams/TestStream"
BASE_MICROS = 1_750_000_000_000_000
#: Shared by every factory: distinct transactions (and uuids) across tables and table versions.
_TRANSACTIONS = itertools.count(1)
ACCOUNT_COLUMNS = (("Id", "STRING", True), ("Balance", "INT64", False), ("Note", "STRING", False))


@dataclass
class ChangeFactory:
    """Data change records of one table, each in its own transaction, commit time ascending."""

    table: str = "Accounts"
    columns: Sequence[tuple[str, str, bool]] = ACCOUNT_COLUMNS
    capture: str = "NEW_ROW"

    def record(
        self,
        mod_type: str,
        keys: dict[str, Any],
        new_values: dict[str, Any] | None = None,
        old_values: dict[str, Any] | None = None,
        commit_micros: int | None = None,
    ) -> dict[str, Any]:
        number = next(_TRANSACTIONS)
        return {
            "commit_timestamp": commit_micros if commit_micros is not None else BASE_MICROS + number * 1000,
            "record_sequence": "00000000",
            "server_transaction_id": f"tx-{number:06d}",
            "is_last_record_in_transaction_in_partition": True,
            "table_name": self.table,
            "column_types": [
                {"name": name, "type": {"code": code}, "is_primary_key": key, "ordinal_position": position}
                for position, (name, code, key) in enumerate(self.columns, start=1)
            ],
            "mods": [{"keys": keys, "new_values": new_values or {}, "old_values": old_values or {}}],
            "mod_type": mod_type,
            "value_capture_type": self.capture,
            "number_of_records_in_transaction": 1,
            "number_of_partitions_in_transaction": 1,
            "transaction_tag": "",
            "is_system_transaction": False,
        }

    def transaction(self, *records: dict[str, Any]) -> list[dict[str, Any]]:
        """``records`` (of this or other factories) as one transaction: one id, one commit
        timestamp, numbered record sequences, the record count announced in each."""
        first = records[0]
        return [
            {
                **record,
                "commit_timestamp": first["commit_timestamp"],
                "server_transaction_id": first["server_transaction_id"],
                "record_sequence": f"{sequence:08d}",
                "number_of_records_in_transaction": len(records),
            }
            for sequence, record in enumerate(records)
        ]

    def events(self, *records: dict[str, Any]) -> list[Event]:
        builder = EventBuilder(stream_name=STREAM, database="d")
        return [e for r in records for e in builder.build(DataChangeRecord.from_json(r), "token", 1)]


def with_value(event: Event, value: dict[str, Any]) -> Event:
    """``event`` with the envelope record ``value`` (by name, as :attr:`Event.value` gives it):
    how a test forges an event the producer would not make."""
    metadata = tuple(value["source_metadata"][name] for name in METADATA_FIELDS)
    fields = tuple(metadata if name == "source_metadata" else value[name] for name in ENVELOPE_FIELDS)
    return Event(event.table, event.key, fields)


def publish(
    bootstrap: str,
    prefix: str,
    events: Iterable[Event],
    raw: Iterable[tuple[str, bytes]] = (),
    watermark: int | bool = True,
    *,
    framing: Framing | None = None,
) -> None:
    """Every event through the producer's own sender (schemas first, key and value encoded behind
    ``framing``'s headers — single-object by default — acknowledged), then raw messages, then — as
    the producer would — a watermark on every event-topic partition: by default the newest commit
    timestamp published, or the given one; ``False`` for none."""
    events = list(events)

    async def run() -> None:
        kafka = KafkaClient(bootstrap, prefix, {}, topic_partitions=3, replication_factor=-1)
        async with kafka.serving():
            await kafka.ensure_topic(kafka.topics.schemas, compacted=True)
            tracker = AckTracker()
            await EventSender(kafka, ProducerMetrics(), framing=framing).send(events, tracker)
            pending = []
            for topic, value in raw:
                await kafka.ensure_topic(topic)
                pending.append(kafka.produce_acknowledged(topic, b"raw", value))
            await asyncio.gather(*pending)
            await tracker.drained()
            if tracker.failed:
                raise RuntimeError(f"Kafka did not acknowledge an event: {tracker.failed}")
            if watermark is not False:
                newest = max((e.commit_timestamp for e in events), default=None)
                emitter = WatermarkEmitter(kafka, STREAM, framing)
                await emitter.publish(newest if watermark is True else watermark)

    asyncio.run(run())


def random_history(
    factory: ChangeFactory, changes: int, keys: int = 40, seed: int = 11, updated_columns: int | None = None
) -> list[Event]:
    """A valid history of inserts, updates and deletes over ``keys`` rows, commit time ascending.
    An insert sets every value column of ``factory``'s table (INT64 or STRING), an update
    ``updated_columns`` of them picked at random (None: every one)."""
    rng = random.Random(seed)
    [key_column] = [name for name, _, is_key in factory.columns if is_key]
    value_columns = [(name, code) for name, code, is_key in factory.columns if not is_key]
    alive: set[str] = set()
    records = []
    for step in range(changes):
        key = f"k{rng.randrange(keys):03d}"
        if key not in alive:
            records.append(factory.record("INSERT", {key_column: key}, _values(value_columns, step)))
            alive.add(key)
        elif rng.random() < 0.25:
            records.append(factory.record("DELETE", {key_column: key}, {}))
            alive.discard(key)
        else:
            updated = value_columns if updated_columns is None else rng.sample(value_columns, updated_columns)
            records.append(factory.record("UPDATE", {key_column: key}, _values(updated, step)))
    return factory.events(*records)


def wide_table(value_columns: int) -> ChangeFactory:
    """A table ``Wide`` of a STRING key ``Id`` and ``value_columns`` INT64 columns."""
    return ChangeFactory(
        table="Wide",
        columns=[("Id", "STRING", True), *((f"V{i:02d}", "INT64", False) for i in range(value_columns))],
    )


def _values(columns: Sequence[tuple[str, str]], step: int) -> dict[str, str]:
    """Spanner JSON values for ``columns`` at history step ``step``."""
    spelled = {"INT64": str(step), "STRING": f"n{step}"}
    return {name: spelled[code] for name, code in columns}


def last_images(events: Sequence[Event]) -> list[Event]:
    """Each key's last event after ``events`` (a random_history, in commit order), keys whose
    last change deleted them left out: the events a replica's rows come from, by key."""
    last: dict[str, Event] = {}
    for event in events:
        key = event.key["Id"]
        if event.change_type == "DELETE":
            last.pop(key, None)
        else:
            last[key] = event
    return [last[key] for key in sorted(last)]


def account_row(event: Event) -> tuple[Any, ...]:
    """The ``Accounts`` row ``event`` (an insert or update of random_history's, which sets every
    column) leaves: key, balance, note."""
    payload = event.value["payload"]
    return payload["Id"], payload["Balance"], payload["Note"]


def final_rows(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    """What a replica of ``events`` holds, sorted by key."""
    return [account_row(e) for e in last_images(events)]
