"""GoogleSQL change-stream rows → JSON form → records, by the result set's field metadata."""

from __future__ import annotations

from typing import Any

import pytest
from google.cloud.spanner_v1 import StructType, Type, TypeCode

from spanner_cdc.producer.spanner.rows import converter, row_converter
from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.records import ChildPartitionsRecord, DataChangeRecord, HeartbeatRecord


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
                commit_timestamp=scalar(TypeCode.INT64),
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
        heartbeat_record=array(struct(timestamp=scalar(TypeCode.INT64))),
        child_partitions_record=array(
            struct(
                start_timestamp=scalar(TypeCode.INT64),
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
    """What ``results.fields`` holds: a name and a type."""

    def __init__(self, name: str, type_: Type) -> None:
        self.name = name
        self.type_ = type_


def data_change(commit: int, key: str) -> list[Any]:
    return [
        commit, "00000001", "tx-1", True, "Accounts",
        [["Id", {"code": "STRING"}, True, 1], ["Balance", {"code": "INT64"}, False, 2]],
        [[{"Id": key}, {"Balance": "1"}, {}]],
        "INSERT", "NEW_ROW", 1, 1, "", False,
    ]  # fmt: skip


def test_a_row_becomes_the_records_it_holds_named_by_its_fields() -> None:
    row = [
        [
            [[data_change(1_000, "a"), data_change(2_000, "b")], [], []],
            [[], [[3_000]], []],
            [[], [], [[4_000, "00000002", [["child", ["parent", None]]]]]],
        ]
    ]
    records = list(row_converter([Field("ChangeRecord", CHANGE_RECORD)])(row))
    first, second, heartbeat, children = records
    assert isinstance(first, DataChangeRecord) and isinstance(second, DataChangeRecord)
    assert (first.commit_timestamp_micros, first.mods[0].keys, first.mods[0].new_values) == (
        1_000,
        {"Id": "a"},
        {"Balance": "1"},
    )
    assert [c["name"] for c in first.column_types] == ["Id", "Balance"]
    assert second.mods[0].keys == {"Id": "b"}
    assert heartbeat == HeartbeatRecord(3_000)
    assert isinstance(children, ChildPartitionsRecord)
    assert [(c.token, c.parent_tokens) for c in children.children] == [("child", ("parent",))]


def test_nulls_stay_null_and_values_without_structs_are_their_own_json() -> None:
    assert converter(scalar(TypeCode.STRING)) is None
    assert converter(array(scalar(TypeCode.INT64))) is None
    nested = converter(array(struct(name=scalar(TypeCode.STRING), tags=array(scalar(TypeCode.STRING)))))
    assert nested is not None
    assert nested(None) is None
    assert nested([None, ["x", None], ["y", ["t"]]]) == [
        None,
        {"name": "x", "tags": None},
        {"name": "y", "tags": ["t"]},
    ]
    inner = converter(struct(outer=struct(inner=scalar(TypeCode.STRING))))
    assert inner is not None
    assert inner([None]) == {"outer": None}
    assert inner([["v"]]) == {"outer": {"inner": "v"}}


@pytest.mark.parametrize("values", [["only one"], ["one", "two", "three"]])
def test_a_struct_with_other_than_its_fields_is_refused(values: list[str]) -> None:
    convert = converter(struct(a=scalar(TypeCode.STRING), b=scalar(TypeCode.STRING)))
    assert convert is not None
    with pytest.raises(ContractError, match="STRUCT of"):
        convert(values)
