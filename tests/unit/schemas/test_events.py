"""Data change records → events: envelope, metadata and payload per mod and capture type."""

from __future__ import annotations

from typing import Any

import pytest

from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.events import (
    ENVELOPE_FIELDS,
    METADATA_FIELDS,
    READ_METHOD_BACKFILL,
    READ_METHOD_CHANGE_STREAMS,
    READ_METHOD_POLL,
    Event,
    EventBuilder,
)
from spanner_cdc.schemas.identity import backfill_uuid, polled_uuid
from spanner_cdc.schemas.records import DataChangeRecord, records_from_json
from spanner_cdc.schemas.spanner_types import SpannerType
from spanner_cdc.schemas.table import Column, TableSchema, load_avsc
from spanner_cdc.schemas.timestamps import parse_timestamp_micros
from testkit.records import STREAM_NAME, account_transfer_records

pytestmark = pytest.mark.unit

COLUMNS = account_transfer_records()[0]["column_types"]
COMMIT = "2024-05-01T10:00:00.000001Z"


def build(
    mod_type: str, capture: str, mod: dict[str, Any], commit_timestamp_columns: frozenset[str] = frozenset()
) -> Event:
    record = DataChangeRecord.from_json(
        {
            **account_transfer_records()[0],
            "commit_timestamp": COMMIT,
            "mod_type": mod_type,
            "value_capture_type": capture,
            "mods": [mod],
        }
    )
    table = TableSchema.from_column_types(record.table_name, record.column_types, commit_timestamp_columns)
    [event] = EventBuilder(STREAM_NAME, "bank").build(record, "token-7", 1_714_557_600_500, table)
    return event


def test_an_event_s_fields_are_in_the_envelope_s_order() -> None:
    envelope = load_avsc("envelope.avsc")["fields"]
    assert tuple(field["name"] for field in envelope) == ENVELOPE_FIELDS
    [metadata] = [field["type"] for field in envelope if field["name"] == "source_metadata"]
    assert tuple(field["name"] for field in metadata["fields"]) == METADATA_FIELDS


def test_seed_transfer_becomes_two_events_of_one_transaction() -> None:
    builder = EventBuilder(STREAM_NAME, "bank")
    events = [
        event
        for record in account_transfer_records()
        for event in builder.build(DataChangeRecord.from_json(record), "partition-a", 1_664_281_800_200)
    ]
    assert [e.key for e in events] == [{"AccountId": "Id1"}, {"AccountId": "Id2"}]
    first, second = (e.value for e in events)
    assert first["uuid"] != second["uuid"]
    assert first["source_timestamp"] == 1_664_281_800_123
    assert first["read_method"] == READ_METHOD_CHANGE_STREAMS and first["object"] == "AccountBalance"
    assert first["sort_keys"] == [1_664_281_800_123_456, "6329047911", "00000000", 0]
    assert second["sort_keys"] == [1_664_281_800_123_456, "6329047911", "00000001", 0]
    metadata = first["source_metadata"]
    assert metadata["tx_id"] == "6329047911" and metadata["number_of_records_in_transaction"] == 2
    assert metadata["number_of_partitions_in_transaction"] == 2
    assert metadata["number_of_mods_in_record"] == 1 and metadata["primary_keys"] == ["AccountId"]
    assert first["payload"] == {"AccountId": "Id1", "LastUpdate": 1_664_281_800_123_456, "Balance": 1000}
    assert metadata["old_values"] == {
        "AccountId": "Id1",
        "LastUpdate": 1_664_191_680_189_413,
        "Balance": 1500,
    }
    assert events[0].table is events[1].table, "one TableSchema per table version"


def test_insert_carries_the_row() -> None:
    event = build(
        "INSERT", "NEW_ROW", {"keys": {"AccountId": "A"}, "new_values": {"Balance": "5", "LastUpdate": None}}
    )
    assert event.value["payload"] == {"AccountId": "A", "Balance": 5, "LastUpdate": None}
    assert event.value["source_metadata"]["changed_columns"] == ["Balance", "LastUpdate"]
    assert event.value["source_metadata"]["is_deleted"] is False
    assert event.value["source_metadata"]["old_values"] is None


@pytest.mark.parametrize("capture", ["NEW_VALUES", "OLD_AND_NEW_VALUES"])
def test_partial_update_carries_only_changed_columns(capture: str) -> None:
    old = {"Balance": "1"} if capture == "OLD_AND_NEW_VALUES" else {}
    event = build(
        "UPDATE", capture, {"keys": {"AccountId": "A"}, "new_values": {"Balance": "2"}, "old_values": old}
    )
    assert event.value["payload"] == {"AccountId": "A", "Balance": 2}
    assert event.value["source_metadata"]["changed_columns"] == ["Balance"]
    expected_old = {"AccountId": "A", "Balance": 1} if old else None
    assert event.value["source_metadata"]["old_values"] == expected_old


