"""The gate (consumer.decode.gate, consumer.decode.events): valid events of every column type,
as Avro and as JSON, and messages damaged in their bytes and in their content. Each change to
an event's content is refused with the reason of the rule it breaks (or taken, where it breaks
none); a share's messages read at once make exactly what each makes read alone (events, their
records and sink rows, reasons, outline); and the columns reader accepts exactly the messages
the record reader (``wire.read_body``) reads."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from spanner_cdc.consumer.decode.decoded import DecodedBatch, read_columns
from spanner_cdc.consumer.decode.gate import DecodeContext, MessageReader
from spanner_cdc.consumer.decode.outline_rows import outline_batch
from spanner_cdc.consumer.decode.rules import MAX_FUTURE_MICROS
from spanner_cdc.consumer.sinks.contents import by_table
from spanner_cdc.schemas.errors import DecodeError
from spanner_cdc.schemas.json_events import event_document
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.wire import HEADER_LENGTH, WriterSchema, encode, read_body
from testkit.synthetic import ChangeFactory
from tests.unit.schemas.test_avro_reader import typed

pytestmark = pytest.mark.unit

PREFIX = "gate"
NOW_MICROS = 1_800_000_000_000_000
LATEST_COMMIT = NOW_MICROS + MAX_FUTURE_MICROS
#: Every scalar type, and a table of JSON and NUMERIC (whose values the rules bound).
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


#: Changes to an event's record, each re-encoded with the event's own schema, and the reason an
#: INSERT event of "Typed" so changed is refused with (None: taken).
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


CONTENT_CHANGES: list[tuple[Callable[[dict[str, Any]], None], str | None]] = [
    (_set("uuid", ""), "bad-envelope"),
    (_set("uuid", "u" * 65), "bad-envelope"),
    (_set("uuid", "é" * 64), None),  # 64 characters, 128 bytes
    (_set("uuid", "é" * 65), "bad-envelope"),
    (_set("object", "Other"), "wrong-topic"),  # another table's topic
    (_set("object", "bad$name"), "bad-name"),
    (_set("object", "a.b.c"), "wrong-topic"),
    (_set("object", "x" * 129), "bad-name"),
    (_set("source_metadata.change_type", "MERGE"), "bad-envelope"),
    (_set("source_metadata.change_type", "DELETE"), "bad-envelope"),
    (_set("source_metadata.is_deleted", True), "bad-envelope"),
    (_set("sort_keys", []), "bad-sort-keys"),
    (_set("sort_keys", [1, "tx", "s"]), "bad-sort-keys"),
    (_set("sort_keys", ["1", "tx", "s", 0]), "bad-sort-keys"),
    (_set("sort_keys", [1, 2, "s", 0]), "bad-sort-keys"),
    (lambda record: record["sort_keys"].append(0), "bad-sort-keys"),
    (lambda record: record["sort_keys"].__setitem__(1, "other-tx"), "bad-sort-keys"),
    (lambda record: record["sort_keys"].__setitem__(2, "00000009"), "bad-sort-keys"),
    (lambda record: record["sort_keys"].__setitem__(3, 5), "bad-sort-keys"),
    (lambda record: record["sort_keys"].__setitem__(3, "5"), "bad-sort-keys"),
    (lambda record: record["sort_keys"].__setitem__(0, record["sort_keys"][0] + 1), "bad-sort-keys"),
    (_set("source_metadata.tx_id", None), "bad-sort-keys"),  # the sort keys say "tx-…"
    (_both("tx_id", 1, None, ""), None),  # a missing transaction id is "" in the sort keys
    (_both("record_sequence", 2, "", ""), None),
    (_both("commit_timestamp", 0, 0, 0), "bad-sort-keys"),
    (_both("commit_timestamp", 0, -5, -5), "bad-sort-keys"),
    (_both("commit_timestamp", 0, LATEST_COMMIT, LATEST_COMMIT), None),  # the latest taken
    (_both("commit_timestamp", 0, LATEST_COMMIT + 1, LATEST_COMMIT + 1), "bad-sort-keys"),
    (_both("mod_index", 3, -1, -1), "bad-sort-keys"),
    (_both("mod_index", 3, 7, 7), None),
    (_set("source_metadata.primary_keys", []), "unpublished-key"),
    (_set("source_metadata.primary_keys", ["Missing"]), "not-an-event"),
    (_set("source_metadata.primary_keys", ["Id\x00N"]), "not-an-event"),
    (_set("source_metadata.primary_keys", ["Id", "N"]), "unpublished-key"),
    (_set("source_metadata.primary_keys", ["N"]), "unpublished-key"),
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
        for change, _ in CONTENT_CHANGES:
            changed = copy.deepcopy(record)
            change(changed)
            try:
                found.append(encode(writer, changed))
            except (ValueError, TypeError, AttributeError):  # the schema cannot hold it
                continue
    return found


def rows_of(
    messages: list[bytes], writers: dict[int, WriterSchema], tables: list[str] | None = None
) -> pa.Table:
    """The messages as Kafka rows, each on its table's topic (``tables``, or read from the
    valid record of its writer schema)."""
    if tables is None:
        named = [writers.get(int.from_bytes(message[2:HEADER_LENGTH], "little")) for message in messages]
        tables = ["Typed" if writer is None or "Typed" in writer.schema_json else "Docs" for writer in named]
    return pa.table(
        {
            "key": pa.array([b"k"] * len(messages), pa.binary()),
            "value": pa.array(messages, pa.binary()),
            "topic": pa.array([Topics(PREFIX).event(table) for table in tables], pa.string()),
            "partition": pa.array([0] * len(messages), pa.int32()),
            "offset": pa.array(range(len(messages)), pa.int64()),
        }
    )


def outcome(batch: DecodedBatch) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """What a read made, in message order: events (their row of the columns they were read into
    too, their Kafka coordinates left out), quarantine rows, outline;
    and the sinks' tables of its events (taken from the columns they were read into)."""
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
            typed({name: value for name, value in read_columns([e])[0].as_py().items() if "$" not in name}),
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


