"""The consistent cut's bookkeeping on a DuckDB file: no broker, no Spark.

Events are decoded from the bytes the producer would write; the schema store is filled
directly, so brought-back events decode without reading a schema topic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spanner_cdc.consumer.decode import BatchDecoder, DecodedEvent, SchemaTopic, WatermarkSeen
from spanner_cdc.consumer.sinks.replica.backends import DuckDbBackend
from spanner_cdc.consumer.sinks.replica.cut import ConsistentCut, incomplete_transactions
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import WATERMARK_WRITER, Watermark
from spanner_cdc.schemas.wire import SchemaStore, WriterSchema, encode
from testkit.synthetic import STREAM, ChangeFactory

pytestmark = pytest.mark.unit
TOPIC = "P.Accounts"


@pytest.fixture
def decoder() -> BatchDecoder:
    return BatchDecoder(SchemaTopic({}, "P"), Topics("P"), lambda: {TOPIC: 2})


@pytest.fixture
def cut(tmp_path: Path, decoder: BatchDecoder) -> ConsistentCut:
    return ConsistentCut(
        DuckDbBackend(tmp_path / "replica.duckdb"), decoder.decode, lambda topic: topic != "P.Other"
    )


def decoded(decoder: BatchDecoder, records: list[dict[str, Any]], partition: int = 0) -> list[DecodedEvent]:
    events = ChangeFactory().events(*records)
    values = []
    for event in events:
        writer = WriterSchema.from_schema(event.table.event_schema)
        decoder.schemas.store.add(writer.schema_json)
        values.append(encode(writer, event.value))
    rows = pa.table(
        {
            "key": pa.array([b"k"] * len(values), pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": [TOPIC] * len(values),
            "partition": pa.array([partition] * len(values), pa.int32()),
            "offset": pa.array(range(len(values)), pa.int64()),
        }
    )
    return decoder.decode(rows).events


def mark(partition: int, micros: int, topics: dict[str, int] | None = None) -> WatermarkSeen:
    return WatermarkSeen(TOPIC, partition, 0, Watermark(STREAM, micros, topics or {TOPIC: 2}))


def test_the_cut_is_the_lowest_partition_watermark_and_waits_for_every_partition(
    cut: ConsistentCut, decoder: BatchDecoder
) -> None:
    factory = ChangeFactory()
    early, late = (factory.record("INSERT", {"Id": key}, {"Balance": "1"}) for key in "ab")
    events = decoded(decoder, [early, late])
    early_micros, late_micros = (e.commit_micros for e in events)

    waiting = cut.release(events, [mark(0, late_micros)])
    assert (waiting.events, waiting.cut_micros, waiting.held) == ([], None, 2), "partition 1 unheard"

    partial = cut.release([], [mark(1, early_micros)])
    assert [e.record["uuid"] for e in partial.events] == [events[0].record["uuid"]]
    assert (partial.cut_micros, partial.held) == (early_micros, 1)

    rest = cut.release([], [mark(1, late_micros)])
    assert [e.record["uuid"] for e in rest.events] == [events[1].record["uuid"]]
    assert (rest.cut_micros, rest.held) == (late_micros, 0)


def test_a_topic_missing_from_the_newest_watermark_stops_holding_the_cut_back(
    cut: ConsistentCut, decoder: BatchDecoder
) -> None:
    both = {TOPIC: 1, "P.Dropped": 1}
    assert cut.release([], [mark(0, 100, both)]).cut_micros is None, "P.Dropped has no watermark"
    assert cut.release([], [mark(0, 200, {TOPIC: 1})]).cut_micros == 200


def test_unsubscribed_topics_are_not_waited_for(cut: ConsistentCut) -> None:
    assert cut.release([], [mark(0, 100, {TOPIC: 1, "P.Other": 3})]).cut_micros == 100


def test_the_cut_never_moves_back_and_late_events_are_applied_and_counted(
    cut: ConsistentCut, decoder: BatchDecoder
) -> None:
    events = decoded(decoder, [ChangeFactory().record("INSERT", {"Id": "a"}, {"Balance": "1"})])
    commit = events[0].commit_micros
    assert cut.release([], [mark(0, commit + 10, {TOPIC: 1})]).cut_micros == commit + 10
    late = cut.release(events, [mark(0, commit - 10, {TOPIC: 1})])  # a restarted producer's stamp
    assert (late.cut_micros, late.behind_cut, len(late.events)) == (commit + 10, 1, 1)


def test_transactions_missing_records_or_mods_are_reported(decoder: BatchDecoder) -> None:
    factory = ChangeFactory()
    whole = factory.transaction(
        factory.record("INSERT", {"Id": "a"}, {"Balance": "1"}),
        factory.record("INSERT", {"Id": "b"}, {"Balance": "1"}),
    )
    cut_short = factory.transaction(
        factory.record("INSERT", {"Id": "c"}, {"Balance": "1"}),
        factory.record("INSERT", {"Id": "d"}, {"Balance": "1"}),
    )
    events = decoded(decoder, [*whole, cut_short[0]])
    assert incomplete_transactions(events) == [cut_short[0]["server_transaction_id"]]


def test_watermark_records_decode_to_what_was_encoded() -> None:
    stamp = Watermark(STREAM, 1_750_000_000_123_456, {TOPIC: 6})
    store = SchemaStore({WATERMARK_WRITER.fingerprint: WATERMARK_WRITER})
    assert Watermark.from_record(store.decode(stamp.encode(1))) == stamp
