"""JSON events (``--format json``) stand for exactly the Avro events they replace, over generated
events of every type; their table-version records cannot be forged."""

from __future__ import annotations

import json
import random

import pytest

from spanner_cdc.consumer.decode.gate import parsed_schema
from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.events import EventBuilder
from spanner_cdc.schemas.json_events import (
    avro_event,
    avro_watermark,
    event_document,
    key_document,
    version_from_record,
    version_record,
    watermark_document,
)
from spanner_cdc.schemas.timestamps import format_timestamp_micros
from spanner_cdc.schemas.watermark import WATERMARK_WRITER, Watermark
from spanner_cdc.schemas.wire import encode
from testkit.records import STREAM_NAME
from tests.unit.schemas.test_avro_writer import GOOGLE_SQL, POSTGRESQL, RECORDS, _record

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("dialect", [GOOGLE_SQL, POSTGRESQL], ids=["googlesql", "postgresql"])
def test_a_json_event_reads_back_as_the_avro_event_byte_for_byte(dialect: tuple[str, ...]) -> None:
    """Every column type (arrays with null elements, NaN, ±Infinity, NUMERIC 38/9, odd names),
    every capture and mod type: document → Avro record encodes to the bytes of the event's own
    record; the key likewise; the document names columns as Spanner does."""
    rng = random.Random(20261125)
    builder = EventBuilder(STREAM_NAME, "bank")
    compared = 0
    for index in range(RECORDS):
        for event in builder.build(_record(rng, index, dialect), "token-1", rng.randint(0, 2**41)):
            writer = parsed_schema(json.dumps(event.table.event_schema))
            document = json.loads(event_document(event))
            assert encode(writer, avro_event(document, event.table)) == encode(writer, event.value)
            key_writer = parsed_schema(json.dumps(event.table.key_schema))
            key = event.table.convert_row(json.loads(key_document(event)))
            assert encode(key_writer, key) == encode(key_writer, event.key)
            names = {c.avro_name: c.name for c in event.table.columns}
            assert set(document["payload"]) == {names[field] for field in event.value["payload"]}
            assert document["read_timestamp"].endswith("Z") and len(document["read_timestamp"]) == 24
            assert isinstance(document["payload"]["Id"], str)  # INT64 as decimal text
            compared += 1
    assert compared > RECORDS


def test_a_watermark_reads_back_as_the_avro_record() -> None:
    watermark = Watermark(STREAM_NAME, 1_795_000_000_000_001, {"a": 3, "b": 1})
    document = json.loads(watermark_document(watermark, 1_795_000_000_123))
    assert document["watermark"] == format_timestamp_micros(1_795_000_000_000_001)
    record = avro_watermark(document)
    assert encode(WATERMARK_WRITER, record) == watermark.encode(1_795_000_000_123)


def test_a_table_version_record_is_checked_against_its_key() -> None:
    rng = random.Random(7)
    event = EventBuilder(STREAM_NAME, "bank").build(_record(rng, 1, GOOGLE_SQL), None, 1)[0]
    key, value = version_record(event.table)
    version = version_from_record(key.decode(), value)
    assert version.schema_key == event.table.schema_key
    assert version.event_schema == event.table.event_schema
    document = json.loads(value)
    document["columns"][2][1] = {"code": "BYTES"}  # another type under the same schema_key
    with pytest.raises(ContractError, match="do not hash"):
        version_from_record(key.decode(), json.dumps(document).encode())
    other = key.decode().rsplit("/", 1)[0] + "/Other"
    with pytest.raises(ContractError, match="is of table"):
        version_from_record(other, value)
