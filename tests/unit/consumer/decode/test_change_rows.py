"""One table's decoded events → the sinks' rows: the row ids (no Spark, no database)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

from spanner_cdc.consumer.decode.change_rows import SORT_COLUMNS, TableChanges
from spanner_cdc.consumer.decode.table_version import ColumnTypeChangeError
from spanner_cdc.consumer.sinks.contents import by_table
from spanner_cdc.schemas.events import EventBuilder
from spanner_cdc.schemas.identity import row_id
from spanner_cdc.schemas.wire import HEADER_LENGTH, read_body
from testkit.decoding import decoded_from_events, record_of
from testkit.synthetic import ACCOUNT_COLUMNS, STREAM, ChangeFactory
from tests.unit.consumer.sinks.replica.test_replica_staging import TOPIC, decoded, new_decoder

pytestmark = pytest.mark.unit


def test_a_row_id_is_one_per_key_even_where_python_calls_two_keys_equal() -> None:
    """0.0 and -0.0 are equal in Python, and different keys in Spanner (and in the row id's
    JSON): each key gets its own id, the id ``row_id`` gives it, computed once per key and handed
    to every event of it. NUMERIC keys are decoded at one scale: 1.5 and 1.50 are one key."""
    floats = ChangeFactory(columns=[("K", "FLOAT64", True), ("V", "STRING", False)])
    numbers = ChangeFactory(columns=[("K", "NUMERIC", True), ("V", "STRING", False)])
    written = {  # read apart: a key column is of one type within a batch
        "Floats": [floats.record("INSERT", {"K": k}, {"V": "x"}) for k in (0.0, -0.0, 0.0, 2.5)],
        "Numbers": [numbers.record("INSERT", {"K": k}, {"V": "x"}) for k in ("1.5", "1.50", "2")],
    }
    read = {kind: TableChanges("Accounts", decoded(records)) for kind, records in written.items()}

    keys = {
        kind: [record_of(event)["payload"]["K"] for event in changes.events] for kind, changes in read.items()
    }
    assert {kind: [repr(k) for k in values] for kind, values in keys.items()} == {
        "Floats": ["0.0", "-0.0", "0.0", "2.5"],
        "Numbers": ["Decimal('1.500000000')", "Decimal('1.500000000')", "Decimal('2.000000000')"],
    }
    for kind, changes in read.items():
        assert changes.row_ids.to_pylist() == [row_id("Accounts", {"K": key}) for key in keys[kind]]
    assert [len(set(changes.row_ids.to_pylist())) for changes in read.values()] == [3, 2]


def test_a_table_created_again_with_another_key_has_the_row_ids_of_each_key() -> None:
    first = ChangeFactory(columns=[("Id", "STRING", True), ("N", "INT64", False)])
    again = ChangeFactory(columns=[("Id", "STRING", False), ("N", "INT64", True)])
    events = decoded(
        [first.record("INSERT", {"Id": "1"}, {"N": 7}), again.record("INSERT", {"N": 1}, {"Id": "1"})]
    )

    assert TableChanges("Accounts", events).row_ids.to_pylist() == [
        row_id("Accounts", {"Id": "1"}),
        row_id("Accounts", {"N": 1}),
    ]


def test_a_key_of_several_columns_is_one_key_where_every_column_is_the_same() -> None:
    """Keys of two columns, nulls among them, repeated and interleaved across two table versions:
    each event gets its own key's id, and keys that share one column's value are not confused."""
    old = ChangeFactory(columns=[("A", "INT64", True), ("B", "STRING", True), ("V", "STRING", False)])
    new = ChangeFactory(
        columns=[("A", "INT64", True), ("B", "STRING", True), ("V", "STRING", False), ("W", "STRING", False)]
    )
    keys = [(1, "a"), (1, "b"), (2, "a"), (1, "a"), (None, "a"), (None, "a"), (2, None), (12, "a")]
    events = decoded(
        [
            (old if number % 2 else new).record("INSERT", {"A": a, "B": b}, {"V": "x"})
            for number, (a, b) in enumerate(keys)
        ]
    )

    ids = TableChanges("Accounts", events).row_ids.to_pylist()

    assert ids == [row_id("Accounts", {"A": a, "B": b}) for a, b in keys]
    assert len(set(ids)) == 6


def test_a_key_column_arrow_cannot_compare_is_told_apart_by_its_values() -> None:
    """A schema may name an array column in its key (Spanner never does): its events keep their
    own keys' ids rather than failing the batch."""
    factory = ChangeFactory(columns=[("K", "INT64", True), ("V", "STRING", False)])
    records = [factory.record("INSERT", {"K": [k]}, {"V": "x"}) for k in ("1", "2", "1")]
    for record in records:
        record["column_types"][0]["type"] = {"code": "ARRAY", "array_element_type": {"code": "INT64"}}
    events = decoded(records)

    ids = TableChanges("Accounts", events).row_ids.to_pylist()

    assert ids == [row_id("Accounts", {"K": [k]}) for k in (1, 2, 1)]


