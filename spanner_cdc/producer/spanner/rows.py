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
costs far more than the value it describes. The values are walked in C
(``producer.spanner.wire_values``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from spanner_cdc.producer.spanner.wire_values import Converter, converter
from spanner_cdc.schemas.records import ChangeStreamRecord, records_from_json


def records_of(results: Any) -> Iterator[list[ChangeStreamRecord]]:
    """An undecoded ``SELECT ChangeRecord FROM READ_…`` query's streamed results → each row's
    records, one list per row. The field metadata (``results.fields``) comes with the first rows
    and is the same for every row of the query: it is read once."""
    convert: Converter | None = None
    for row in results:
        if convert is None:
            convert = converter(results.fields[0].type_)
        yield [record for change in convert(row[0]) or () for record in records_from_json(change)]
