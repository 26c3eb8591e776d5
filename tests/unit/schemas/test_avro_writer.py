"""The compiled Avro writer is byte-identical to fastavro's, over generated events of every type.

Events are generated from seeded random change records: every column type (arrays of each with
null elements), nulls, NaN and ±Infinity, NUMERIC at precision 38 scale 9, odd text, both
dialects, every capture type and mod type, records of several mods. Each event value and key is
encoded by the project's writer and by ``fastavro.schemaless_writer`` and the bytes compared; the
value as the producer writes it (its fields as tuples, ``Event.fields``) and by name
(``Event.value``, what fastavro is given).
"""

from __future__ import annotations

import base64
import io
import json
import random
import uuid
from typing import Any

import fastavro
import pytest

from spanner_cdc.consumer.decode.gate import parsed_schema
from spanner_cdc.schemas.avro_writer import compile_writer
from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.events import EventBuilder
from spanner_cdc.schemas.records import DataChangeRecord
from spanner_cdc.schemas.watermark import WATERMARK_WRITER, Watermark
from spanner_cdc.schemas.wire import HEADER_LENGTH, WriterSchema, encode
from testkit.records import STREAM_NAME, account_transfer_records

pytestmark = pytest.mark.unit
RECORDS = 400
CAPTURE_TYPES = ("OLD_AND_NEW_VALUES", "NEW_VALUES", "NEW_ROW", "NEW_ROW_AND_OLD_VALUES")
TEXT = ("", "a", "ünïcødé", "日本語", "😀", "line\nbreak", "nul\x00char", "x" * 300)


def _int64(rng: random.Random) -> str:
    return str(
        rng.choice([0, 1, -1, 63, 64, -65, 2**31, -(2**63), 2**63 - 1, rng.randint(-(2**63), 2**63 - 1)])
    )


def _numeric(rng: random.Random) -> str:
    whole = rng.choice(["0", "1", "-1", "9" * 29, "-" + "9" * 29, str(rng.randint(-(10**12), 10**12))])
    return (
        f"{whole}.{rng.choice(['', '5', '000000001', '999999999', str(rng.randint(0, 10**9 - 1))])}".rstrip(
            "."
        )
    )


def _float(rng: random.Random) -> Any:
    return rng.choice(
        ["NaN", "Infinity", "-Infinity", 0.0, -0.0, 1.5, 1e308, -2.5e-308, rng.uniform(-1e6, 1e6)]
    )


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1, 9999):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _bytes(rng: random.Random) -> str:
    return base64.b64encode(rng.randbytes(rng.choice([0, 1, 200]))).decode()


def _pg_numeric(rng: random.Random) -> str:
    return rng.choice(["NaN", "1e-40", _numeric(rng)])


def _timestamp(rng: random.Random) -> str:
    micros = rng.choice(["", ".000001", ".999999", f".{rng.randint(0, 999_999):06d}"])
    return f"{_date(rng)}T23:59:59{micros}Z"


#: code (and annotation) → (column type JSON, a generator of change-record JSON values)
SCALARS: dict[str, tuple[dict[str, Any], Any]] = {
    "BOOL": ({"code": "BOOL"}, lambda rng: rng.choice([True, False])),
    "INT64": ({"code": "INT64"}, _int64),
    "FLOAT64": ({"code": "FLOAT64"}, _float),
    "FLOAT32": ({"code": "FLOAT32"}, lambda rng: rng.choice(["NaN", "Infinity", "-Infinity", 0.5, -3.25])),
    "NUMERIC": ({"code": "NUMERIC"}, _numeric),
    "PG_NUMERIC": ({"code": "NUMERIC", "type_annotation": "PG_NUMERIC"}, _pg_numeric),
    "STRING": ({"code": "STRING"}, lambda rng: rng.choice(TEXT)),
    "JSON": ({"code": "JSON"}, lambda rng: rng.choice(['{"k":[1,2]}', "null", '"ü"', "[]"])),
    "PG_JSONB": ({"code": "JSON", "type_annotation": "PG_JSONB"}, lambda rng: rng.choice(['{"a":1}', "3"])),
    "BYTES": ({"code": "BYTES"}, _bytes),
    "DATE": ({"code": "DATE"}, _date),
    "TIMESTAMP": ({"code": "TIMESTAMP"}, _timestamp),
    "UUID": ({"code": "UUID"}, lambda rng: str(uuid.UUID(int=rng.getrandbits(128))).upper()),
}  # fmt: skip
GOOGLE_SQL = (
    "BOOL",
    "INT64",
    "FLOAT64",
    "FLOAT32",
    "NUMERIC",
    "STRING",
    "JSON",
    "BYTES",
    "DATE",
    "TIMESTAMP",
    "UUID",
)
POSTGRESQL = (
    "BOOL",
    "INT64",
    "FLOAT64",
    "FLOAT32",
    "PG_NUMERIC",
    "STRING",
    "PG_JSONB",
    "BYTES",
    "DATE",
    "TIMESTAMP",
)