def test_a_row_keyed_by_a_timestamp_or_a_date_keeps_the_row_id_it_had() -> None:
    """The gate reads timestamps and dates as numbers; the row id is made from the key as it
    always was — the ``datetime`` and ``date`` fastavro reads — so a row's id does not change
    with the consumer's version."""
    factory = ChangeFactory(
        columns=[
            ("At", "TIMESTAMP", True),
            ("Day", "DATE", True),
            ("Ms", "TIMESTAMP", True),
            ("V", "STRING", False),
        ]
    )
    keys = {"At": "2025-06-15T15:06:40.000001Z", "Day": "2025-06-15", "Ms": "0001-01-01T00:00:00Z"}
    [event] = decoded([factory.record("INSERT", keys, {"V": "x"})])

    assert [type(record_of(event)["payload"][name]) for name in ("At", "Day", "Ms")] == [int, int, int]
    assert TableChanges("Accounts", [event]).row_ids.to_pylist() == [
        row_id(
            "Accounts",
            {
                "At": dt.datetime(2025, 6, 15, 15, 6, 40, 1, tzinfo=dt.UTC),
                "Day": dt.date(2025, 6, 15),
                "Ms": dt.datetime(1, 1, 1, tzinfo=dt.UTC),
            },
        )
    ]


def test_a_row_id_is_made_from_the_key_its_record_holds_whichever_way_the_key_is_read() -> None:
    """Keys are read from the columns the events were read into, and make the ids their records'
    values make: bytes, booleans, integers, NUMERIC (the same ``Decimal``), TIMESTAMP and DATE
    (the numbers written); a key column Spanner changed from STRING to BYTES within the batch is
    BYTES in the batch's columns, and its STRING events keep the id of their text."""
    typed = ChangeFactory(columns=[("Raw", "BYTES", True), ("Yes", "BOOL", True), ("N", "INT64", True)])
    keys = [("AAE=", True, "-9"), ("/w==", False, "9223372036854775807"), ("AAE=", True, "-9")]
    events = decoded([typed.record("INSERT", {"Raw": r, "Yes": y, "N": n}, {}) for r, y, n in keys])
    expected = [row_id("Accounts", record_of(e)["payload"]) for e in sorted(events, key=lambda e: e.sort_key)]
    assert TableChanges("Accounts", events).row_ids.to_pylist() == expected
    assert [type(v) for v in record_of(events[0])["payload"].values()] == [bytes, bool, int]

    calendar = ChangeFactory(
        columns=[("Num", "NUMERIC", True), ("At", "TIMESTAMP", True), ("Day", "DATE", True)]
    )
    calendar_keys = [
        ("0", "2026-11-30T05:00:00.123456Z", "2024-02-29"),
        ("-1.5", "0001-01-01T00:00:00Z", "9999-12-31"),
        ("99999999999999999999999999999.999999999", "2026-11-30T05:00:00Z", "1970-01-01"),
    ]
    events = decoded(
        [calendar.record("INSERT", {"Num": n, "At": a, "Day": d}, {}) for n, a, d in calendar_keys]
    )
    # hashed as fastavro reads them: Decimal, datetime and date
    records = [
        read_body(e.version.writer, e.value, HEADER_LENGTH) for e in sorted(events, key=lambda e: e.sort_key)
    ]
    expected = [row_id("Accounts", record["payload"]) for record in records]
    assert TableChanges("Accounts", events).row_ids.to_pylist() == expected

    text = ChangeFactory(columns=[("Id", "STRING", True), ("V", "STRING", False)])
    raw = ChangeFactory(columns=[("Id", "BYTES", True), ("V", "STRING", False)])
    events = decoded([text.record("INSERT", {"Id": "é"}, {}), raw.record("UPDATE", {"Id": "w6k="}, {})])
    assert TableChanges("Accounts", events).row_ids.to_pylist() == [
        row_id("Accounts", {"Id": "é"}),
        row_id("Accounts", {"Id": "é".encode()}),
    ]


