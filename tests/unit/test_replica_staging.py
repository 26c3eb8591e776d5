"""The replica's stage rows as the tasks stage them and the driver reads them back: no Spark, no
database. Events are decoded from the bytes the producer would write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spanner_cdc.consumer.change_rows import SET_PREFIX
from spanner_cdc.consumer.decode import BatchDecoder, BrokerPartitions
from spanner_cdc.consumer.decoded import DecodedEvent
from spanner_cdc.consumer.schema_topic import SchemaTopic
from spanner_cdc.consumer.sinks.changelog import COORDINATES
from spanner_cdc.consumer.sinks.replica.staged import (
    ReplicaStaging,
    combined,
    event_messages,
    staged_parts,
)
from spanner_cdc.schemas.topics import Topics
from testkit.decoding import decoded_events, event_rows
from testkit.synthetic import ACCOUNT_COLUMNS, ChangeFactory

pytestmark = pytest.mark.unit
TOPIC = "P.Accounts"


def decoded(records: list[dict[str, Any]], first_offset: int = 0) -> list[DecodedEvent]:
    decoder = BatchDecoder(SchemaTopic({}, "P"), Topics("P"), BrokerPartitions(lambda: {TOPIC: 1}))
    return decoded_events(decoder, records, TOPIC, first_offset=first_offset)


def test_two_tasks_parts_of_two_table_versions_combine_into_one_with_every_column(tmp_path: Path) -> None:
    """Task 0 read the table before a column was added, task 1 after: the driver reads both
    files back and merges one part, the new column null and not set in the older rows."""
    old, new = ChangeFactory(), ChangeFactory(columns=[*ACCOUNT_COLUMNS, ("Added", "STRING", False)])
    before = decoded([old.record("INSERT", {"Id": "a"}, {"Balance": "1", "Note": "x"})])
    after = decoded([new.record("UPDATE", {"Id": "a"}, {"Added": "y"})], first_offset=1)
    staging = ReplicaStaging(tmp_path / "batch")
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
    factory = ChangeFactory()
    events = decoded([factory.record("INSERT", {"Id": key}, {"Balance": "1"}) for key in "abcde"])
    [part] = staged_parts(events)
    kept = event_rows([events[3], events[0], events[4]])

    assert part.among(kept).rows.column("Id").to_pylist() == ["a", "d", "e"]
    assert part.among(kept.slice(0, 0)).rows.num_rows == 0
