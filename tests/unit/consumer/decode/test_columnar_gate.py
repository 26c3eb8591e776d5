"""The columnar gate (consumer.decode.columnar) accepts only what the record gate accepts, and
makes the same of it: valid events of every column type and messages damaged in their bytes
and in their content are read both ways — ``MessageReader.read`` (the columnar gate first) and
``MessageReader.read_each`` (record by record) — and give the same events, quarantine reasons
and outline rows."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from spanner_cdc.consumer.decode.decoded import DecodedBatch
from spanner_cdc.consumer.decode.gate import DecodeContext, MessageReader
from spanner_cdc.consumer.decode.outline_rows import outline_batch
from spanner_cdc.consumer.decode.rules import MAX_FUTURE_MICROS
from spanner_cdc.consumer.sinks.contents import by_table
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.wire import HEADER_LENGTH, WriterSchema, encode
from testkit.synthetic import ChangeFactory
from tests.unit.schemas.test_avro_reader import typed

pytestmark = pytest.mark.unit

PREFIX = "gate"
NOW_MICROS = 1_800_000_000_000_000
LATEST_COMMIT = NOW_MICROS + MAX_FUTURE_MICROS
#: Every scalar type the columnar gate takes, and a table of JSON and NUMERIC (whose values the
#: rules check: the record gate reads such a table's events).
TYPED = ChangeFactory(
    table="Typed",
    columns=[
        ("Id", "STRING", True),
        ("N", "INT64", False),
        ("F", "FLOAT64", False),
        ("B", "BOOL", False),
        ("Raw", "BYTES", False),
        ("At", "TIMESTAMP", False),
        ("Day", "DATE", False),
        ("Note", "STRING", False),
    ],
    capture="NEW_ROW_AND_OLD_VALUES",
)
WITH_JSON = ChangeFactory(
    table="Docs", columns=[("Id", "INT64", True), ("Doc", "JSON", False), ("Num", "NUMERIC", False)]
)


def valid_records() -> list[dict[str, Any]]:
    rng = random.Random(20261130)
    records = []
    for number in range(40):
        values = {
            "N": str(rng.randint(-(2**63), 2**63 - 1)),
            "F": rng.choice([0.5, -0.0, float("inf"), "NaN", 1e300]),
            "B": rng.random() < 0.5,
            "Raw": "AAEC/w==",
            "At": "2026-11-30T05:00:00.123456Z",
            "Day": "2024-02-29",
            "Note": rng.choice(["", "ZZé", "日本", "a" * 300]),
        }
        kind = ("INSERT", "UPDATE", "DELETE")[number % 3]
        new = {} if kind == "DELETE" else values
        old = {"N": "1", "Note": "before"} if kind != "INSERT" else {}
        records.append(TYPED.record(kind, {"Id": f"id-{number % 7}"}, new, old))
        records.append(
            WITH_JSON.record(
                "INSERT",
                {"Id": str(number)},
                {"Doc": '{"a": [1, 2]}', "Num": "-12345678901234567890.123456789"},
            )
        )
    return records


def encoded(
    records: list[dict[str, Any]],
) -> tuple[dict[int, WriterSchema], list[tuple[bytes, dict[str, Any]]], dict[int, str]]:
    """The records' events: writer schemas by fingerprint, each event's bytes and record, and
    every schema the producer would publish for them (event and key schemas) by fingerprint."""
    writers: dict[int, WriterSchema] = {}
    messages = []
    published: dict[int, str] = {}
    for event in ChangeFactory().events(*records):
        writer = WriterSchema.from_schema(event.table.event_schema)
        key_writer = WriterSchema.from_schema(event.table.key_schema)
        writers[writer.fingerprint] = writer
        published.update({w.fingerprint: w.schema_json for w in (writer, key_writer)})
        message = encode(writer, event.value)
        messages.append((message, writer.column_reader(message, HEADER_LENGTH)[0]))
    return writers, messages, published


#: Changes to an event's record the rules refuse (or, some of them, accept: both gates must
#: agree either way), each re-encoded with the event's own schema.
def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    *parents, name = path.split(".")

    def change(record: dict[str, Any]) -> None:
        for parent in parents:
            record = record[parent]
        record[name] = value

    return change


def _both(field: str, index: int, stated: Any, sort_key: Any) -> Callable[[dict[str, Any]], None]:
    """``source_metadata[field]`` and the sort key at ``index`` changed together."""

    def change(record: dict[str, Any]) -> None:
        record["source_metadata"][field] = stated
        record["sort_keys"][index] = sort_key

    return change


CONTENT_CHANGES: list[Callable[[dict[str, Any]], None]] = [
    _set("uuid", ""),
    _set("uuid", "u" * 65),
    _set("uuid", "é" * 64),  # 64 characters, 128 bytes: taken
    _set("uuid", "é" * 65),
    _set("object", "Other"),  # another table's topic
    _set("object", "bad$name"),
    _set("object", "a.b.c"),
    _set("object", "x" * 129),
    _set("source_metadata.change_type", "MERGE"),
    _set("source_metadata.change_type", "DELETE"),
    _set("source_metadata.is_deleted", True),
    _set("sort_keys", []),
    _set("sort_keys", [1, "tx", "s"]),
    _set("sort_keys", ["1", "tx", "s", 0]),
    _set("sort_keys", [1, 2, "s", 0]),
    lambda record: record["sort_keys"].append(0),
    lambda record: record["sort_keys"].__setitem__(1, "other-tx"),
    lambda record: record["sort_keys"].__setitem__(2, "00000009"),
    lambda record: record["sort_keys"].__setitem__(3, 5),
    lambda record: record["sort_keys"].__setitem__(0, record["sort_keys"][0] + 1),
    _set("source_metadata.tx_id", None),  # sort keys say "tx-…": refused
    _both("tx_id", 1, None, ""),  # a missing transaction id is "" in the sort keys: taken
    _both("record_sequence", 2, "", ""),
    _both("commit_timestamp", 0, 0, 0),
    _both("commit_timestamp", 0, -5, -5),
    _both(
        "commit_timestamp", 0, NOW_MICROS + MAX_FUTURE_MICROS, NOW_MICROS + MAX_FUTURE_MICROS
    ),  # the latest taken
    _both("commit_timestamp", 0, NOW_MICROS + MAX_FUTURE_MICROS + 1, NOW_MICROS + MAX_FUTURE_MICROS + 1),
    _both("mod_index", 3, -1, -1),
    _both("mod_index", 3, 7, 7),
    _set("source_metadata.primary_keys", []),
    _set("source_metadata.primary_keys", ["Missing"]),
    _set("source_metadata.primary_keys", ["Id\x00N"]),
    _set("source_metadata.primary_keys", ["Id", "N"]),
    _set("source_metadata.primary_keys", ["N"]),
]


def damaged(messages: list[tuple[bytes, dict[str, Any]]], writers: dict[int, WriterSchema]) -> list[bytes]:
    """Each message's bytes damaged at random (bytes changed, cut short, one too many, invalid
    UTF-8 in a text), and its record changed by each of :data:`CONTENT_CHANGES`."""
    rng = random.Random(7)
    found = []
    for message, record in messages:
        for _ in range(6):
            spoilt = bytearray(message)
            for _ in range(rng.randint(1, 3)):
                spoilt[rng.randrange(HEADER_LENGTH, len(spoilt))] = rng.randrange(256)
            found.append(bytes(spoilt))
        found.append(message[: rng.randrange(HEADER_LENGTH, len(message))])
        found.append(message + b"\x00")
        found.append(message.replace("ZZé".encode(), b"ZZ\xa9\xc3"))  # invalid UTF-8, same length
        writer = writers[int.from_bytes(message[2:HEADER_LENGTH], "little")]
        for change in CONTENT_CHANGES:
            changed = copy.deepcopy(record)
            change(changed)
            try:
                found.append(encode(writer, changed))
            except (ValueError, TypeError, AttributeError):  # the schema cannot hold it
                continue
    return found


def rows_of(messages: list[bytes], writers: dict[int, WriterSchema]) -> pa.Table:
    """The messages as Kafka rows, each on its table's topic (read from the valid record)."""
    topics = []
    for message in messages:
        writer = writers.get(int.from_bytes(message[2:HEADER_LENGTH], "little"))
        table = "Typed" if writer is None or "Typed" in writer.schema_json else "Docs"
        topics.append(Topics(PREFIX).event(table))
    return pa.table(
        {
            "key": pa.array([b"k"] * len(messages), pa.binary()),
            "value": pa.array(messages, pa.binary()),
            "topic": pa.array(topics, pa.string()),
            "partition": pa.array([0] * len(messages), pa.int32()),
            "offset": pa.array(range(len(messages)), pa.int64()),
        }
    )


