"""``--payload whole-row`` against the real emulator and broker: every capture type gives
whole rows, read from Spanner where the change record lacks them."""

from __future__ import annotations

import asyncio

import pytest

from spanner_cdc.stack import EmbeddedStack
from tests.integration.test_producer import ALL, CAPTURE_TYPES, PEN, write_insert_update_delete
from tests.support.churn import produce_until_end, producer_config
from tests.support.kafka_read import Received, read_events

pytestmark = pytest.mark.integration

#: After the update and before the delete, the row is PEN with Qty 2.
UPDATED = {**PEN, "Qty": 2}


@pytest.fixture(scope="module")
def whole_row_events(stack: EmbeddedStack) -> dict[str, list[Received]]:
    out = {}
    for pair in (CAPTURE_TYPES[:2], CAPTURE_TYPES[2:]):
        streams = {capture: f"Whole_{capture}" for capture in pair}
        database, start, end = write_insert_update_delete(stack.endpoint("spanner"), streams)
        for capture, stream in streams.items():
            config = producer_config(
                stack.endpoint("spanner"), stack.endpoint("kafka"), database, stream,
                start_timestamp_micros=start, end_timestamp_micros=end, payload="whole-row",
            )  # fmt: skip
            asyncio.run(produce_until_end(config))
            out[capture] = read_events(stack.endpoint("kafka"), config.topic_prefix, "Items")
    return out


@pytest.mark.parametrize("capture", CAPTURE_TYPES)
def test_every_capture_type_gives_whole_rows(
    whole_row_events: dict[str, list[Received]], capture: str
) -> None:
    """The UPDATE's payload is the row the transaction left, the DELETE's payload and old
    values the row it deleted — also where the change record held only the changed columns or
    only the key."""
    insert, update, delete = (e.value for e in whole_row_events[capture])
    assert insert["payload"] == PEN
    assert update["payload"] == UPDATED
    assert update["source_metadata"]["changed_columns"] == ALL
    assert delete["payload"] == UPDATED and delete["source_metadata"]["is_deleted"] is True
    assert delete["source_metadata"]["old_values"] == UPDATED
    assert delete["source_metadata"]["changed_columns"] == ALL
    assert all(e["source_metadata"]["value_capture_type"] == capture for e in (insert, update, delete))


def test_a_stream_without_whole_rows_is_named_at_start(
    stack: EmbeddedStack, caplog: pytest.LogCaptureFixture
) -> None:
    """Without --payload whole-row, a capture type that cannot give whole rows is one warning."""
    database, start, end = write_insert_update_delete(stack.endpoint("spanner"), {"NEW_VALUES": "Partial"})
    config = producer_config(
        stack.endpoint("spanner"), stack.endpoint("kafka"), database, "Partial",
        start_timestamp_micros=start, end_timestamp_micros=end,
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="spanner_cdc"):
        asyncio.run(produce_until_end(config))
    warnings = [r.getMessage() for r in caplog.records if "--payload whole-row" in r.getMessage()]
    assert warnings == [
        "change stream Partial: with value_capture_type NEW_VALUES an UPDATE carries only the changed "
        "columns and a DELETE carries only the key; --payload whole-row reads the rest"
    ]
