"""The replica's stage rows as the tasks stage them and the driver reads them back: no Spark, no
database. Events are decoded from the bytes the producer would write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spanner_cdc.consumer.decode.change_rows import SET_PREFIX
from spanner_cdc.consumer.decode.decoded import DecodedEvent
from spanner_cdc.consumer.decode.driver import BatchDecoder, BrokerPartitions
from spanner_cdc.consumer.decode.kafka_rows import DECODE_SCHEMA
from spanner_cdc.consumer.decode.schema_topic import SchemaTopic
from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.sinks.changelog import COORDINATES
from spanner_cdc.consumer.sinks.replica.stage.held import HeldStageRows
from spanner_cdc.consumer.sinks.replica.stage.rows import (
    ReplicaStaging,
    StagedEvents,
    combined,
    event_messages,
    parts_of_events,
    staged_parts,
)
from spanner_cdc.schemas.topics import Topics
from testkit.decoding import decoded_events, event_rows
from testkit.synthetic import ACCOUNT_COLUMNS, ChangeFactory

pytestmark = pytest.mark.unit
TOPIC = "P.Accounts"


def new_decoder() -> BatchDecoder:
    return BatchDecoder(SchemaTopic({}, "P"), Topics("P"), BrokerPartitions(lambda: {TOPIC: 1}))


def decoded(records: list[dict[str, Any]], first_offset: int = 0) -> list[DecodedEvent]:
    return decoded_events(new_decoder(), records, TOPIC, first_offset=first_offset)


def test_two_tasks_parts_of_two_table_versions_combine_into_one_with_every_column(tmp_path: Path) -> None:
    """Task 0 read the table before a column was added, task 1 after: the driver reads both
    files back and merges one part, the new column null and not set in the older rows."""
    old, new = ChangeFactory(), ChangeFactory(columns=[*ACCOUNT_COLUMNS, ("Added", "STRING", False)])
    before = decoded([old.record("INSERT", {"Id": "a"}, {"Balance": "1", "Note": "x"})])
    after = decoded([new.record("UPDATE", {"Id": "a"}, {"Added": "y"})], first_offset=1)
    staging = ReplicaStaging(Location.local(tmp_path / "batch"))
    staging.write(0, staged_parts(before), event_messages(before))
    staging.write(1, staged_parts(after), event_messages(after))

    [part] = combined(staging.read())

    assert (part.table, part.key) == ("Accounts", ("Id",))
    assert [c.name for c in part.columns] == ["Id", "Balance", "Note", "Added"]
    rows = part.rows.to_pylist()
    assert [(r["Id"], r["Balance"], r["Added"]) for r in rows] == [("a", 1, None), ("a", None, "y")]
    assert [(r[SET_PREFIX + "Balance"], r[SET_PREFIX + "Added"]) for r in rows] == [
        (True, False),
        (False, True),
    ]
    assert [r[COORDINATES[2]] for r in rows] == [0, 1]
    messages = staging.messages()
    assert messages.column("value").to_pylist() == [e.value for e in before + after]


def test_the_kept_rows_are_taken_by_their_kafka_coordinates_in_their_order(tmp_path: Path) -> None:
    """Kept events whose commit times enclose others' are taken by coordinates; a run of them
    with no other event in between, by their commit times: the same rows either way."""
    factory = ChangeFactory()
    events = decoded([factory.record("INSERT", {"Id": key}, {"Balance": "1"}) for key in "abcde"])
    parts = staged_parts(events)

    def ids(kept: list[DecodedEvent]) -> list[str]:
        [part] = parts_of_events(parts, event_rows(kept))
        return list(part.rows.column("Id").to_pylist())

    assert ids([events[3], events[0], events[4]]) == ["a", "d", "e"]
    assert ids(events[1:3]) == ["b", "c"]
    assert ids(events) == list("abcde")
    assert ids([]) == []


def test_events_of_one_transaction_are_told_apart_by_coordinates() -> None:
    """One commit time for the whole transaction: taking one of its events must not take all."""
    factory = ChangeFactory()
    records = factory.transaction(*(factory.record("INSERT", {"Id": key}, {"Balance": "1"}) for key in "abc"))
    events = decoded(records)
    [part] = parts_of_events(staged_parts(events), event_rows([events[1]]))

    assert part.rows.column("Id").to_pylist() == ["b"]


class RecordingStager:
    """Stages held events from their bytes, as a batch does on the driver, and records which."""

    def __init__(self, decoder: BatchDecoder) -> None:
        self.decoder = decoder
        self.offsets: list[list[int]] = []

    def __call__(self, rows: pa.Table) -> StagedEvents:
        self.offsets.append(rows.column("offset").to_pylist())
        return StagedEvents.of(self.decoder.decode(rows))


def kafka_rows(events: list[DecodedEvent]) -> pa.Table:
    return event_messages(events).select(DECODE_SCHEMA.names)


def stage_rows(staged: StagedEvents) -> list[dict[str, Any]]:
    return sorted(
        (row for part in combined(staged.parts) for row in part.rows.to_pylist()),
        key=lambda row: row[COORDINATES[2]],
    )


def history(changes: int) -> tuple[BatchDecoder, list[DecodedEvent]]:
    """Events of three keys, and the decoder that read them (it knows their schemas)."""
    factory, decoder = ChangeFactory(), new_decoder()
    records = [
        factory.record("INSERT" if n < 3 else "UPDATE", {"Id": "abc"[n % 3]}, {"Balance": str(n)})
        for n in range(changes)
    ]
    return decoder, decoded_events(decoder, records, TOPIC)


def test_held_events_kept_from_their_batch_come_back_as_staging_them_again_would_build_them(
    tmp_path: Path,
) -> None:
    """Offsets 1-3 were held by batch 7 and kept; 2-4 are released: 2 and 3 come from what was
    kept, 4 (not kept) is staged from its bytes, and the rows are those of staging all three."""
    decoder, events = history(5)
    held_rows = HeldStageRows(Location.local(tmp_path / "held"))
    held_rows.keep(7, event_rows(events[1:4]), staged_parts(events))
    stager = RecordingStager(decoder)

    staged = held_rows.staging_with(stager)(event_messages(events[2:5]))

    assert stager.offsets == [[4]]
    assert sorted(staged.outline.column("offset").to_pylist()) == [2, 3, 4]
    again = RecordingStager(decoder)(kafka_rows(events[2:5]))
    assert stage_rows(staged) == stage_rows(again)


def test_an_event_kept_by_two_batches_comes_back_once(tmp_path: Path) -> None:
    decoder, events = history(3)
    held_rows = HeldStageRows(Location.local(tmp_path / "held"))
    for batch_id in (1, 2):
        held_rows.keep(batch_id, event_rows(events), staged_parts(events))
    stager = RecordingStager(decoder)

    staged = held_rows.staging_with(stager)(event_messages(events))

    assert stager.offsets == []
    assert sorted(staged.outline.column("offset").to_pylist()) == [0, 1, 2]
    assert [row[COORDINATES[2]] for row in stage_rows(staged)] == [0, 1, 2]


def test_rows_taken_are_kept_no_longer_and_a_batch_goes_with_its_last(tmp_path: Path) -> None:
    """Taken rows leave the cache as they are taken: were their transaction rolled back, they
    would be staged again from the messages ``cdc$pending`` still holds."""
    decoder, events = history(4)
    held_rows = HeldStageRows(Location.local(tmp_path / "held"))
    held_rows.keep(1, event_rows(events), staged_parts(events))
    stager = RecordingStager(decoder)
    stage = held_rows.staging_with(stager)

    stage(event_messages(events[:2]))
    stage(event_messages(events))

    assert stager.offsets == [[0, 1]]
    assert not list((tmp_path / "held").iterdir())


def test_a_held_event_of_a_topic_created_again_is_not_taken_for_the_old_ones_at_its_offset(
    tmp_path: Path,
) -> None:
    """Batch 1 kept the old topic's events at offsets 0-1; the topic was deleted and created
    again, and batch 2 kept the new topic's, at offsets 0-1 too (later commits). Each message
    released takes the rows of its own event, told apart by commit time."""
    factory, decoder = ChangeFactory(), new_decoder()
    old = decoded_events(
        decoder, [factory.record("INSERT", {"Id": k}, {"Balance": "1"}) for k in "ab"], TOPIC
    )
    new = decoded_events(
        decoder, [factory.record("UPDATE", {"Id": k}, {"Balance": "2"}) for k in "ab"], TOPIC
    )
    held_rows = HeldStageRows(Location.local(tmp_path / "held"))
    held_rows.keep(1, event_rows(old), staged_parts(old))
    held_rows.keep(2, event_rows(new), staged_parts(new))
    stager = RecordingStager(decoder)
    stage = held_rows.staging_with(stager)

    released_new = stage(event_messages(new))
    released_old = stage(event_messages(old))

    assert stager.offsets == []
    assert [row["Balance"] for row in stage_rows(released_new)] == [2, 2]
    assert [row["Balance"] for row in stage_rows(released_old)] == [1, 1]
    assert not list((tmp_path / "held").iterdir())


def test_held_messages_coordinates_and_commit_time_do_not_tell_apart_are_staged_from_their_bytes(
    tmp_path: Path,
) -> None:
    """Two events of one transaction (one commit time) at offset 0 of a topic's two lives: the
    kept rows could be either's, so both are staged again and the kept ones dropped."""
    factory, decoder = ChangeFactory(), new_decoder()
    first, second = factory.transaction(
        factory.record("INSERT", {"Id": "a"}, {"Balance": "1"}),
        factory.record("INSERT", {"Id": "b"}, {"Balance": "2"}),
    )
    old, new = decoded_events(decoder, [first], TOPIC), decoded_events(decoder, [second], TOPIC)
    held_rows = HeldStageRows(Location.local(tmp_path / "held"))
    held_rows.keep(1, event_rows(old), staged_parts(old))
    held_rows.keep(2, event_rows(new), staged_parts(new))
    stager = RecordingStager(decoder)

    staged = held_rows.staging_with(stager)(event_messages([*old, *new]))

    assert stager.offsets == [[0, 0]]
    assert sorted(row["Id"] for row in stage_rows(staged)) == ["a", "b"]
    assert not list((tmp_path / "held").iterdir())