def _columns(dialect: tuple[str, ...]) -> list[tuple[str, dict[str, Any], Any]]:
    """(name, type, value generator): every scalar type and an array of each, odd names included."""
    columns = [(f"c_{name}", SCALARS[name][0], SCALARS[name][1]) for name in dialect]
    for name in dialect:
        element, generate = SCALARS[name]

        def array(rng: random.Random, generate: Any = generate) -> list[Any]:
            return [None if rng.random() < 0.3 else generate(rng) for _ in range(rng.choice([0, 1, 3]))]

        columns.append((f"a_{name}", {"code": "ARRAY", "array_element_type": element}, array))
    columns.append(("odd name-ü", {"code": "STRING"}, lambda rng: rng.choice(TEXT)))
    return columns


def _record(rng: random.Random, index: int, dialect: tuple[str, ...]) -> DataChangeRecord:
    columns = _columns(dialect)
    key_types = [("Id", {"code": "INT64"}, _int64), ("Part", {"code": "STRING"}, lambda r: r.choice(TEXT))]
    column_types = [
        {"name": name, "type": kind, "is_primary_key": position <= 2, "ordinal_position": position}
        for position, (name, kind, _) in enumerate(key_types + columns, start=1)
    ]
    mod_type = rng.choice(["INSERT", "UPDATE", "DELETE"])
    capture = rng.choice(CAPTURE_TYPES)

    def values() -> dict[str, Any]:
        chosen = (
            columns if capture.startswith("NEW_ROW") else rng.sample(columns, rng.randint(0, len(columns)))
        )
        return {name: None if rng.random() < 0.2 else generate(rng) for name, _, generate in chosen}

    mods = [
        {
            "keys": {name: generate(rng) for name, _, generate in key_types},
            "new_values": {} if mod_type == "DELETE" else values(),
            "old_values": {} if mod_type == "INSERT" or capture == "NEW_ROW" else values(),
        }
        for _ in range(rng.choice([1, 1, 2, 5]))
    ]
    return DataChangeRecord.from_json(
        {
            **account_transfer_records()[0],
            "table_name": rng.choice(["T", "sales.Orders"]),
            "server_transaction_id": f"tx-{index}",
            "record_sequence": f"{index:08d}",
            "column_types": column_types,
            "mod_type": mod_type,
            "value_capture_type": capture,
            "transaction_tag": rng.choice(["", "app=x"]),
            "mods": mods,
        }
    )


def fastavro_bytes(writer: WriterSchema, value: Any) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, writer.parsed, value)
    return buffer.getvalue()


@pytest.mark.parametrize("dialect", [GOOGLE_SQL, POSTGRESQL], ids=["googlesql", "postgresql"])
def test_generated_events_encode_exactly_as_fastavro_does(dialect: tuple[str, ...]) -> None:
    rng = random.Random(20261124)
    builder = EventBuilder(STREAM_NAME, "bank")
    compared = 0
    for index in range(RECORDS):
        token = rng.choice([None, "token-1"])
        for event in builder.build(_record(rng, index, dialect), token, rng.randint(0, 2**41)):
            for schema, written, value in (
                (event.table.event_schema, event.fields, event.value),
                (event.table.key_schema, event.key, event.key),
            ):
                writer = parsed_schema(json.dumps(schema))
                assert encode(writer, written)[HEADER_LENGTH:] == fastavro_bytes(writer, value), value
                assert encode(writer, value) == encode(writer, written)
                compared += 1
    assert compared > RECORDS * 2