@pytest.mark.parametrize("capture", ["NEW_ROW", "NEW_ROW_AND_OLD_VALUES"])
def test_full_row_update_carries_the_whole_row(capture: str) -> None:
    old = {"Balance": "1"} if capture == "NEW_ROW_AND_OLD_VALUES" else {}
    new = {"Balance": "2", "LastUpdate": COMMIT}
    event = build("UPDATE", capture, {"keys": {"AccountId": "A"}, "new_values": new, "old_values": old})
    assert event.value["payload"] == {
        "AccountId": "A",
        "Balance": 2,
        "LastUpdate": parse_timestamp_micros(COMMIT),
    }
    assert event.value["source_metadata"]["changed_columns"] == ["Balance", "LastUpdate"]


@pytest.mark.parametrize(
    ("capture", "old"),
    [("OLD_AND_NEW_VALUES", {"Balance": "9", "LastUpdate": None}), ("NEW_ROW", {}), ("NEW_VALUES", {})],
)
def test_delete_carries_keys_and_captured_old_values(capture: str, old: dict[str, Any]) -> None:
    event = build("DELETE", capture, {"keys": {"AccountId": "A"}, "new_values": {}, "old_values": old})
    metadata = event.value["source_metadata"]
    assert metadata["is_deleted"] is True and metadata["change_type"] == "DELETE"
    expected = {"AccountId": "A", **({"Balance": 9, "LastUpdate": None} if old else {})}
    assert event.value["payload"] == expected
    assert metadata["changed_columns"] == sorted(old)


def test_pending_commit_timestamp_column_gets_the_commit_timestamp() -> None:
    mod = {"keys": {"AccountId": "A"}, "new_values": {"LastUpdate": "9999-12-31T23:59:59Z", "Balance": "3"}}
    event = build("INSERT", "NEW_ROW", mod, commit_timestamp_columns=frozenset({"LastUpdate"}))
    assert event.value["payload"]["LastUpdate"] == parse_timestamp_micros(COMMIT)
    untouched = build("INSERT", "NEW_ROW", mod)
    assert untouched.value["payload"]["LastUpdate"] == parse_timestamp_micros("9999-12-31T23:59:59Z")


def test_named_schema_table_splits_schema_and_table() -> None:
    record = {**account_transfer_records()[0], "table_name": "finance.AccountBalance"}
    [event] = EventBuilder(STREAM_NAME, "bank").build(DataChangeRecord.from_json(record), None, 0)
    assert event.value["object"] == "finance.AccountBalance"
    assert event.value["source_metadata"]["schema"] == "finance"
    assert event.table.namespace == "spanner_cdc.finance.AccountBalance"


def test_each_table_version_is_built_once_and_found_by_its_columns() -> None:
    builder = EventBuilder(STREAM_NAME, "bank")
    first = builder.table_schema("T", COLUMNS)
    assert builder.table_schema("T", [dict(c) for c in COLUMNS]) is first  # an equal list, not the same
    assert builder.table_schema("T", tuple(COLUMNS)) is first
    added = [*COLUMNS, {"name": "Note", "type": {"code": "STRING"}, "is_primary_key": False,
                        "ordinal_position": len(COLUMNS) + 1}]  # fmt: skip
    second = builder.table_schema("T", added)
    assert second is not first and "Note" in second.converters
    assert builder.table_schema("T", COLUMNS) is first and builder.table_schema("T", added) is second
    assert builder.table_schema("U", COLUMNS) is not first


def test_value_for_unknown_column_is_an_error() -> None:
    with pytest.raises(ContractError, match="unknown column 'Nope'"):
        build("INSERT", "NEW_ROW", {"keys": {"AccountId": "A"}, "new_values": {"Nope": "1"}})


def test_unknown_mod_type_is_an_error() -> None:
    with pytest.raises(ContractError, match="mod_type 'UPSERT'"):
        DataChangeRecord.from_json({**account_transfer_records()[0], "mod_type": "UPSERT"})


@pytest.mark.parametrize("kind", ["partition_start_record", "partition_event_record", "something_new"])
def test_a_record_kind_the_producer_does_not_read_is_an_error_not_skipped(kind: str) -> None:
    """Skipped, a partition end record would leave its successors unread."""
    heartbeat = {"heartbeat_record": [{"timestamp": "2026-11-25T00:00:00Z"}]}
    assert len(list(records_from_json({**heartbeat, kind: []}))) == 1  # an empty field is nothing
    with pytest.raises(ContractError, match=f"kind '{kind}'.*MUTABLE_KEY_RANGE"):
        list(records_from_json({**heartbeat, kind: [{"partition_token": "t"}]}))


