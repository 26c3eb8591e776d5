"""A table's schema changes keep its registry subjects compatible under the registry's default
rule, BACKWARD: a reader with the new schema reads what the old one wrote. Checked by Avro's own
schema resolution (fastavro), the rule the registry's check applies."""

from __future__ import annotations

import io
from typing import Any, cast

import fastavro

from spanner_cdc.schemas.events import Event
from testkit.synthetic import ACCOUNT_COLUMNS, ChangeFactory


def event(columns: tuple[tuple[str, str, bool], ...], values: dict[str, Any]) -> Event:
    factory = ChangeFactory(columns=columns)
    return factory.events(factory.record("INSERT", {"Id": "a"}, values))[0]


def read_as(new: dict[str, Any], old: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(old), record)
    buffer.seek(0)
    writer, reader = fastavro.parse_schema(old), fastavro.parse_schema(new)
    return cast(dict[str, Any], fastavro.schemaless_reader(buffer, writer, reader))


def test_a_column_added_or_dropped_reads_old_events_with_the_new_schema() -> None:
    before = event(ACCOUNT_COLUMNS, {"Balance": "1", "Note": "x"})
    added = event((*ACCOUNT_COLUMNS, ("Extra", "INT64", False)), {"Balance": "1", "Note": "x", "Extra": "3"})
    dropped = event(ACCOUNT_COLUMNS[:2], {"Balance": "1"})

    as_added = read_as(added.table.event_schema, before.table.event_schema, before.value)
    assert as_added["payload"] == {**before.value["payload"], "Extra": None}
    as_dropped = read_as(dropped.table.event_schema, before.table.event_schema, before.value)
    assert as_dropped["payload"] == {"Id": "a", "Balance": 1}
    assert read_as(added.table.key_schema, before.table.key_schema, before.key) == before.key
