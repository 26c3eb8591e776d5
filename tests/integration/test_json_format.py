"""``--format json`` against the real emulator, broker and Spark: the same changes as Avro
events, as JSON documents a plain JSON reader can use, and a consumer that reads them into the
same replica and changelog."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from google.cloud.spanner import KeySet

from spanner_cdc.consumer.readers import changelog_rows, quarantine_rows, replica_rows
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import consumer_config, run_consumer
from testkit.spanner_db import create_database
from tests.integration.test_backfill import THING_COLUMNS, THINGS, TYPES_DDL
from tests.support.churn import now_micros, produce_since
from tests.support.kafka_read import read_all, read_events

pytestmark = pytest.mark.integration
REPLICA_COLUMNS = '"Tag", "Id", "Flag", "Ratio", "Amount", "Raw", "Day", "Doc", "Names", "Counts"'


def write_things(database: Any) -> None:
    """Every column type inserted, one row updated, one deleted."""
    with database.batch() as batch:
        batch.insert("Things", columns=THING_COLUMNS, values=THINGS)
    with database.batch() as batch:
        batch.update("Things", columns=["Tag", "Id", "Flag", "Names"], values=[["a", 2, True, ["y", ""]]])
    with database.batch() as batch:
        batch.delete("Things", keyset=KeySet(keys=[["b", 2**62]]))  # type: ignore[no-untyped-call]


@pytest.mark.spark
def test_json_events_are_the_avro_events_and_the_consumer_reads_them(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """The same changes produced as Avro and as JSON: the JSON messages are JSON documents
    (columns by name, INT64 as text, timestamps as RFC 3339, keys as JSON objects, watermark
    records too) with the Avro events' uuids; the consumer puts them in the same replica and
    changelog, and quarantines a malformed document, a mistyped value and an unknown table version
    with their reasons instead of wedging."""
    spanner, kafka = stack.endpoint("spanner"), stack.endpoint("kafka")
    database = create_database(spanner, TYPES_DDL)
    start = now_micros()
    write_things(database)
    avro = produce_since(stack, database, "ThingsStream", start)
    as_json = produce_since(stack, database, "ThingsStream", start, format="json")

    topic = Topics(as_json.topic_prefix).event("Things")
    messages = read_all(kafka, topic)
    events = [(json.loads(k), json.loads(v)) for _, _, k, v in messages if k is not None and v is not None]
    watermarks = [json.loads(v) for _, _, k, v in messages if k is None and v is not None]
    assert watermarks and all(w["watermark"].endswith("Z") for w in watermarks)
    assert sorted(e["uuid"] for _, e in events) == sorted(
        e.value["uuid"] for e in read_events(kafka, avro.topic_prefix, "Things")
    )
    inserted = next(
        e
        for key, e in events
        if key == {"Tag": "a", "Id": "1"} and e["source_metadata"]["change_type"] == "INSERT"
    )
    assert inserted["payload"]["Amount"] == "12345678901234567890.123456789"
    assert inserted["payload"]["Raw"] == "AP8="
    assert inserted["payload"]["Day"] == "2024-02-29"
    assert inserted["payload"]["Counts"] == ["1", str(-(2**63))]
    assert inserted["read_timestamp"].endswith("Z") and inserted["object"] == "Things"

    forger = Producer({"bootstrap.servers": kafka})
    mistyped = {**inserted, "payload": {**inserted["payload"], "Amount": {"x": 1}}}
    unknown = {**inserted, "schema_key": "0" * 64}
    for forged in (b'{"object": "Things", bro', json.dumps(mistyped).encode(), json.dumps(unknown).encode()):
        forger.produce(topic, key=b'{"Tag":"x","Id":"9"}', value=forged)
    assert forger.flush(30) == 0
    replicas = {}
    for name, produced in (("avro", avro), ("json", as_json)):
        config = consumer_config(kafka, produced.topic_prefix, tmp_path / name)
        run_consumer(spark, config)
        replicas[name] = config
    rows = {
        name: sorted(replica_rows(config, "Things", REPLICA_COLUMNS)) for name, config in replicas.items()
    }
    assert rows["json"] == rows["avro"] and len(rows["json"]) == 2
    changelog = {
        name: changelog_rows(config, "Things", '"envelope$uuid", "change$type", "Amount", "Names"')
        for name, config in replicas.items()
    }
    assert changelog["json"] == changelog["avro"] and len(changelog["json"]) == 5
    assert sorted((t, r) for t, r, _ in quarantine_rows(replicas["json"])) == [
        (topic, "undecodable-json"),
        (topic, "undecodable-json"),
        (topic, "unknown-table-version"),
    ]