def outcome(batch: DecodedBatch) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """What a read made, in message order: events (their record too), quarantine rows, outline;
    and the sinks' tables of its events (taken from the columns the columnar gate read, or read
    again from the bytes the record gate read)."""
    events = [
        [
            e.offset,
            e.topic,
            e.partition,
            e.key,
            e.value,
            e.version.writer.fingerprint,
            e.version.key,
            e.table,
            e.sort_key,
            typed(e.record),
        ]
        for e in sorted(batch.events, key=lambda e: e.offset)  # one message at each offset
    ]
    refused = sorted((q.offset, q.reason, q.detail, q.unknown) for q in batch.quarantined)
    outline = pa.Table.from_batches([outline_batch(batch)]).sort_by("offset").to_pylist()
    tables = [
        [changes.table, changes.changelog().to_pylist(), changes.replica_stage().to_pylist()]
        for changes in by_table(batch.events)
    ]
    return events, refused, typed(outline), typed(tables)


def test_the_columnar_gate_accepts_what_the_record_gate_accepts_and_makes_the_same_of_it() -> None:
    writers, messages, published = encoded(valid_records())
    spoilt = damaged(messages, writers)
    context = DecodeContext(Topics(PREFIX), NOW_MICROS, schemas=published)
    every = [message for message, _ in messages] + spoilt
    accepted = refused = 0
    for group in [every, *([message] for message in every)]:  # all at once, and one by one
        rows = rows_of(group, writers)
        columnar, by_record = MessageReader(context).read(rows), MessageReader(context).read_each(rows)
        assert outcome(columnar) == outcome(by_record)
        if len(group) == 1:
            accepted += columnar.outlined_events
            refused += len(columnar.quarantined)
    reasons = {q.reason for q in MessageReader(context).read_each(rows_of(spoilt, writers)).quarantined}
    # the test reaches both ways: the columnar gate took the valid events of "Typed" (not those
    # of "Docs", whose JSON and NUMERIC the rules check) and some damaged ones; the rules refused many
    typed_events = sum(1 for _, record in messages if record["object"] == "Typed")
    assert typed_events <= accepted < typed_events + len(spoilt)
    assert refused > len(spoilt) // 2
    assert {
        "corrupt", "truncated", "bad-sort-keys", "bad-envelope", "wrong-topic", "bad-name", "unpublished-key"
    } <= reasons  # fmt: skip


def test_an_unreadable_message_is_handed_back_alone_and_its_neighbours_are_taken() -> None:
    """The columns reader fails a whole call on one message; the gate reads the others again
    without it (one bad message among ten used to cost each message hundreds of times more)."""
    records = [TYPED.record("INSERT", {"Id": f"k{n}"}, {"N": str(n)}) for n in range(30)]
    writers, messages, published = encoded(records)
    bad = {0, 9, 10, 29}
    damaged = [message[:-1] if n in bad else message for n, (message, _) in enumerate(messages)]
    reader = MessageReader(DecodeContext(Topics(PREFIX), NOW_MICROS, schemas=published))

    batch = reader.read(rows_of(damaged, writers))

    assert sorted(e.offset for e in batch.events) == [n for n in range(30) if n not in bad]
    assert sorted(q.offset for q in batch.quarantined) == sorted(bad)
    assert batch.outlined_events == 30 - len(bad)  # all taken by the columnar gate
