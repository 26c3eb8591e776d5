"""Event contract throughput: change record → event → single-object Avro, in one process.

The baseline is fastavro encoding the already-built event dicts alone, so the ratio shows what
conversion and envelope building cost on top of the Avro encoder every pipeline needs anyway.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fastavro

from schemas.events import DataChangeRecord, EventBuilder
from schemas.wire import WriterSchema, encode
from tests.support.records import STREAM_NAME, account_transfer_records


@dataclass(frozen=True)
class Figure:
    name: str
    events: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.events / self.seconds


def synthetic_records(count: int) -> list[dict[str, Any]]:
    """``count`` one-mod UPDATE records shaped like seed 000's transfer, distinct keys and values."""
    template = account_transfer_records()[0]
    return [
        {
            **template,
            "record_sequence": f"{index:08d}",
            "mods": [
                {
                    "keys": {"AccountId": f"acct-{index:07d}"},
                    "new_values": {"LastUpdate": "2022-09-27T12:30:00.123456Z", "Balance": str(index)},
                    "old_values": {"LastUpdate": "2022-09-26T11:28:00.189413Z", "Balance": str(index + 1)},
                }
            ],
        }
        for index in range(count)
    ]


def timed(name: str, events: int, work: Callable[[], None]) -> Figure:
    started = time.perf_counter()
    work()
    return Figure(name, events, time.perf_counter() - started)


def run(count: int) -> list[Figure]:
    records = synthetic_records(count)
    builder = EventBuilder(STREAM_NAME, "bank")
    events = [e for r in records for e in builder.build(DataChangeRecord.from_json(r), "p", 0)]
    table = events[0].table
    writer, key_writer = (
        WriterSchema.from_schema(table.event_schema),
        WriterSchema.from_schema(table.key_schema),
    )

    def fastavro_alone() -> None:
        buffer = io.BytesIO()
        for event in events:
            fastavro.schemaless_writer(buffer, writer.parsed, event.value)

    def contract_pipeline() -> None:
        pipeline_builder = EventBuilder(STREAM_NAME, "bank")
        for record in records:
            for event in pipeline_builder.build(DataChangeRecord.from_json(record), "p", 0):
                encode(writer, event.value)
                encode(key_writer, event.key)

    return [
        timed("fastavro encode alone (baseline)", len(events), fastavro_alone),
        timed("record → event → Avro (value + key)", len(events), contract_pipeline),
    ]
