"""Hostile and malformed input through the real consumer, against both replicas.

Anyone who can produce to the event or schema topics — or a buggy producer — can publish what
is below. Each case is published between good events; the consumer must keep running, deliver
the good events exactly once, put each bad message in quarantine with its reason, and leave the
replica and its consistent cut as the good events alone would. docs/reliability.md lists the
cases.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from spanner_cdc.consumer.readers import changelog_rows, quarantine_rows, replica_connection, replica_rows
from spanner_cdc.schemas.events import Event
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import Watermark
from spanner_cdc.schemas.wire import WriterSchema, encode
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import ConfigFactory, run_consumer
from testkit.synthetic import STREAM, ChangeFactory, publish, with_value
from tests.support.kafka_write import produce

pytestmark = [pytest.mark.integration, pytest.mark.spark]
YEAR_9999_MICROS = 253_402_300_799_000_000
#: 10^30 as NUMERIC's Avro bytes (decimal(38, 9): the unscaled 10^39, two's complement, big-endian).
TOO_LARGE_NUMERIC = (10**39).to_bytes(17, "big", signed=True)


def schema_record(schema: dict[str, Any]) -> tuple[bytes, bytes, WriterSchema]:
    """(key, value) for ``_spanner-cdc.{prefix}.schemas`` as the producer writes them, and the writer."""
    writer = WriterSchema.from_schema(schema)
    return writer.fingerprint_hex.encode(), json.dumps(schema).encode(), writer


def forged(event: Event, change: dict[str, Any]) -> bytes:
    """``event``'s record with ``change`` applied (``source_metadata.x`` for nested fields),
    encoded with the event's own, valid writer schema."""
    record = copy.deepcopy(event.value)
    for path, value in change.items():
        *parents, leaf = path.split(".")
        target = record
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return encode(WriterSchema.from_schema(event.table.event_schema), record)


def one_event(factory: ChangeFactory, keys: dict[str, Any], values: dict[str, Any]) -> Event:
    return factory.events(factory.record("INSERT", keys, values))[0]


@dataclass
class Hostile:
    """What the test publishes: good events, the real events of the odd tables, schema
    records, and the bad messages with the reason each must be quarantined for."""

    good: list[Event]
    odd_tables: list[Event]
    schema_records: list[tuple[bytes, bytes]]
    #: (reason, topic, value)
    cases: list[tuple[str, str, bytes]]


