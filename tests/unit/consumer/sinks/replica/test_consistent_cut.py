"""The consistent cut's bookkeeping on a DuckDB file: no broker, no Spark.

Events are decoded from the bytes the producer would write; the schema store is filled
directly, so brought-back events decode without reading a schema topic.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spanner_cdc.consumer.decode.decoded import DecodedEvent, WatermarkSeen
from spanner_cdc.consumer.decode.driver import BatchDecoder, BrokerPartitions
from spanner_cdc.consumer.decode.rules import MAX_WATERMARK_AHEAD_MICROS, check_watermark
from spanner_cdc.consumer.decode.schema_topic import SchemaTopic
from spanner_cdc.consumer.errors import ConsumerError, ReplicaQueryError
from spanner_cdc.consumer.sinks.replica.backends import DuckDbBackend
from spanner_cdc.consumer.sinks.replica.cut import (
    PENDING,
    ConsistentCut,
    Release,
    Slice,
    incomplete_transactions,
)
from spanner_cdc.consumer.sinks.replica.names import quote
from spanner_cdc.consumer.sinks.replica.stage.rows import StagedEvents, event_messages
from spanner_cdc.schemas.errors import DecodeError
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import WATERMARK_WRITER, Watermark
from spanner_cdc.schemas.wire import SchemaStore
from testkit.decoding import decoded_events, event_rows, record_of
from testkit.synthetic import STREAM, ChangeFactory

pytestmark = pytest.mark.unit
TOPIC = "P.Accounts"


@pytest.fixture
def decoder() -> BatchDecoder:
    return BatchDecoder(SchemaTopic({}, "P"), Topics("P"), BrokerPartitions(lambda: {TOPIC: 2}))


@pytest.fixture
def cut(tmp_path: Path, decoder: BatchDecoder) -> ConsistentCut:
    backend = DuckDbBackend(tmp_path / "replica.duckdb")
    return ConsistentCut(backend, lambda topic: topic != "P.Other", 1_000, decoder.partitions.counts)


def release(
    cut: ConsistentCut, decoder: BatchDecoder, fresh: list[DecodedEvent], marks: list[WatermarkSeen]
) -> tuple[Release, list[Slice]]:
    """The release of ``fresh`` (as the batch's outline rows), and the slices it handed over;
    held events are read again on the driver."""
    slices: list[Slice] = []
    outlined, messages = event_rows(fresh), event_messages(fresh)

    def stage(rows: pa.Table) -> StagedEvents:
        return StagedEvents.of(decoder.decode(rows))

    return cut.release(outlined, messages, marks, lambda piece, _cut: slices.append(piece), stage), slices


def uuids(slices: list[Slice]) -> list[str]:
    return [u for piece in slices for u in piece.rows.column("uuid").to_pylist()]


def decoded(decoder: BatchDecoder, records: list[dict[str, Any]], partition: int = 0) -> list[DecodedEvent]:
    return decoded_events(decoder, records, TOPIC, partition)


def mark(partition: int, micros: int, topics: dict[str, int] | None = None) -> WatermarkSeen:
    return WatermarkSeen(TOPIC, partition, 0, Watermark(STREAM, micros, topics or {TOPIC: 2}), b"")


def test_the_cut_is_the_lowest_partition_watermark_and_waits_for_every_partition(
    cut: ConsistentCut, decoder: BatchDecoder
) -> None:
    factory = ChangeFactory()
    early, late = (factory.record("INSERT", {"Id": key}, {"Balance": "1"}) for key in "ab")
    events = decoded(decoder, [early, late])
    early_micros, late_micros = (e.commit_micros for e in events)

    waiting, applied = release(cut, decoder, events, [mark(0, late_micros)])
    assert (applied, waiting.cut_micros, waiting.held) == ([], None, 2), "partition 1 unheard"

    partial, applied = release(cut, decoder, [], [mark(1, early_micros)])
    assert uuids(applied) == [record_of(events[0])["uuid"]]
    assert (partial.cut_micros, partial.held) == (early_micros, 1)

    rest, applied = release(cut, decoder, [], [mark(1, late_micros)])
    assert uuids(applied) == [record_of(events[1])["uuid"]]
    assert (rest.cut_micros, rest.held) == (late_micros, 0)


def test_a_topic_missing_from_the_newest_watermark_stops_holding_the_cut_back(
    cut: ConsistentCut, decoder: BatchDecoder
) -> None:
    both = {TOPIC: 1, "P.Dropped": 1}
    assert release(cut, decoder, [], [mark(0, 100, both)])[0].cut_micros is None, "P.Dropped has no watermark"
    assert release(cut, decoder, [], [mark(0, 200, {TOPIC: 1})])[0].cut_micros == 200


def test_a_watermark_listing_fewer_topics_than_the_broker_has_does_not_release_the_cut(
    cut: ConsistentCut, decoder: BatchDecoder
) -> None:
    """One forged watermark, ahead and listing one partition only, used to become the cut."""
    assert release(cut, decoder, [], [mark(0, 100), mark(1, 100)])[0].cut_micros == 100
    assert release(cut, decoder, [], [mark(0, 10_000, {TOPIC: 1})])[0].cut_micros == 100
    assert release(cut, decoder, [], [mark(1, 200)])[0].cut_micros == 200


def test_a_topic_no_longer_subscribed_is_not_waited_for_after_a_restart(
    tmp_path: Path, decoder: BatchDecoder
) -> None:
    backend = DuckDbBackend(tmp_path / "replica.duckdb")
    counts = BrokerPartitions(lambda: {TOPIC: 1, "P.Later": 1}).counts
    before = ConsistentCut(backend, lambda topic: True, 1_000, counts)
    both = {TOPIC: 1, "P.Later": 1}
    assert release(before, decoder, [], [mark(0, 100, both)])[0].cut_micros is None, "P.Later has none"
    after = ConsistentCut(backend, lambda topic: topic == TOPIC, 1_000, counts)
    assert release(after, decoder, [], [mark(0, 200, both)])[0].cut_micros == 200


def test_unsubscribed_topics_are_not_waited_for(cut: ConsistentCut, decoder: BatchDecoder) -> None:
    assert release(cut, decoder, [], [mark(0, 100, {TOPIC: 1, "P.Other": 3})])[0].cut_micros == 100


def test_the_cut_never_moves_back_and_late_events_are_applied_and_counted(
    cut: ConsistentCut, decoder: BatchDecoder
) -> None:
    events = decoded(decoder, [ChangeFactory().record("INSERT", {"Id": "a"}, {"Balance": "1"})])
    commit = events[0].commit_micros
    assert release(cut, decoder, [], [mark(0, commit + 10, {TOPIC: 1})])[0].cut_micros == commit + 10
    stamp = mark(0, commit - 10, {TOPIC: 1})  # a restarted producer's
    late, applied = release(cut, decoder, events, [stamp])
    assert (late.cut_micros, late.behind_cut, len(uuids(applied))) == (commit + 10, 1, 1)


def test_a_held_backlog_comes_back_in_slices_that_never_split_a_transaction(
    cut: ConsistentCut, decoder: BatchDecoder
) -> None:
    factory = ChangeFactory()
    singles = [factory.record("INSERT", {"Id": f"s{n}"}, {"Balance": "1"}) for n in range(5)]
    whole = factory.transaction(
        *(factory.record("INSERT", {"Id": f"t{n}"}, {"Balance": "1"}) for n in range(3))
    )
    held = decoded(decoder, [*singles, *whole])
    newest = max(e.commit_micros for e in held)
    cut.slice_events = 2
    late_unheard = mark(0, newest, {TOPIC: 1, "P.Late": 1})
    assert release(cut, decoder, held, [late_unheard])[0].held == 8
    fresh = decoded(decoder, [factory.record("INSERT", {"Id": "f"}, {"Balance": "1"})])

    after, slices = release(cut, decoder, fresh, [mark(0, newest + 10_000, {TOPIC: 1})])

    commits = [piece.rows.column("commit_micros").to_pylist() for piece in slices]
    assert [len(c) for c in commits] == [2, 2, 5], "2 held, 2 held, 1 + the 3-record transaction + fresh"
    assert all(max(a) < min(b) for a, b in itertools.pairwise(commits)), "oldest commits first"
    assert sorted(uuids(slices)) == sorted(record_of(e)["uuid"] for e in [*held, *fresh])
    assert (after.held, after.incomplete_transactions) == (0, 0)


def test_a_held_event_that_no_longer_reads_as_one_stops_the_batch_naming_why(
    cut: ConsistentCut, decoder: BatchDecoder
) -> None:
    events = decoded(decoder, [ChangeFactory().record("INSERT", {"Id": "a"}, {"Balance": "1"})])
    commit = events[0].commit_micros
    assert release(cut, decoder, events, [mark(0, commit - 1, {TOPIC: 1})])[0].held == 1
    cut.backend.execute(f"UPDATE {quote(PENDING)} SET value = ?", [b"\x00 framed for a schema registry"])

    with pytest.raises(ConsumerError, match=r"a held event no longer decodes \(registry-framed\)"):
        release(cut, decoder, [], [mark(0, commit, {TOPIC: 1})])


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
    alone = factory.record("INSERT", {"Id": "e"}, {"Balance": "1"})  # one record, one mod: whole
    events = decoded(decoder, [*whole, alone, cut_short[0]])
    assert incomplete_transactions(event_rows(events)) == [cut_short[0]["server_transaction_id"]]


def test_watermark_records_decode_to_what_was_encoded() -> None:
    stamp = Watermark(STREAM, 1_750_000_000_123_456, {TOPIC: 6})
    store = SchemaStore({WATERMARK_WRITER.fingerprint: WATERMARK_WRITER})
    assert Watermark.from_record(store.decode(stamp.encode(1))) == stamp


def test_a_pending_table_keyed_by_coordinates_is_made_again_without_the_key_its_rows_kept(
    tmp_path: Path,
) -> None:
    """``cdc$pending`` as earlier versions made it (a primary key on the Kafka coordinates, which
    refused a held event of a topic created again at an offset an old one still held)."""
    backend = DuckDbBackend(tmp_path / "replica.duckdb")
    backend.execute(
        f'CREATE TABLE {quote(PENDING)} (topic VARCHAR NOT NULL, "partition" INTEGER NOT NULL, '
        '"offset" BIGINT NOT NULL, commit_micros BIGINT NOT NULL, key BYTEA, value BYTEA NOT NULL, '
        'PRIMARY KEY (topic, "partition", "offset"))'
    )
    backend.execute(f"INSERT INTO {quote(PENDING)} VALUES (?, 0, 7, 100, NULL, ?)", [TOPIC, b"held"])

    ConsistentCut(backend, lambda topic: True, 1_000, dict)
    backend.execute(f"INSERT INTO {quote(PENDING)} VALUES (?, 0, 7, 200, NULL, ?)", [TOPIC, b"again"])

    rows = backend.execute(
        f'SELECT "offset", commit_micros, value FROM {quote(PENDING)} ORDER BY commit_micros'
    )
    assert rows == [(7, 100, b"held"), (7, 200, b"again")]
    with pytest.raises(ReplicaQueryError, match="NOT NULL"):  # the columns' own constraints stay
        backend.execute(f"INSERT INTO {quote(PENDING)} VALUES (?, 0, 8, 300, NULL, NULL)", [TOPIC])


def test_a_watermark_ahead_of_this_machines_clock_by_more_than_its_skew_is_refused() -> None:
    """A watermark is a time up to which every change was read already, never ahead of the true
    time: one ahead of this machine's clock by more than the skew taken is refused, one within
    it is taken. Before, the bound was the commit timestamps' hour, and forged watermarks 59
    minutes ahead on every partition moved the cut 59 minutes."""
    now, topic = 1_800_000_000_000_000, "P.Accounts"
    counts = {topic: 1}
    check_watermark(Watermark(STREAM, now + MAX_WATERMARK_AHEAD_MICROS, counts), topic, 0, counts, now)
    for ahead in (MAX_WATERMARK_AHEAD_MICROS + 1, 59 * 60_000_000):
        with pytest.raises(DecodeError, match="s ahead of this machine's clock") as refused:
            check_watermark(Watermark(STREAM, now + ahead, counts), topic, 0, counts, now)
        assert refused.value.reason == "bad-watermark"