def test_watermark_records_encode_exactly_as_fastavro_does() -> None:
    for topics in ({}, {"a": 1}, {f"t{n}": n for n in range(70)}):
        message = Watermark(STREAM_NAME, 1_795_000_000_000_001, topics).encode(1_795_000_000_000)
        record = {"stream_name": STREAM_NAME, "watermark": 1_795_000_000_000_001,
                  "emitted_at": 1_795_000_000_000, "topics": topics}  # fmt: skip
        assert message[HEADER_LENGTH:] == fastavro_bytes(WATERMARK_WRITER, record)


def test_values_outside_the_schema_are_refused_not_written() -> None:
    write = compile_writer(fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "n", "type": "long"}, {"name": "i", "type": ["null", "int"], "default": None},
        {"name": "u", "type": ["string", "long"]},
    ]}))  # fmt: skip
    with pytest.raises(ValueError, match="range of an Avro long"):
        write(b"", {"n": 2**63, "u": 1})
    with pytest.raises(ValueError, match="range of an Avro int"):
        write(b"", {"n": 1, "i": 2**31, "u": 1})
    with pytest.raises(ValueError, match="no branch"):
        write(b"", {"n": 1, "u": 1.5})
    with pytest.raises(KeyError):
        write(b"", {"u": 1})
    write(b"", {"n": 10**10, "u": 1})  # 10**10's bytes are now kept (write_long)
    with pytest.raises(TypeError):
        write(b"", {"n": 1e10, "u": 1})  # an equal float is still not a long


def test_a_record_given_as_a_tuple_is_its_fields_in_order_all_of_them() -> None:
    schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "n", "type": "long"},
        {"name": "s", "type": ["null", {"type": "record", "name": "S", "fields": [
            {"name": "x", "type": "string"}, {"name": "y", "type": ["null", "long"], "default": None}]}]},
    ]})  # fmt: skip
    write = compile_writer(schema)
    assert write(b"", (1, ("a", None))) == write(b"", {"n": 1, "s": {"x": "a", "y": None}})
    assert write(b"", (1, None)) == write(b"", {"n": 1, "s": None})
    with pytest.raises(ValueError, match="2 fields given as 1 values"):
        write(b"", ("a",))
    with pytest.raises(ValueError, match="2 fields given as 1 values"):
        write(b"", (1, ("a",)))  # no default stands in for a missing field's place
    with pytest.raises(TypeError, match="not a string"):
        write(b"", (1, (2, None)))


def test_unions_maps_and_defaults_are_written_as_fastavro_writes_them() -> None:
    """The parts of Avro the events use little or not at all, against fastavro's bytes."""
    schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "u", "type": ["null", "boolean", "long", "double", "bytes", "string",
                               {"type": "array", "items": "int"},
                               {"type": "record", "name": "S", "fields": [{"name": "x", "type": "float"}]}]},
        {"name": "m", "type": {"type": "map", "values": ["null", "S"]}},
        {"name": "d", "type": "string", "default": "dflt"},
        {"name": "n", "type": "null", "default": None},
    ]})  # fmt: skip
    write = compile_writer(schema)
    for u in (None, True, 0, -(2**63), 2.5, b"\x00\xff", "ü", [1, -1, 2**31 - 1], {"x": -0.0}):
        for m in ({}, {"k": None, "ü": {"x": float("inf")}}):
            value = {"u": u, "m": m}
            expected = io.BytesIO()
            fastavro.schemaless_writer(expected, schema, value)
            assert write(b"\xc3", value) == b"\xc3" + expected.getvalue(), value


def test_values_too_large_for_their_width_are_refused() -> None:
    write = compile_writer(fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "f", "type": "float"}, {"name": "a", "type": {"type": "array", "items": "int"}},
    ]}))  # fmt: skip
    with pytest.raises(OverflowError, match="float too large"):
        write(b"", {"f": 1e300, "a": []})
    with pytest.raises(ValueError, match="range of an Avro int"):
        write(b"", {"f": 0.0, "a": [1, -(2**31) - 1]})
    with pytest.raises(TypeError, match="not a string"):
        compile_writer(fastavro.parse_schema("string"))(b"", b"bytes")
    assert write(b"", {"f": float("-inf"), "a": [True]}) == b"\x00\x00\x80\xff\x02\x02\x00"


def test_types_the_project_never_writes_are_refused_when_compiling() -> None:
    with pytest.raises(ContractError, match="enum"):
        compile_writer(fastavro.parse_schema({"type": "enum", "name": "E", "symbols": ["A"]}))