def hostile(topics: Topics) -> Hostile:
    accounts = topics.event("Accounts")
    factory = ChangeFactory()
    before = one_event(factory, {"Id": "a"}, {"Balance": "1", "Note": "x"})
    announced = one_event(factory, {"Id": "c"}, {"Balance": "3", "Note": "z"})
    value = announced.value
    value["source_metadata"]["number_of_records_in_transaction"] = None  # legal: applied
    unannounced = with_value(announced, value)
    after = one_event(factory, {"Id": "b"}, {"Balance": "2", "Note": "y"})
    template = one_event(factory, {"Id": "t"}, {"Balance": "9", "Note": "t"})

    recursive = {"type": "record", "name": "Event", "namespace": "x", "fields": [
        {"name": "next", "type": ["null", "x.Event"]}]}  # fmt: skip
    null_items = {"type": "record", "name": "Event", "namespace": "y", "fields": [
        {"name": "a", "type": {"type": "array", "items": "null"}}]}  # fmt: skip
    with_enum = copy.deepcopy(template.table.event_schema)
    _payload_fields(with_enum)[2]["type"] = ["null", {"type": "enum", "name": "E", "symbols": ["x"]}]
    lookalike = one_event(ChangeFactory(table="Lookalike"), {"Id": "l"}, {"Balance": "5", "Note": "n"})
    impostor = copy.deepcopy(lookalike.table.event_schema)
    # Balance and Note swapped (each read as the other): the same fingerprint, another reading.
    _payload_fields(impostor)[1]["sqlName"], _payload_fields(impostor)[2]["sqlName"] = "Note", "Balance"
    reserved = ChangeFactory(table="Weird", columns=(("Id", "STRING", True), ("cdc$x", "INT64", False)))
    weird = one_event(reserved, {"Id": "w"}, {"cdc$x": "1"})
    docs = ChangeFactory(table="Docs", columns=(("Id", "STRING", True), ("Doc", "JSON", False)))
    doc = one_event(docs, {"Id": "d"}, {"Doc": '{"a": 1}'})
    typed = ChangeFactory(
        table="Values",
        columns=(("Id", "STRING", True), ("N", "NUMERIC", False), ("U", "UUID", False),
                 ("J", "JSON", False), ("P", "PG_NUMERIC", False)),
    )  # fmt: skip
    values = one_event(
        typed, {"Id": "v"}, {"N": "1.5", "U": "0b6e2a46-6d6c-4a3c-9a51-2f0f6b0c8e11", "J": "[1]", "P": "2.5"}
    )

    schemas = [schema_record(s) for s in (recursive, null_items, with_enum, impostor)]
    recursive_header, null_items_header, enum_header = (writer.header for _, _, writer in schemas[:3])
    in_9999 = {
        "sort_keys": [YEAR_9999_MICROS, *template.value["sort_keys"][1:]],
        "source_metadata.commit_timestamp": YEAR_9999_MICROS,
    }
    nope = f"{topics.prefix}.Nope"
    cases = [
        ("rejected-schema", accounts, recursive_header + b"\x02" * 5_000),
        ("rejected-schema", accounts, null_items_header + b"\x80\xda\xc4\x09\x00"),
        ("rejected-schema", accounts, enum_header + b"\x00" * 20),
        ("ambiguous-schema", topics.event("Lookalike"), forged(lookalike, {})),
        ("bad-sort-keys", accounts, forged(template, {"sort_keys": template.value["sort_keys"][:3]})),
        ("bad-sort-keys", accounts, forged(template, in_9999)),
        ("bad-name", accounts, forged(template, {"object": "cdc$batches"})),
        ("wrong-topic", topics.event("Other"), forged(template, {})),
        # Taken for Accounts dropped and created again with another key, these emptied its replica.
        ("unpublished-key", accounts, forged(template, {"source_metadata.primary_keys": ["Note"]})),
        ("unpublished-key", accounts, forged(template, {"source_metadata.primary_keys": []})),
        # DuckDB folds the case of names: this changed an Accounts row.
        ("wrong-table", topics.event("accounts"), forged(template, {"object": "accounts"})),
        ("bad-envelope", accounts, forged(template, {"source_metadata.change_type": "MERGE"})),
        ("bad-name", topics.event("Weird"), forged(weird, {})),
        ("bad-value", topics.event("Docs"), forged(doc, {"payload.Doc": "{not json"})),
        # Values both gates accepted and a sink could not hold: the batch failed at every retry.
        ("bad-value", topics.event("Values"), forged(values, {"payload.N": TOO_LARGE_NUMERIC})),
        ("bad-value", topics.event("Values"), forged(values, {"payload.U": "not-a-uuid"})),
        ("bad-value", topics.event("Values"), forged(values, {"payload.J": '{"a": NaN}'})),
        ("bad-value", topics.event("Values"), forged(values, {"payload.J": '"\\ud800"'})),
        ("bad-value", topics.event("Values"), forged(values, {"payload.P": "sNaN"})),
        ("bad-value", topics.event("Values"), forged(values, {"payload.P": "1e999999"})),
        ("empty", accounts, b""),
        ("bad-watermark", accounts, Watermark(STREAM, YEAR_9999_MICROS, {accounts: 3}).encode(0)),
        ("bad-watermark", accounts, Watermark(STREAM, 1, {accounts: 3, nope: 1}).encode(0)),
        ("bad-watermark", accounts, Watermark(STREAM, 1, {accounts: 20_000}).encode(0)),
    ]
    garbage = [(b"not-a-fingerprint", b"{}"), (b"0123456789abcdef", b"\xff\xfe not json")]
    records = [(key, value) for key, value, _ in schemas] + garbage
    return Hostile([before, unannounced, after], [lookalike, weird, doc, values], records, cases)


def test_hostile_messages_are_quarantined_and_good_events_flow(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    config = configure()
    topics = Topics(config.topic_prefix)
    given = hostile(topics)
    before, *later = given.good
    bootstrap = config.kafka_bootstrap
    publish(bootstrap, config.topic_prefix, [before])
    publish(bootstrap, config.topic_prefix, given.odd_tables, watermark=False)  # their real schemas
    produce(bootstrap, topics.schemas, given.schema_records)
    bad = [(topic, value) for _, topic, value in given.cases]
    publish(bootstrap, config.topic_prefix, [], raw=bad, watermark=False)
    publish(bootstrap, config.topic_prefix, later)

    run_consumer(spark, config)

    rows = [("a", 1, "x"), ("b", 2, "y"), ("c", 3, "z")]
    assert replica_rows(config, "Accounts", '"Id", "Balance", "Note"') == rows
    delivered = [row[0] for row in changelog_rows(config, "Accounts", '"envelope$uuid"')]
    assert delivered == [e.value["uuid"] for e in given.good]
    quarantined = Counter((str(topic), str(reason)) for topic, reason, _ in quarantine_rows(config))
    expected = Counter((topic, reason) for reason, topic, _ in given.cases)
    expected[topics.event("Lookalike"), "ambiguous-schema"] += 1  # its real event, read after the impostor
    expected[topics.event("Weird"), "bad-name"] += 1
    assert quarantined == expected
    with replica_connection(config) as replica:
        cut = replica.execute('SELECT cut_micros FROM "cdc$consistent_cut"').fetchall()
        listed = replica.execute("SELECT table_name FROM information_schema.tables").fetchall()
    assert cut == [(max(e.value["source_metadata"]["commit_timestamp"] for e in given.good),)]
    assert not {"Lookalike", "Weird", "Other"} & {str(row[0]) for row in listed}


def _payload_fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The Payload record's fields, wherever the schema defines it."""
    found: list[list[dict[str, Any]]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "record" and node.get("name") == "Payload":
                found.append(node["fields"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return found[0]
