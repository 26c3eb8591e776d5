"""U+0000 in text, which Spanner allows and PostgreSQL cannot store.

A Spanner STRING may contain U+0000 (and a JSON value the escape ``\\u0000``); PostgreSQL's
``TEXT`` and ``JSONB`` refuse both, so one such value used to fail every attempt of its batch.
The PostgreSQL replica stores U+FFFD (the replacement character) in its place, counts the
values it changed and says so; the changelog keeps the exact value. A key that differs from
another only by U+0000 against U+FFFD at the same place would share its row — the price of a
visible mark over silently dropping the character.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from spanner_cdc.consumer.decode.table_version import PayloadColumn

NUL = "\x00"
REPLACEMENT = "\ufffd"
#: ``\u0000`` as a JSON escape: preceded by an even number of backslashes (``\\u0000`` is text).
_JSON_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
_TEXT_TYPES = ("TEXT", "TEXT[]")
_JSON_TYPES = ("JSONB", "JSONB[]")
#: One column's strings → the same with U+0000 replaced, and how many values changed.
_Fix = Callable[[pa.Array], tuple[pa.Array, int]]


@dataclass(frozen=True)
class Cleaned:
    rows: pa.Table
    #: Values that held U+0000 and now hold U+FFFD.
    replaced: int


def without_nul(rows: pa.Table, columns: Sequence[PayloadColumn]) -> Cleaned:
    """``rows`` with U+0000 replaced in every TEXT and JSONB column (and arrays of them)."""
    replaced = 0
    for column in columns:
        sql_type = column.type.sql("postgres")
        if sql_type not in _TEXT_TYPES + _JSON_TYPES:
            continue
        fix = _fix_text if sql_type in _TEXT_TYPES else _fix_json
        position = rows.schema.get_field_index(column.name)
        chunks, count = [], 0
        for chunk in rows.column(position).chunks:
            fixed, changed = _per_element(chunk, fix)
            chunks.append(fixed)
            count += changed
        if count:
            rows = rows.set_column(
                position, rows.field(position), pa.chunked_array(chunks, rows.field(position).type)
            )
            replaced += count
    return Cleaned(rows, replaced)


def _per_element(array: pa.Array, fix: _Fix) -> tuple[pa.Array, int]:
    """``fix`` applied to a string array, or to the strings inside a list array."""
    if isinstance(array, pa.ListArray):
        values, changed = fix(array.values)
        if not changed:
            return array, 0
        return pa.ListArray.from_arrays(array.offsets, values, mask=array.is_null()), changed
    return fix(array)


def _fix_text(array: pa.Array) -> tuple[pa.Array, int]:
    changed = pc.sum(pc.match_substring(array, NUL)).as_py() or 0
    return (pc.replace_substring(array, NUL, REPLACEMENT), changed) if changed else (array, 0)


def _fix_json(array: pa.Array) -> tuple[pa.Array, int]:
    suspects = pc.sum(pc.match_substring(array, "\\u0000")).as_py() or 0
    if not suspects:
        return array, 0
    values = array.to_pylist()
    fixed = [None if v is None else _JSON_NUL_ESCAPE.sub(lambda m: m.group(1) + "\\ufffd", v) for v in values]
    changed = sum(1 for old, new in zip(values, fixed, strict=True) if old != new)
    return pa.array(fixed, type=array.type), changed
