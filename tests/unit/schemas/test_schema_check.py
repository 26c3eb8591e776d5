"""The schema check accepts every schema the producer publishes and refuses the hostile shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from spanner_cdc.schemas.schema_check import SchemaRejectedError, check_writer_schema, reading_form
from spanner_cdc.schemas.spanner_types import _AVRO_TYPES
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.watermark import WATERMARK_SCHEMA
from spanner_cdc.schemas.wire import WriterSchema

pytestmark = pytest.mark.unit


def every_type_table() -> TableSchema:
    """A table with a column of every type the contract maps, and an array of each."""
    columns: list[dict[str, Any]] = [
        {"name": "Id", "type": {"code": "STRING"}, "is_primary_key": True, "ordinal_position": 1}
    ]
    for position, code in enumerate(sorted(_AVRO_TYPES), start=2):
        columns.append(
            {
                "name": f"c_{code}",
                "type": {"code": code},
                "is_primary_key": False,
                "ordinal_position": position,
            }
        )
        columns.append(
            {
                "name": f"a_{code}",
                "type": {"code": "ARRAY", "array_element_type": {"code": code}},
                "is_primary_key": False,
                "ordinal_position": position + 100,
            }
        )
    columns.append(
        {"name": "odd name", "type": {"code": "INT64"}, "is_primary_key": True, "ordinal_position": 999}
    )
    return TableSchema.from_column_types("sales.Orders", columns)


def test_every_schema_the_producer_publishes_passes() -> None:
    table = every_type_table()
    for schema in (table.event_schema, table.key_schema, WATERMARK_SCHEMA):
        check_writer_schema(json.dumps(schema))


def test_a_lookalike_shares_the_fingerprint_but_not_the_reading_form() -> None:
    table = every_type_table()
    impostor = json.loads(json.dumps(table.key_schema))
    impostor["fields"][1]["sqlName"] = "Id"
    assert (
        WriterSchema.from_schema(impostor).fingerprint
        == WriterSchema.from_schema(table.key_schema).fingerprint
    )
    assert reading_form(impostor) != reading_form(table.key_schema)


def key_schema(column: Any) -> str:
    return json.dumps({"type": "record", "name": "Key", "fields": [{"name": "a", "type": column}]})


@pytest.mark.parametrize(
    ("schema", "rule"),
    [
        (
            '{"type": "record", "name": "Event", "fields": [{"name": "n", "type": ["null", "Event"]}]}',
            "recursion",
        ),
        (
            key_schema({"type": "map", "values": "null"}),
            "zero bytes",
        ),
        (
            key_schema(["null", {"type": "fixed", "name": "F", "size": 4}]),
            "not one the contract writes",
        ),
        (
            key_schema({"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 2}),
            "not the contract's decimal",
        ),
        ('{"type": "record", "name": "Other", "fields": []}', "not an event, key or watermark"),
        ('{"type": "record", "name": "Event", "fields": []}', "without the field 'uuid'"),
        ("[1, 2", "not JSON"),
        (
            '{"type": "record", "name": "Key", "fields": ['
            + ",".join(f'{{"name": "f{i}", "type": "long"}}' for i in range(5000))
            + "]}",
            "fields",
        ),
    ],
)
def test_hostile_shapes_are_refused(schema: str, rule: str) -> None:
    with pytest.raises(SchemaRejectedError, match=rule):
        check_writer_schema(schema)


def doubling_levels(levels: int) -> list[dict[str, Any]]:
    """R1 … Rn, each a record of two fields of the previous one: a few kilobytes of text whose
    values a decoder walks 2^n records deep."""
    types: list[dict[str, Any]] = [
        {"type": "record", "name": "R0", "fields": [{"name": "x", "type": "long"}]}
    ]
    for level in range(1, levels + 1):
        previous = f"R{level - 1}"
        types.append(
            {
                "type": "record",
                "name": f"R{level}",
                "fields": [{"name": "a", "type": previous}, {"name": "b", "type": previous}],
            }
        )
    return types


def key_with_levels(types: list[dict[str, Any]], wrap_in_array: bool) -> str:
    """A key schema with one field defining each of ``types`` in order (each named before its
    use), and a last one using the top level (or an array of it)."""
    top: Any = types[-1]["name"]
    fields = [{"name": f"level{n}", "type": ["null", level]} for n, level in enumerate(types)]
    fields.append(
        {"name": "bomb", "type": ["null", {"type": "array", "items": top} if wrap_in_array else top]}
    )
    return json.dumps({"type": "record", "name": "Key", "fields": fields})


@pytest.mark.parametrize("wrap_in_array", [False, True])
def test_a_named_type_bomb_is_refused_at_once(wrap_in_array: bool) -> None:
    """28 levels of two fields of the previous type: one 357-byte event took 2.5 s to decode,
    and inside an array the check itself ran for minutes (no memo)."""
    schema = key_with_levels(doubling_levels(28), wrap_in_array)
    assert len(schema) < 10_000
    with pytest.raises(SchemaRejectedError, match="once named types are expanded"):
        check_writer_schema(schema)


def test_a_named_type_defined_twice_is_refused() -> None:
    """fastavro raises on it when the reader is built — after the check passed it."""
    twice = {"type": "record", "name": "T", "fields": [{"name": "x", "type": "long"}]}
    schema = json.dumps(
        {
            "type": "record",
            "name": "Key",
            "fields": [{"name": "a", "type": twice}, {"name": "b", "type": twice}],
        }
    )
    with pytest.raises(SchemaRejectedError, match="a second type named 'T'"):
        check_writer_schema(schema)


def test_a_decoy_payload_record_is_refused() -> None:
    """A record named ``…Payload`` defined before the real one: the check read the first, the
    decoder the second (a ``map`` column slipped through)."""
    event = json.loads(json.dumps(every_type_table().event_schema))
    decoy = {"type": "record", "name": "decoy.Payload", "fields": [{"name": "x", "type": ["null", "long"]}]}
    event["fields"].insert(0, {"name": "decoy", "type": decoy})
    with pytest.raises(SchemaRejectedError, match="a second type named 'Payload'"):
        check_writer_schema(json.dumps(event))


@pytest.mark.parametrize(
    ("names", "rule"),
    [
        (["V", "v"], "are one name"),  # DuckDB: "already exists"
        (
            ["A", "B~c71bd109"],
            "'~'",
        ),  # PostgreSQL: another column's shortened name, "specified more than once"
        (["A", "A"], "are one name"),  # two fields with one sqlName: one of them was stored as NULL
    ],
)
def test_column_names_the_replica_cannot_hold_apart_are_refused(names: list[str], rule: str) -> None:
    fields = [{"name": f"f{n}", "sqlName": name, "type": ["null", "long"]} for n, name in enumerate(names)]
    schema = json.dumps({"type": "record", "name": "Key", "fields": fields})
    with pytest.raises(SchemaRejectedError, match=rule):
        check_writer_schema(schema)