def test_each_broken_rule_is_the_reason_its_event_is_refused() -> None:
    writers, messages, published = encoded(valid_records())
    reader = MessageReader(DecodeContext(Topics(PREFIX), NOW_MICROS, schemas=published))
    inserts = [
        (message, record)
        for message, record in messages
        if record["object"] == "Typed" and record["source_metadata"]["change_type"] == "INSERT"
    ]
    assert inserts
    for message, record in inserts:
        writer = writers[int.from_bytes(message[2:HEADER_LENGTH], "little")]
        for change, reason in CONTENT_CHANGES:
            changed = copy.deepcopy(record)
            change(changed)
            batch = reader.read(rows_of([encode(writer, changed)], writers))
            assert [q.reason for q in batch.quarantined] == ([reason] if reason else []), (changed, batch)
            assert len(batch.events) == (0 if reason else 1)


def test_a_share_read_at_once_makes_what_each_message_makes_alone() -> None:
    writers, messages, published = encoded(valid_records())
    spoilt = damaged(messages, writers)
    context = DecodeContext(Topics(PREFIX), NOW_MICROS, schemas=published)
    every = [message for message, _ in messages] + spoilt
    at_once = outcome(MessageReader(context).read(rows_of(every, writers)))
    events: list[Any] = []
    refused: list[Any] = []
    outline: list[Any] = []
    for offset, message in enumerate(every):  # each alone, at offset 0, moved to its own offset
        alone = outcome(MessageReader(context).read(rows_of([message], writers)))
        events += [[offset, *event[1:]] for event in alone[0]]
        refused += [(offset, *reason[1:]) for reason in alone[1]]
        outline += [{**row, "offset": ("int", offset)} for row in alone[2]]
    assert at_once[:3] == (events, refused, outline)
    assert {
        "corrupt", "truncated", "bad-sort-keys", "bad-envelope", "wrong-topic", "bad-name", "unpublished-key"
    } <= {reason for _, reason, _, _ in refused}  # fmt: skip
    assert len(events) > len(messages)  # some damaged ones are still events