def test_the_envelope_columns_of_two_table_versions_in_their_events_order() -> None:
    """Events of a table before and after a column was added, interleaved in commit order: each
    changelog column and replica stage flag is the event's own, in sort order; ``old_values`` by
    column name, null for a column the event's version lacks and for an event without them."""
    before = ChangeFactory(capture="NEW_ROW_AND_OLD_VALUES")
    after = ChangeFactory(
        columns=[*ACCOUNT_COLUMNS, ("Added", "STRING", False)], capture="NEW_ROW_AND_OLD_VALUES"
    )
    events = decoded(
        [
            before.record("INSERT", {"Id": "a"}, {"Balance": "1", "Note": "x"}),
            after.record("UPDATE", {"Id": "a"}, {"Added": "y"}, old_values={"Added": None}),
            before.record("UPDATE", {"Id": "a"}, {"Balance": "2"}, old_values={"Balance": "1", "Note": "x"}),
            after.record("DELETE", {"Id": "a"}, {}, old_values={"Balance": "2", "Note": "x", "Added": "y"}),
        ]
    )
    changes = TableChanges("Accounts", list(reversed(events)))
    changelog = changes.changelog().to_pydict()
    assert changelog["change$type"] == ["INSERT", "UPDATE", "UPDATE", "DELETE"]
    assert changelog["Added"] == [None, "y", None, "y"]  # a delete carries the row it deleted
    assert changelog["envelope$old_values"] == [
        None,
        {"Id": "a", "Balance": None, "Note": None, "Added": None},
        {"Id": "a", "Balance": 1, "Note": "x", "Added": None},
        {"Id": "a", "Balance": 2, "Note": "x", "Added": "y"},
    ]
    assert [m["change_type"] for m in changelog["envelope$source_metadata"]] == changelog["change$type"]
    assert changelog["envelope$uuid"] == [record_of(e)["uuid"] for e in events]
    stage = changes.replica_stage()
    assert stage.column("cdc$is_delete").to_pylist() == [False, False, False, True]
    assert stage.column("cdc$is_insert").to_pylist() == [True, False, False, False]
    assert stage.column("cdc$commit_timestamp").type == pa.timestamp("us", tz="UTC")


def test_the_sort_key_columns_are_each_events_sort_keys_a_backfill_rows_too() -> None:
    """The changelog's ``envelope$sort_keys`` and the replica's order columns hold each event's
    own sort keys, in the events' order — also a backfill row's, whose transaction id and record
    sequence are null in ``source_metadata`` and "" in its sort keys."""
    factory = ChangeFactory()
    [change] = factory.events(factory.record("UPDATE", {"Id": "a"}, {"Balance": "2"}))
    [snapshot] = EventBuilder(stream_name=STREAM, database="d").build_snapshot_rows(
        change.table,
        ["Id", "Balance", "Note"],
        [("b", "1", "x")],
        snapshot_micros=change.value["sort_keys"][0] - 1,
        read_timestamp_millis=0,
    )
    events = decoded_from_events(new_decoder(), [change, snapshot], TOPIC)
    assert record_of(events[1])["source_metadata"]["tx_id"] is None
    changes = TableChanges("Accounts", events)
    expected = [event.sort_key for event in changes.events]
    assert expected[0][1:3] == ("", "")  # the backfill row sorts first
    changelog = changes.changelog().column("envelope$sort_keys").to_pylist()
    assert [tuple(keys.values()) for keys in changelog] == expected
    stage = changes.replica_stage().select(list(SORT_COLUMNS)).to_pylist()
    assert [tuple(row.values()) for row in stage] == expected


