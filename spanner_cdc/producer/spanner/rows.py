"""GoogleSQL change-stream rows → the record model, named by the result set's field metadata.

GoogleSQL returns ``ChangeRecord`` as ``ARRAY<STRUCT<data_change_record ARRAY<STRUCT>, …>>``
(positional lists in the Python client). They are turned into the JSON form the PostgreSQL
dialect returns, by the result set's own field names rather than hard-coded positions, so a
field Spanner adds later cannot shift the others; ``spanner_cdc.schemas.records`` parses both.

The field metadata is read once per query (:func:`row_converter`), not per value: reading a
``Type`` message's code, fields and names costs far more than the value it describes, and a
change record holds dozens of values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from google.cloud.spanner_v1 import TypeCode

from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.records import ChangeStreamRecord, records_from_json

#: A GoogleSQL value → the same value with STRUCTs as dicts (None stays None).
Converter = Callable[[Any], Any]


def converter(spanner_type: Any) -> Converter | None:
    """How to turn a value of ``spanner_type`` (a ``Type`` proto) into its JSON form; None when
    the value is its own JSON form (no STRUCT inside it)."""
    code = TypeCode(int(spanner_type.code))  # proto-plus enum or raw protobuf int alike
    if code == TypeCode.ARRAY:
        item = converter(spanner_type.array_element_type)
        if item is None:
            return None
        return lambda value: None if value is None else [item(element) for element in value]
    if code == TypeCode.STRUCT:
        return _struct_converter(spanner_type.struct_type.fields)
    return None


def _struct_converter(fields: Any) -> Converter:
    names = tuple(field.name for field in fields)
    steps = tuple(converter(field.type_) for field in fields)

    nested = any(step is not None for step in steps)

    def convert(value: Any) -> Any:
        if value is None:
            return None
        if len(value) != len(names):
            raise ContractError(f"a STRUCT of {len(value)} values where its type names {len(names)}")
        if not nested:
            return dict(zip(names, value, strict=True))
        return {
            name: item if step is None or item is None else step(item)
            for name, step, item in zip(names, steps, value, strict=True)
        }

    return convert


def row_converter(fields: Any) -> Callable[[list[Any]], Iterator[ChangeStreamRecord]]:
    """A ``SELECT ChangeRecord FROM READ_…`` query's rows → records, from the result set's field
    metadata (``results.fields``, the same for every row of the query)."""
    convert = converter(fields[0].type_)

    def records(row: list[Any]) -> Iterator[ChangeStreamRecord]:
        change_records = row[0] if convert is None else convert(row[0])
        for change_record in change_records:
            yield from records_from_json(change_record)

    return records
