"""The compiled row converter against the Python converters it stands for: the same value, of
the same type, or the same error with the same message, for every form a value may take."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.row_values import RowConverter
from spanner_cdc.schemas.spanner_types import SpannerType, converter, row_value_kind
from spanner_cdc.schemas.table import Column, TableSchema
from spanner_cdc.schemas.timestamps import format_timestamp_micros

#: Values that are not the type's common form, or are it but wrong: each must reach the Python
#: converter and come back as it says.
ODD_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 1.5, math.nan, math.inf,
    "", "-", "+1", " 1", "1 ", "1_000", "٣", "0x10", "00012", "-0", "9" * 18, "9" * 19, "-" + "9" * 19,
    "NaN", "Infinity", "-Infinity", "true", [], {}, b"1",
    "2024-02-29T23:59:59.999999Z", "2023-02-29T00:00:00.000000Z", "2024-13-01T00:00:00.000000Z",
    "2024-01-32T00:00:00.000000Z", "2024-01-01T24:00:00.000000Z", "2024-01-01T00:60:00.000000Z",
    "2024-01-01T00:00:60.000000Z", "2024-01-01t00:00:00.000000Z", "2024-01-01 00:00:00.000000Z",
    "2024-01-01T00:00:00.000000z", "0000-01-01T00:00:00.000000Z", "0001-01-01T00:00:00.000000Z",
    "9999-12-31T23:59:59.999999Z", "1969-12-31T23:59:59.999999Z", "1900-02-28T00:00:00.000000Z",
    "2000-02-29T12:00:00.000000Z", "2100-02-29T00:00:00.000000Z", "2024-01-01T00:00:00Z",
    "2024-01-01T00:00:00.123456789Z", "2024-01-01T00:00:00.000000+00:00", "2024-0\uff11-01T00:00:00.000000Z",
    "\uff12024-01-01T00:00:00.000000Z", "2024-01-01T00:00:00.00000aZ", "abc",
    "2024-01-01T00:00:00.Z", "2024-01-01T00:00:00.1Z", "2024-01-01T00:00:00.1234567890Z",
    "2024-01-01T00:00:00.12345a789Z", "2024-01-01T00:00:00.123456700Z", "2024-01-01T00:00:00,1Z",
    "2024-01-01T00:00:00.-1Z", "2024-01-01T00:00:00.1+Z", "2024-01-01T00:00:001Z",
]  # fmt: skip
TYPES = ["STRING", "INT64", "TIMESTAMP", "FLOAT64", "FLOAT32", "BOOL", "ENUM", "NUMERIC", "BYTES", "DATE"]


def outcome(convert: Any, value: Any) -> tuple[Any, ...]:
    try:
        result = convert(value)
    except Exception as exc:
        return ("error", type(exc), str(exc))
    return ("value", type(result), repr(result))


def one_column(type_name: str) -> tuple[RowConverter, Any]:
    spanner_type = SpannerType(type_name)
    python = converter(spanner_type, "T", "C")

    def unknown(name: str) -> None:
        raise ContractError(f"unknown {name}")

    return RowConverter([("C", "c", row_value_kind(spanner_type), python)], unknown), python


def calendar_edges() -> list[str]:
    """The days around each year's end and February's, in every year: where a calendar goes wrong."""
    days = ["01-01", "02-28", "02-29", "03-01", "12-31"]
    return [f"{year:04d}-{day}T23:59:59.999999Z" for year in range(1, 10_000) for day in days]


def random_values(rng: random.Random) -> list[Any]:
    """Common forms, at random: timestamps over the years 1-9999 (with six fractional digits, as
    few as the value needs, none, or nine), plain decimal text."""
    values: list[Any] = []
    for _ in range(2_000):
        micros = rng.randrange(-62_135_596_800_000_000, 253_402_300_800_000_000)
        micros -= micros % 10 ** rng.randrange(7)  # trailing zeros, up to a whole second
        text = format_timestamp_micros(micros)
        short = text[:-1].rstrip("0").rstrip(".") + "Z"
        nine = f"{text[:-1]}{rng.choice(['000', '001', '100'])}Z"
        values += [text, short, nine, str(rng.randrange(-(10**19), 10**19)), rng.random()]
    return values


@pytest.mark.parametrize("type_name", TYPES)
def test_every_value_converts_as_the_python_converter_does(type_name: str) -> None:
    compiled, python = one_column(type_name)
    edges = calendar_edges() if type_name == "TIMESTAMP" else []
    for value in ODD_VALUES + edges + random_values(random.Random(type_name)):
        got = outcome(lambda v: compiled.convert({"C": v})["c"], value)
        assert got == outcome(python, value), value


THREE_COLUMNS = TableSchema(
    "T",
    [
        Column("Id", SpannerType("INT64"), True, 1),
        Column("Name-x", SpannerType("STRING"), False, 2),
        Column("At", SpannerType("TIMESTAMP"), False, 3),
    ],
)


def test_a_row_is_named_by_avro_names_and_refuses_an_unknown_column() -> None:
    table = THREE_COLUMNS
    row = table.convert_row({"Id": "42", "Name-x": "a", "At": "1970-01-01T00:00:01.000002Z"})
    assert row == {"Id": 42, "Name_x": "a", "At": 1_000_002}
    with pytest.raises(ContractError, match="unknown column 'Nope'"):
        table.convert_row({"Nope": 1})


def test_a_row_read_from_a_table_converts_as_the_same_row_by_name() -> None:
    table = THREE_COLUMNS
    names, values = ["At", "Id", "Name-x"], ["1970-01-01T00:00:01.000002Z", "42", None]
    assert table.convert_columns(names, values) == table.convert_row(dict(zip(names, values, strict=True)))
    with pytest.raises(ContractError, match="unknown column 'Nope'"):
        table.convert_columns(["Id", "Nope"], ["1", 1])
    with pytest.raises(ValueError, match="zip"):
        table.convert_columns(["Id", "At"], ["1"])