def test_a_delete_sets_no_column_though_its_changed_columns_name_its_old_values() -> None:
    """``set$`` flags: what each insert and update named in ``changed_columns`` (under its own
    version's field names); a delete's changed_columns name the old values it carries, and set
    nothing."""
    factory = ChangeFactory(capture="NEW_ROW_AND_OLD_VALUES")
    events = decoded(
        [
            factory.record("INSERT", {"Id": "a"}, {"Balance": "1", "Note": "x"}),
            factory.record("UPDATE", {"Id": "a"}, {"Note": "y"}, old_values={"Note": "x"}),
            factory.record("DELETE", {"Id": "a"}, {}, old_values={"Balance": "1", "Note": "y"}),
        ]
    )
    assert record_of(events[2])["source_metadata"]["changed_columns"], "the delete names its old values"

    stage = TableChanges("Accounts", events).replica_stage()

    assert stage.column("set$Balance").to_pylist() == [True, False, False]
    assert stage.column("set$Note").to_pylist() == [True, True, False]


def _text_then_bytes(kind: str) -> list[dict[str, Any]]:
    """Events of ``Note`` (and ``Tags``, an array of it) as STRING, then as BYTES after Spanner's
    ``ALTER COLUMN``, then STRING again; ``kind`` is which comes first."""
    other = "BYTES" if kind == "STRING" else "STRING"
    spelled = {"STRING": ("x", ["é", None]), "BYTES": ("/w==", ["AA==", None])}  # base64: ff, 00
    records = []
    for step, code in enumerate((kind, other, kind)):
        factory = ChangeFactory(
            columns=[("Id", "STRING", True), ("Note", code, False), ("Tags", code, False)]
        )
        note, tags = spelled[code]
        record = factory.record("INSERT", {"Id": str(step)}, {"Note": note, "Tags": tags})
        record["column_types"][2]["type"] = {"code": "ARRAY", "array_element_type": {"code": code}}
        records.append(record)
    return records


@pytest.mark.parametrize("kind", ["STRING", "BYTES"])
def test_a_column_spanner_changed_between_string_and_bytes_is_bytes_in_a_batch_of_both(kind: str) -> None:
    """Spanner changes a column between STRING and BYTES in place. A batch holding events of both
    types has one column of BYTES, a text as its UTF-8 (every text is bytes; not every value of
    bytes is a text), whichever type came first."""
    changes = TableChanges("Accounts", decoded(_text_then_bytes(kind)))
    text, data = (b"x", [b"\xc3\xa9", None]), (b"\xff", [b"\x00", None])
    expected = [text, data, text] if kind == "STRING" else [data, text, data]

    for rows in (changes.changelog(), changes.replica_stage()):
        assert rows.schema.field("Note").type == pa.binary()
        assert rows.schema.field("Tags").type == pa.list_(pa.binary())
        assert list(zip(rows.column("Note").to_pylist(), rows.column("Tags").to_pylist(), strict=True)) == [
            (note, tags) for note, tags in expected
        ]


def test_a_column_that_changes_to_a_type_it_cannot_become_is_a_table_of_its_own() -> None:
    """INT64 to STRING is no change Spanner makes in place (a table dropped and created again
    under its key, or a hostile schema): one table's changes cannot hold both (the error names
    table, column and both types), so the sinks take them as two parts, split where the type
    changes, in sort-key order."""
    before = ChangeFactory(columns=[("Id", "STRING", True), ("N", "INT64", False)])
    after = ChangeFactory(columns=[("Id", "STRING", True), ("N", "STRING", False)])
    events = decoded(
        [before.record("INSERT", {"Id": "a"}, {"N": "1"}), after.record("INSERT", {"Id": "b"}, {"N": "x"})]
    )

    with pytest.raises(
        ColumnTypeChangeError, match="table 'Accounts', column 'N' changes type from \"long\" to"
    ):
        TableChanges("Accounts", events).changelog()
    assert [[e.offset for e in part.events] for part in by_table(events)] == [[0], [1]]
