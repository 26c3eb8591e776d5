"""Fingerprints, single-object encoding, uuids and sort_keys: stable, standard, and strict."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import subprocess
import sys
import textwrap
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from spanner_cdc.schemas.errors import DecodeError
from spanner_cdc.schemas.events import EventBuilder
from spanner_cdc.schemas.identity import EVENT_NAMESPACE, backfill_uuid, change_uuid, row_id
from spanner_cdc.schemas.records import DataChangeRecord
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.wire import HEADER_LENGTH, MAGIC, SchemaStore, WriterSchema, encode, read_fingerprint
from testkit.records import STREAM_NAME, account_transfer_records

pytestmark = pytest.mark.unit
REPO_ROOT = Path(__file__).resolve().parents[3]

ALL_TYPES = [
    {"name": "Id", "type": {"code": "INT64"}, "is_primary_key": True, "ordinal_position": 1},
    {"name": "B", "type": {"code": "BOOL"}, "is_primary_key": False, "ordinal_position": 2},
    {"name": "F", "type": {"code": "FLOAT64"}, "is_primary_key": False, "ordinal_position": 3},
    {"name": "F32", "type": {"code": "FLOAT32"}, "is_primary_key": False, "ordinal_position": 4},
    {"name": "N", "type": {"code": "NUMERIC"}, "is_primary_key": False, "ordinal_position": 5},
    {"name": "S", "type": {"code": "STRING"}, "is_primary_key": False, "ordinal_position": 6},
    {"name": "J", "type": {"code": "JSON"}, "is_primary_key": False, "ordinal_position": 7},
    {"name": "By", "type": {"code": "BYTES"}, "is_primary_key": False, "ordinal_position": 8},
    {"name": "D", "type": {"code": "DATE"}, "is_primary_key": False, "ordinal_position": 9},
    {"name": "Ts", "type": {"code": "TIMESTAMP"}, "is_primary_key": False, "ordinal_position": 10},
    {
        "name": "A",
        "type": {"code": "ARRAY", "array_element_type": {"code": "STRING"}},
        "is_primary_key": False,
        "ordinal_position": 11,
    },
    {"name": "weird name", "type": {"code": "STRING"}, "is_primary_key": False, "ordinal_position": 12},
]
ALL_VALUES = {
    "B": True,
    "F": "NaN",
    "F32": "-Infinity",
    "N": "-12345678901234567890123456789.123456789",
    "S": "ünïcødé",
    "J": '{"k":[1,2]}',
    "By": "AAH/",
    "D": "2024-02-29",
    "Ts": "2024-02-29T23:59:59.999999Z",
    "A": ["x", None, ""],
    "weird name": "quoted identifier",
}


def all_types_event_value() -> tuple[TableSchema, dict[str, object]]:
    record = {
        **account_transfer_records()[0],
        "table_name": "AllTypes",
        "column_types": ALL_TYPES,
        "mod_type": "INSERT",
        "value_capture_type": "NEW_ROW",
        "mods": [{"keys": {"Id": "7"}, "new_values": ALL_VALUES, "old_values": {}}],
    }
    builder = EventBuilder(STREAM_NAME, "bank")
    event = builder.build(DataChangeRecord.from_json(record), "token-1", 1_700_000_000_000)[0]
    return event.table, event.value


def test_single_object_round_trip_of_every_type() -> None:
    table, value = all_types_event_value()
    store = SchemaStore()
    writer = store.add(table.event_schema)
    message = encode(writer, value)
    assert message[:2] == MAGIC
    assert read_fingerprint(message) == writer.fingerprint
    decoded = store.decode(message)
    payload = decoded["payload"]
    assert payload["Id"] == 7 and payload["B"] is True and math.isnan(payload["F"])
    assert payload["F32"] == -math.inf
    assert str(payload["N"]) == "-12345678901234567890123456789.123456789"
    assert payload["S"] == "ünïcødé" and payload["By"] == b"\x00\x01\xff"
    assert payload["D"].isoformat() == "2024-02-29"
    assert payload["Ts"].isoformat() == "2024-02-29T23:59:59.999999+00:00"
    assert payload["A"] == ["x", None, ""]
    assert payload["weird_name"] == "quoted identifier"
    sql_names = {f.get("sqlName") for f in table.payload_schema["fields"]}
    assert "weird name" in sql_names


def test_decode_errors_name_the_reason() -> None:
    table, value = all_types_event_value()
    store = SchemaStore()
    message = encode(store.add(table.event_schema), value)
    cases = {
        b"garbage bytes here": "bad-magic",
        message[:5]: "truncated",
        message[: len(message) - 3]: "truncated",
        MAGIC + b"\x00" * 8 + message[HEADER_LENGTH:]: "unknown-fingerprint",
        message + b"\x00": "corrupt",
    }
    for raw, reason in cases.items():
        with pytest.raises(DecodeError) as caught:
            store.decode(raw)
        assert caught.value.reason == reason, raw


def test_fingerprint_is_crc64_avro_of_the_canonical_form() -> None:
    # The specification's own example: the fingerprint of the schema "null" is well known.
    assert WriterSchema.from_schema('"null"').fingerprint_hex == "63dd24e7cc258f8a"


def test_uuid_is_deterministic_and_distinguishes_identity() -> None:
    first = change_uuid(STREAM_NAME, "tx", "00000001", 0)
    assert first == change_uuid(STREAM_NAME, "tx", "00000001", 0)
    others = {
        change_uuid(STREAM_NAME, "tx", "00000001", 1),
        change_uuid(STREAM_NAME, "tx", "00000002", 0),
        change_uuid(STREAM_NAME, "tx2", "00000001", 0),
        change_uuid(STREAM_NAME + "x", "tx", "00000001", 0),
    }
    assert first not in others and len(others) == 4
    assert backfill_uuid(STREAM_NAME, 5, "T", {"a": 1, "b": "x"}) == backfill_uuid(
        STREAM_NAME, 5, "T", {"b": "x", "a": 1}
    )


def test_uuids_are_the_standard_uuid5_of_the_change_identity() -> None:
    """The uuids come from ``uuid_utils`` (for speed); they must be exactly RFC 4122's uuid5, as
    the standard library computes it, for every kind of name: the events already on Kafka carry
    them, and the consumer deduplicates by them."""
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/spanner-cdc/spanner-cdc/event")
    rng = random.Random(5)
    alphabet = "aZ0_-\x1f\x00é中𝄞 \"'"
    for _ in range(500):
        parts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40))) for _ in range(3)]
        mod_index = rng.randrange(0, 100_000)
        expected = uuid.uuid5(namespace, "\x1f".join([*parts, str(mod_index)]))
        assert change_uuid(parts[0], parts[1], parts[2], mod_index) == str(expected)


STABILITY_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from spanner_cdc.schemas.events import EventBuilder
    from spanner_cdc.schemas.records import DataChangeRecord
    from spanner_cdc.schemas.wire import WriterSchema
    from testkit.records import STREAM_NAME, account_transfer_records
    out = []
    for record in account_transfer_records():
        event = EventBuilder(STREAM_NAME, "bank").build(DataChangeRecord.from_json(record), "t", 0)[0]
        out.append([event.value["uuid"], WriterSchema.from_schema(event.table.event_schema).fingerprint_hex,
                    WriterSchema.from_schema(event.table.key_schema).fingerprint_hex, event.table.schema_key])
    print(json.dumps(out))
    """
)


