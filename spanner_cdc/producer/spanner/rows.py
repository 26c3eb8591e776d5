"""GoogleSQL change-stream rows → the record model, named by the result set's field metadata.

GoogleSQL returns ``ChangeRecord`` as ``ARRAY<STRUCT<data_change_record ARRAY<STRUCT>, …>>``
(positional lists in the Python client). They are turned into the JSON form the PostgreSQL
dialect returns, by the result set's own field names rather than hard-coded positions, so a
field Spanner adds later cannot shift the others; ``spanner_cdc.schemas.records`` parses both.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.cloud.spanner_v1 import TypeCode

from spanner_cdc.schemas.records import ChangeStreamRecord, records_from_json


def struct_to_json(value: Any, spanner_type: Any) -> Any:
    """A GoogleSQL value with its ``Type`` proto → the same value with STRUCTs as dicts."""
    code = TypeCode(int(spanner_type.code)).name  # proto-plus enum or raw protobuf int alike
    if value is None:
        return None
    if code == "ARRAY":
        return [struct_to_json(item, spanner_type.array_element_type) for item in value]
    if code == "STRUCT":
        fields = spanner_type.struct_type.fields
        return {
            field.name: struct_to_json(item, field.type_) for field, item in zip(fields, value, strict=True)
        }
    return value


def records_from_googlesql_row(row: list[Any], fields: Any) -> Iterator[ChangeStreamRecord]:
    """A ``SELECT ChangeRecord FROM READ_…`` row, named by the result set's field metadata."""
    for change_record in struct_to_json(row[0], fields[0].type_):
        yield from records_from_json(change_record)