def test_nested_json_given_as_text_is_accepted() -> None:
    record = {**account_transfer_records()[0]}
    record["mods"] = [
        '{"keys": {"AccountId": "Z"}, "new_values": "{\\"Balance\\": \\"4\\"}", "old_values": null}'
    ]
    [event] = EventBuilder(STREAM_NAME, "bank").build(DataChangeRecord.from_json(record), None, 0)
    assert event.value["payload"] == {"AccountId": "Z", "Balance": 4}


ORDERS = TableSchema(
    "sales.Orders",
    [
        Column("Id", SpannerType("INT64"), True, 1),
        Column("Name-x", SpannerType("STRING"), False, 2),
        Column("At", SpannerType("TIMESTAMP"), False, 3),
    ],
)
AT = "2024-05-01T10:00:00.000001Z"


def whole_row_facts(event: Event) -> dict[str, Any]:
    """What a whole-row event's envelope says beyond its key and payload."""
    value = event.value
    metadata = value.pop("source_metadata")
    value.pop("payload")
    return {**value, **{name: metadata[name] for name in METADATA_FIELDS}}


def test_backfill_rows_are_inserts_at_the_snapshot_with_uuids_of_the_keys_as_read() -> None:
    builder = EventBuilder(STREAM_NAME, "shop")
    rows = [("42", "a", AT), ("-7", None, None)]
    events = builder.build_snapshot_rows(
        ORDERS, ["Id", "Name-x", "At"], rows, snapshot_micros=5_000_123, read_timestamp_millis=9
    )
    assert [(e.key, e.value["payload"]) for e in events] == [
        ({"Id": 42}, {"Id": 42, "Name_x": "a", "At": parse_timestamp_micros(AT)}),
        ({"Id": -7}, {"Id": -7, "Name_x": None, "At": None}),
    ]
    assert whole_row_facts(events[0]) == {
        "uuid": backfill_uuid(STREAM_NAME, 5_000_123, "sales.Orders", {"Id": "42"}),
        "read_timestamp": 9,
        "source_timestamp": 5_000,
        "object": "sales.Orders",
        "read_method": READ_METHOD_BACKFILL,
        "stream_name": STREAM_NAME,
        "schema_key": ORDERS.schema_key,
        "sort_keys": [5_000_123, "", "", 0],
        "database": "shop",
        "schema": "sales",
        "table": "sales.Orders",
        "change_type": "INSERT",
        "is_deleted": False,
        "primary_keys": ["Id"],
        "tx_id": None,
        "commit_timestamp": 5_000_123,
        "record_sequence": None,
        "mod_index": 0,
        "partition_token": None,
        "value_capture_type": None,
        "number_of_records_in_transaction": None,
        "number_of_partitions_in_transaction": None,
        "is_last_record_in_transaction_in_partition": None,
        "transaction_tag": None,
        "is_system_transaction": None,
        "number_of_mods_in_record": None,
        "changed_columns": ["At", "Name_x"],
        "old_values": None,
    }
    assert events[1].uuid == backfill_uuid(STREAM_NAME, 5_000_123, "sales.Orders", {"Id": "-7"})


def test_polled_rows_carry_their_own_stamps_and_change_types_and_name_the_columns_read() -> None:
    builder = EventBuilder(STREAM_NAME, "shop", default_schema="public")
    table = TableSchema("Orders", ORDERS.columns)
    events = builder.build_polled_rows(
        table,
        ["Name-x", "Id"],
        [("a", "1"), ("b", "2")],
        stamps_micros=[7_000_001, 8_000_002],
        existed_before=[True, False],
        read_timestamp_millis=9,
    )
    facts = [whole_row_facts(e) for e in events]
    assert [e.key for e in events] == [{"Id": 1}, {"Id": 2}]
    assert [e.value["payload"] for e in events] == [{"Name_x": "a", "Id": 1}, {"Name_x": "b", "Id": 2}]
    assert [f["uuid"] for f in facts] == [
        polled_uuid(STREAM_NAME, 7_000_001, "Orders", {"Id": "1"}),
        polled_uuid(STREAM_NAME, 8_000_002, "Orders", {"Id": "2"}),
    ]
    assert [(f["change_type"], f["commit_timestamp"], f["sort_keys"]) for f in facts] == [
        ("UPDATE", 7_000_001, [7_000_001, "", "", 0]),
        ("INSERT", 8_000_002, [8_000_002, "", "", 0]),
    ]
    assert [(f["read_method"], f["schema"], f["source_timestamp"]) for f in facts] == [
        (READ_METHOD_POLL, "public", 7_000),
        (READ_METHOD_POLL, "public", 8_000),
    ]
    assert [f["changed_columns"] for f in facts] == [["Name_x"], ["Name_x"]]
    assert (
        builder.build_polled_rows(
            table, ["Id"], [], stamps_micros=[], existed_before=[], read_timestamp_millis=9
        )
        == []
    )
