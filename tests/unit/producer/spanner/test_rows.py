"""GoogleSQL change-stream rows → JSON form → records, by the result set's field metadata."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.cloud.spanner_v1 import StructType, Type, TypeCode
from google.protobuf.struct_pb2 import NULL_VALUE, ListValue, Value  # type: ignore[import-untyped]

from spanner_cdc.producer.spanner.rows import records_of
from spanner_cdc.producer.spanner.wire_values import converter
from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.records import ChildPartitionsRecord, DataChangeRecord, HeartbeatRecord
from spanner_cdc.schemas.timestamps import parse_timestamp_micros


def scalar(code: int) -> Type:
    return Type(code=code)


def array(element: Type) -> Type:
    return Type(code=TypeCode.ARRAY, array_element_type=element)


def struct(**fields: Type) -> Type:
    return Type(
        code=TypeCode.STRUCT,
        struct_type=StructType(
            fields=[StructType.Field(name=name, type_=kind) for name, kind in fields.items()]
        ),
    )


CHANGE_RECORD = array(
    struct(
        data_change_record=array(
            struct(
                commit_timestamp=scalar(TypeCode.TIMESTAMP),
                record_sequence=scalar(TypeCode.STRING),
                server_transaction_id=scalar(TypeCode.STRING),
                is_last_record_in_transaction_in_partition=scalar(TypeCode.BOOL),
                table_name=scalar(TypeCode.STRING),
                column_types=array(
                    struct(
                        name=scalar(TypeCode.STRING),
                        type=scalar(TypeCode.JSON),
                        is_primary_key=scalar(TypeCode.BOOL),
                        ordinal_position=scalar(TypeCode.INT64),
                    )
                ),
                mods=array(
                    struct(
                        keys=scalar(TypeCode.JSON),
                        new_values=scalar(TypeCode.JSON),
                        old_values=scalar(TypeCode.JSON),
                    )
                ),
                mod_type=scalar(TypeCode.STRING),
                value_capture_type=scalar(TypeCode.STRING),
                number_of_records_in_transaction=scalar(TypeCode.INT64),
                number_of_partitions_in_transaction=scalar(TypeCode.INT64),
                transaction_tag=scalar(TypeCode.STRING),
                is_system_transaction=scalar(TypeCode.BOOL),
            )
        ),
        heartbeat_record=array(struct(timestamp=scalar(TypeCode.TIMESTAMP))),
        child_partitions_record=array(
            struct(
                start_timestamp=scalar(TypeCode.TIMESTAMP),
                record_sequence=scalar(TypeCode.STRING),
                child_partitions=array(
                    struct(
                        token=scalar(TypeCode.STRING), parent_partition_tokens=array(scalar(TypeCode.STRING))
                    )
                ),
            )
        ),
    )
)


class Field:
    """One of ``results.fields``: a name and a type."""

    def __init__(self, name: str, type_: Type) -> None:
        self.name = name
        self.type_ = type_


class StreamedResults:
    """What the client's streamed result set offers: its rows, and ``fields`` once the first
    rows came (not before: reading the metadata early is the mistake this shape can catch)."""

    def __init__(self, rows: list[list[Value]], fields: list[Field]) -> None:
        self.rows, self._fields, self.started = rows, fields, False

    def __iter__(self) -> Any:
        self.started = True
        return iter(self.rows)

    @property
    def fields(self) -> list[Field]:
        assert self.started, "the field metadata comes with the first rows"
        return self._fields


def wire(value: Any, spanner_type: Type) -> Value:
    """``value`` as Spanner sends it undecoded: a protobuf ``Value`` of ``spanner_type``."""
    if value is None:
        return Value(null_value=NULL_VALUE)
    code = TypeCode(int(spanner_type.code))
    if code == TypeCode.STRUCT:
        fields = spanner_type.struct_type.fields
        return Value(
            list_value=ListValue(values=[wire(v, f.type_) for f, v in zip(fields, value, strict=True)])
        )
    if code == TypeCode.ARRAY:
        return Value(list_value=ListValue(values=[wire(v, spanner_type.array_element_type) for v in value]))
    if code == TypeCode.JSON:
        return Value(string_value=json.dumps(value))
    if code == TypeCode.BOOL:
        return Value(bool_value=value)
    return Value(string_value=str(value))


def data_change(commit: str, key: str) -> list[Any]:
    return [
        commit, "00000001", "tx-1", True, "Accounts",
        [["Id", {"code": "STRING"}, True, 1], ["Balance", {"code": "INT64"}, False, 2]],
        [[{"Id": key}, {"Balance": "1", "Score": 1.5, "Tags": ["a", None]}, {}]],
        "INSERT", "NEW_ROW", 1, 1, "", False,
    ]  # fmt: skip


def test_a_row_becomes_the_records_it_holds_named_by_its_fields() -> None:
    change_records = [
        [
            [data_change("2026-12-06T00:00:00.001Z", "a"), data_change("2026-12-06T00:00:00.002Z", "b")],
            [],
            [],
        ],
        [[], [["2026-12-06T00:00:00.003Z"]], []],
        [[], [], [["2026-12-06T00:00:00.004Z", "00000002", [["child", ["parent", None]]]]]],
    ]
    rows = [[wire(change_records[:1], CHANGE_RECORD)], [wire(change_records[1:], CHANGE_RECORD)]]
    per_row = list(records_of(StreamedResults(rows, [Field("ChangeRecord", CHANGE_RECORD)])))
    assert [len(records) for records in per_row] == [2, 2]
    first, second, heartbeat, children = per_row[0] + per_row[1]
    assert isinstance(first, DataChangeRecord) and isinstance(second, DataChangeRecord)
    assert first.commit_timestamp_micros == parse_timestamp_micros("2026-12-06T00:00:00.001Z")
    assert first.mods[0].keys == {"Id": "a"}
    assert first.mods[0].new_values == {"Balance": "1", "Score": 1.5, "Tags": ["a", None]}
    assert type(first.mods[0].keys) is dict  # not the client's JsonObject
    assert (first.number_of_records_in_transaction, first.is_last_record_in_transaction_in_partition) == (
        1,
        True,
    )
    assert [c["name"] for c in first.column_types] == ["Id", "Balance"]
    assert second.mods[0].keys == {"Id": "b"}
    assert heartbeat == HeartbeatRecord(parse_timestamp_micros("2026-12-06T00:00:00.003Z"))
    assert isinstance(children, ChildPartitionsRecord)
    assert [(c.token, c.parent_tokens) for c in children.children] == [("child", ("parent",))]


def test_nulls_stay_null_at_every_level() -> None:
    kind = array(
        struct(name=scalar(TypeCode.STRING), tags=array(scalar(TypeCode.STRING)), n=scalar(TypeCode.INT64))
    )
    convert = converter(kind)
    assert convert(wire(None, kind)) is None
    rows = [None, ["x", None, None], ["y", ["t", None], 7]]
    assert convert(wire(rows, kind)) == [
        None,
        {"name": "x", "tags": None, "n": None},
        {"name": "y", "tags": ["t", None], "n": 7},
    ]


def test_empty_text_false_and_zero_are_not_nulls() -> None:
    kind = struct(
        name=scalar(TypeCode.STRING),
        at=scalar(TypeCode.TIMESTAMP),
        flag=scalar(TypeCode.BOOL),
        n=scalar(TypeCode.INT64),
        tags=array(scalar(TypeCode.STRING)),
        doc=scalar(TypeCode.JSON),
    )
    convert = converter(kind)
    assert convert(wire(["", None, False, 0, [], {}], kind)) == {
        "name": "",
        "at": None,
        "flag": False,
        "n": 0,
        "tags": [],
        "doc": {},
    }
    assert convert(wire([None, None, None, None, None, None], kind)) == dict.fromkeys(
        ("name", "at", "flag", "n", "tags", "doc")
    )


def test_a_struct_with_other_than_its_fields_is_refused() -> None:
    two = struct(a=scalar(TypeCode.STRING), b=scalar(TypeCode.STRING))
    convert = converter(two)
    for values in (["only one"], ["one", "two", "three"]):
        sent = Value(list_value=ListValue(values=[Value(string_value=v) for v in values]))
        with pytest.raises(ContractError, match="STRUCT of"):
            convert(sent)
