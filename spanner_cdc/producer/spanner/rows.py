"""GoogleSQL change-stream rows → the record model, named by the result set's field metadata.

GoogleSQL returns ``ChangeRecord`` as ``ARRAY<STRUCT<data_change_record ARRAY<STRUCT>, …>>``.
The query asks for its rows undecoded (``lazy_decode``: protobuf ``Value``s), and they are
turned here into the JSON form the PostgreSQL dialect returns, by the result set's own field
names rather than hard-coded positions, so a field Spanner adds later cannot shift the others;
``spanner_cdc.schemas.records`` parses both.

Why not the client's decoding: it makes every JSON value (a mod's keys, new and old values, each
column's type) a ``JsonObject``, whose construction and ``items()`` are Python; in a profile of
a backlog read they were most of the reader threads' time and a sixth of the event loop's. Here
JSON values become plain dicts (``schemas.json_text``), and the field metadata is read once per query
(:func:`records_of`), not per value: reading a ``Type`` message's code, fields and names
costs far more than the value it describes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from google.cloud.spanner_v1 import TypeCode

from spanner_cdc.producer.spanner.snapshot_read import json_value
from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.json_text import parse_json
from spanner_cdc.schemas.records import ChangeStreamRecord, records_from_json

#: A protobuf ``Value`` of one type → its change-record JSON form (None for a null).
Converter = Callable[[Any], Any]


def converter(spanner_type: Any) -> Converter:
    """How to turn a ``Value`` of ``spanner_type`` (a ``Type`` proto) into its JSON form: a
    STRUCT a dict by field name, an ARRAY a list, JSON parsed, INT64 an int, BOOL a bool; every
    other type its wire form (TIMESTAMP as RFC 3339 text, as the PostgreSQL dialect has it)."""
    code = TypeCode(int(spanner_type.code))  # proto-plus enum or raw protobuf int alike
    if code == TypeCode.ARRAY:
        item = converter(spanner_type.array_element_type)
        return _nullable(lambda value: [item(element) for element in value.list_value.values])
    if code == TypeCode.STRUCT:
        return _nullable(_struct_converter(spanner_type.struct_type.fields))
    if code == TypeCode.JSON:
        return _nullable(lambda value: parse_json(value.string_value))
    if code == TypeCode.INT64:
        return _nullable(lambda value: int(value.string_value))
    if code == TypeCode.BOOL:
        return _nullable(lambda value: value.bool_value)
    return json_value


def _nullable(convert: Converter) -> Converter:
    return lambda value: None if value.HasField("null_value") else convert(value)


def _struct_converter(fields: Any) -> Converter:
    names = tuple(field.name for field in fields)
    steps = tuple(converter(field.type_) for field in fields)

    def convert(value: Any) -> dict[str, Any]:
        values = value.list_value.values
        if len(values) != len(names):
            raise ContractError(f"a STRUCT of {len(values)} values where its type names {len(names)}")
        return {name: step(item) for name, step, item in zip(names, steps, values, strict=True)}

    return convert


def records_of(results: Any) -> Iterator[list[ChangeStreamRecord]]:
    """An undecoded ``SELECT ChangeRecord FROM READ_…`` query's streamed results → each row's
    records, one list per row. The field metadata (``results.fields``) comes with the first rows
    and is the same for every row of the query: it is read once."""
    convert: Converter | None = None
    for row in results:
        if convert is None:
            convert = converter(results.fields[0].type_)
        yield [record for change in convert(row[0]) or () for record in records_from_json(change)]
