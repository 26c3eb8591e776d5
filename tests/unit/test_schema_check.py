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