def test_uuid_fingerprint_and_schema_key_are_stable_across_processes() -> None:
    """Same input → same output in fresh interpreters with different hash seeds.

    The expected values are pinned too: a change to any of them breaks dedupe and schema lookup
    for data already on Kafka, so it must be a deliberate, visible contract change.
    """
    outputs = []
    for seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", STABILITY_SCRIPT],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            cwd=REPO_ROOT,
        )
        outputs.append(json.loads(result.stdout))
    assert outputs[0] == outputs[1]
    assert outputs[0] == PINNED_IDENTITIES


PINNED_IDENTITIES = [
    [
        "f06161af-dd76-5da4-94a1-3053a870133c",
        "fd9cb42048c789d3",
        "a15f7b5b1aec412e",
        "e4e9021db01702a85dffdb1300c316caf21f5eed9ad5c8fb63124c19bf51ce6f",
    ],
    [
        "56f96936-0788-5a3c-8e11-9ed7739b0ba8",
        "fd9cb42048c789d3",
        "a15f7b5b1aec412e",
        "e4e9021db01702a85dffdb1300c316caf21f5eed9ad5c8fb63124c19bf51ce6f",
    ],
]


def test_a_row_id_is_the_uuid5_of_the_key_s_canonical_json() -> None:
    """The row id hashes the key as ``json.dumps`` spells it with sorted names, no spaces, ASCII
    and ``str()`` for what JSON lacks — text of every kind (quotes, controls, non-ASCII, astral),
    numbers (-0.0, NaN, infinities, big ints), booleans, null, bytes, times, decimals and lists —
    so an id never changes with how the consumer builds that text."""
    rng = random.Random(5)
    texts = ["", "k001", 'q"uo\\te', "tab\tnew\nline\x00", "ünï 日本", "😀", "\ud800"]
    values: list[Any] = [
        *texts,
        0, -1, 2**63 - 1, -(2**63), True, False, None, 0.0, -0.0, 1.5e300, float("nan"), float("inf"),
        float("-inf"), b"\x00\xff", dt.datetime(2025, 6, 15, 15, 6, 40, 1, tzinfo=dt.UTC), dt.date(1, 1, 1),
        Decimal("1.500000000"), [1, None, "a"],
    ]  # fmt: skip
    for _ in range(300):
        names = rng.sample(["Id", "b", "A", "é", "Z z", "k\x1f"], rng.randint(0, 3))
        key = {name: rng.choice(values) for name in names}
        canonical = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
        expected = str(uuid.uuid5(uuid.UUID(str(EVENT_NAMESPACE)), f"row\x1fAccounts\x1f{canonical}"))
        assert row_id("Accounts", key) == expected, key