def test_the_columns_reader_accepts_exactly_what_the_record_reader_reads() -> None:
    writers, messages, published = encoded(valid_records())
    spoilt = damaged(messages, writers)
    batch = MessageReader(DecodeContext(Topics(PREFIX), NOW_MICROS, schemas=published)).read(
        rows_of(spoilt, writers)
    )
    for event in batch.events:
        read_body(event.version.writer, event.value, HEADER_LENGTH, calendar_numbers=True)
    unreadable = [q for q in batch.quarantined if q.reason in ("corrupt", "truncated")]
    assert len(unreadable) > len(spoilt) // 10
    for refused in unreadable:
        value = refused.value
        assert value is not None
        with pytest.raises(DecodeError) as raised:
            read_body(
                writers[int.from_bytes(value[2:HEADER_LENGTH], "little")],
                value,
                HEADER_LENGTH,
                calendar_numbers=True,
            )
        assert raised.value.reason == refused.reason


def test_a_json_event_makes_what_its_avro_event_makes() -> None:
    records = valid_records()
    writers, messages, published = encoded(records)
    events = ChangeFactory().events(*records)
    versions = {(event.table.table, event.table.schema_key): event.table for event in events}
    context = DecodeContext(Topics(PREFIX), NOW_MICROS, schemas=published, json_versions=versions)
    documents = [event_document(event) for event in events]
    tables = [event.table.table for event in events]
    as_avro = outcome(
        MessageReader(context).read(rows_of([message for message, _ in messages], writers, tables))
    )
    as_json = outcome(MessageReader(context).read(rows_of(documents, writers, tables)))
    assert len(as_json[0]) == len(records)
    assert [event[:4] + event[5:] for event in as_json[0]] == [event[:4] + event[5:] for event in as_avro[0]]
    assert as_json[1:] == as_avro[1:]
    spoilt = [json.dumps({**json.loads(document), "uuid": ""}).encode() for document in documents]
    refused = MessageReader(context).read(rows_of(spoilt, writers, tables)).quarantined
    assert [q.reason for q in refused] == ["bad-envelope"] * len(documents)


def test_a_value_a_sink_cannot_hold_is_refused_by_its_column() -> None:
    """JSON that is not JSON, in the payload or the old values; a NUMERIC of 38 digits or more
    (the columns reader's bound: decimal(38, 9) holds below 10^29)."""
    records = [
        WITH_JSON.record("UPDATE", {"Id": str(n)}, {"Doc": '{"a": 1}', "Num": "1"}, {"Doc": "[]"})
        for n in range(4)
    ]
    writers, messages, published = encoded(records)
    changes: list[Callable[[dict[str, Any]], None]] = [
        _set("payload.Doc", '{"a": NaN}'),
        lambda record: None,
        _set("source_metadata.old_values.Doc", "not json"),
        _set("payload.Num", (10**38).to_bytes(17, "big")),  # 10^29 unscaled
    ]
    changed = []
    for (message, valid), change in zip(messages, changes, strict=True):
        writer = writers[int.from_bytes(message[2:HEADER_LENGTH], "little")]
        record = copy.deepcopy(valid)
        record["payload"]["Num"] = (10**9).to_bytes(5, "big")  # 1, as the writer takes it: unscaled
        change(record)
        changed.append(encode(writer, record))
    batch = MessageReader(DecodeContext(Topics(PREFIX), NOW_MICROS, schemas=published)).read(
        rows_of(changed, writers)
    )
    assert [event.offset for event in batch.events] == [1]
    assert [(q.offset, q.reason) for q in batch.quarantined] == [
        (0, "bad-value"),
        (2, "bad-value"),
        (3, "bad-value"),
    ]
    assert "'Doc'" in batch.quarantined[1].detail


def test_an_unreadable_message_is_refused_alone_and_its_neighbours_are_taken() -> None:
    """The columns reader fails a whole call on one message; the gate reads the others again
    without it (one bad message among ten used to cost each message hundreds of times more)."""
    records = [TYPED.record("INSERT", {"Id": f"k{n}"}, {"N": str(n)}) for n in range(30)]
    writers, messages, published = encoded(records)
    bad = {0, 9, 10, 29}
    damaged = [message[:-1] if n in bad else message for n, (message, _) in enumerate(messages)]
    reader = MessageReader(DecodeContext(Topics(PREFIX), NOW_MICROS, schemas=published))

    batch = reader.read(rows_of(damaged, writers))

    assert [e.offset for e in batch.events] == [n for n in range(30) if n not in bad]
    assert [(q.offset, q.reason) for q in batch.quarantined] == [(n, "truncated") for n in sorted(bad)]
