"""A table's key and name come from what the producer published, not from each event: one forged
event must not re-key a table (taken for a table dropped and created again, that emptied its
replica) or write another table, in either format, through either gate."""

from __future__ import annotations

import copy
from typing import Any

import pyarrow as pa
import pytest

from spanner_cdc.consumer.decode.decoded import DecodedBatch, read_columns
from spanner_cdc.consumer.decode.driver import BatchDecoder, BrokerPartitions
from spanner_cdc.consumer.decode.gate import MessageReader
from spanner_cdc.consumer.decode.schema_topic import SchemaTopic
from spanner_cdc.schemas.events import Event
from spanner_cdc.schemas.json_events import event_document, key_document, version_record
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.wire import WriterSchema, encode
from testkit.synthetic import ChangeFactory, with_value

pytestmark = pytest.mark.unit
TOPICS = Topics("P")


def published_decoder(events: list[Event]) -> BatchDecoder:
    """A decoder whose schema topic holds what the producer publishes for ``events``' tables:
    the event and key schemas, and the JSON table versions."""
    decoder = BatchDecoder(SchemaTopic({}, "P"), TOPICS, BrokerPartitions(lambda: {}))
    for event in events:
        for schema in (event.table.event_schema, event.table.key_schema):
            writer = WriterSchema.from_schema(schema)
            decoder.schemas.accept(writer.fingerprint_hex.encode(), writer.schema_json.encode())
        decoder.schemas.accept(*version_record(event.table))
    return decoder


def message(event: Event, json_format: bool, **changes: Any) -> tuple[bytes, bytes]:
    """``event`` as the producer sends it (key, value), with ``source_metadata`` or top-level
    fields changed as given."""
    forged = copy.deepcopy(event.value)
    for name, value in changes.items():
        (forged["source_metadata"] if name in forged["source_metadata"] else forged)[name] = value
    changed = with_value(event, forged)
    if json_format:
        return key_document(changed), event_document(changed)
    key = encode(WriterSchema.from_schema(event.table.key_schema), event.key)
    return key, encode(WriterSchema.from_schema(event.table.event_schema), forged)


def read(decoder: BatchDecoder, messages: list[tuple[str, tuple[bytes, bytes]]]) -> DecodedBatch:
    """The messages read as a batch's tasks read them: a name the context lacks is quarantined
    with the reason that stays final once the driver read the schema topic again."""
    rows = pa.table(
        {
            "key": pa.array([key for _, (key, _) in messages], pa.binary()),
            "value": pa.array([value for _, (_, value) in messages], pa.binary()),
            "topic": [topic for topic, _ in messages],
            "partition": pa.array([0] * len(messages), pa.int32()),
            "offset": pa.array(range(len(messages)), pa.int64()),
        }
    )
    return MessageReader(decoder.start_batch()).read(rows)


@pytest.mark.parametrize("json_format", [False, True], ids=["avro", "json"])
def test_an_event_naming_another_key_than_its_tables_published_one_is_quarantined(json_format: bool) -> None:
    accounts = ChangeFactory()
    real = [
        accounts.events(accounts.record("INSERT", {"Id": str(n)}, {"Balance": str(n)}))[0] for n in range(20)
    ]
    decoder = published_decoder(real[:1])
    topic = TOPICS.event("Accounts")
    forged = [
        message(real[0], json_format, primary_keys=["Note"]),
        message(real[0], json_format, primary_keys=[]),
        message(real[0], json_format, primary_keys=["Id", "Note"]),
    ]
    batch = read(decoder, [(topic, m) for m in [*forged, *(message(e, json_format) for e in real)]])

    assert [(q.offset, q.reason) for q in batch.quarantined] == [(n, "unpublished-key") for n in range(3)]
    assert "their key schema" in batch.quarantined[0].detail
    assert [row["payload"]["Id"] for row in read_columns(batch.events).to_pylist()] == [
        str(n) for n in range(20)
    ]
    assert {e.version.key for e in batch.events} == {("Id",)}


def test_a_table_created_again_with_another_key_is_followed_once_its_key_schema_is_published() -> None:
    first = ChangeFactory(columns=[("Id", "STRING", True), ("N", "INT64", False)])
    again = ChangeFactory(columns=[("Id", "STRING", False), ("N", "INT64", True)])
    before = first.events(first.record("INSERT", {"Id": "1"}, {"N": 7}))[0]
    after = again.events(again.record("INSERT", {"N": 1}, {"Id": "1"}))[0]
    topic = TOPICS.event("Accounts")

    batch = read(published_decoder([before, after]), [(topic, message(e, False)) for e in (before, after)])

    assert not batch.quarantined
    assert [e.version.key for e in batch.events] == [("Id",), ("N",)]


@pytest.mark.parametrize("json_format", [False, True], ids=["avro", "json"])
def test_an_event_naming_another_table_than_its_writer_schema_is_quarantined(json_format: bool) -> None:
    """DuckDB folds unquoted-looking names' case: ``accounts`` on its own topic, in the schema of
    ``Accounts``, would have changed an ``Accounts`` row."""
    accounts = ChangeFactory()
    real = accounts.events(accounts.record("INSERT", {"Id": "a"}, {"Balance": "1"}))[0]
    decoder = published_decoder([real])
    forged = message(real, json_format, object="accounts")

    batch = read(
        decoder, [(TOPICS.event("accounts"), forged), (TOPICS.event("Accounts"), message(real, json_format))]
    )

    if json_format:  # a JSON event names its table version by object: there is none of "accounts"
        assert [q.reason for q in batch.quarantined] == ["unknown-table-version"]
    else:
        assert [(q.reason, q.detail) for q in batch.quarantined] == [
            ("wrong-table", "an event of table 'accounts' in a writer schema of 'spanner_cdc.Accounts'")
        ]
    assert [e.table for e in batch.events] == ["Accounts"]
