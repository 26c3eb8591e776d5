"""spanner_cdc.schemas as a third-party reader sees it: every public name documented, and an
event and a watermark read back with those names alone."""

from __future__ import annotations

import inspect

import pytest

import spanner_cdc.schemas as contract
from spanner_cdc.schemas.watermark import WATERMARK_SCHEMA
from testkit.synthetic import STREAM, ChangeFactory

pytestmark = pytest.mark.unit


def test_every_public_name_is_there_and_documented() -> None:
    for name in contract.__all__:
        value = getattr(contract, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert (value.__doc__ or "").strip(), f"{name} has no docstring"


def test_an_event_and_a_watermark_read_back_with_the_public_names() -> None:
    factory = ChangeFactory()
    [event] = factory.events(factory.record("INSERT", {"Id": "a"}, {"Balance": "5"}))
    store = contract.SchemaStore()
    writer = store.add(event.table.event_schema)
    message = contract.encode(writer, event.value)
    watermark = contract.Watermark(STREAM, 1_750_000_000_000_000, {"P.Accounts": 1})
    store.add(WATERMARK_SCHEMA)  # published on the schema topic like every event schema

    assert not contract.is_registry_framed(message)
    read = store.schemas[contract.read_fingerprint(message)]
    assert not contract.is_watermark(read)
    record = contract.read_body(read, message, contract.body_start(message))
    assert record["payload"]["Id"] == "a" and record["uuid"] == event.value["uuid"]
    assert record["sort_keys"][0] == contract.parse_timestamp_micros(
        contract.format_timestamp_micros(record["sort_keys"][0])
    )

    marked = watermark.encode(0)
    assert contract.is_watermark(store.schemas[contract.read_fingerprint(marked)])
