"""Every Spanner type of the contract: Avro type, value conversion, and the errors for bad input."""

from __future__ import annotations

import base64
import decimal
import math
from typing import Any

import pytest

from spanner_cdc.schemas.errors import UnsupportedTypeError, ValueConversionError
from spanner_cdc.schemas.spanner_types import (
    SpannerType,
    avro_type,
    converter,
)
from spanner_cdc.schemas.timestamps import format_timestamp_micros, parse_timestamp_micros

pytestmark = pytest.mark.unit


def convert(spec: dict[str, Any], value: Any) -> Any:
    return converter(SpannerType.from_json(spec), "T", "C")(value)


def decimal_bytes_to_decimal(raw: bytes, scale: int = 9) -> decimal.Decimal:
    """Avro decimal bytes back to a Decimal, with enough precision for 38 digits."""
    return decimal.Context(prec=50).scaleb(decimal.Decimal(int.from_bytes(raw, "big", signed=True)), -scale)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"code": "BOOL"}, "boolean"),
        ({"code": "INT64"}, "long"),
        ({"code": "FLOAT64"}, "double"),
        ({"code": "FLOAT32"}, "float"),
        ({"code": "NUMERIC"}, {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 9}),
        ({"code": "NUMERIC", "type_annotation": "PG_NUMERIC"}, {"type": "string", "logicalType": "number"}),
        ({"code": "STRING"}, "string"),
        ({"code": "JSON"}, {"type": "string", "logicalType": "json"}),
        ({"code": "JSON", "type_annotation": "PG_JSONB"}, {"type": "string", "logicalType": "json"}),
        ({"code": "BYTES"}, "bytes"),
        ({"code": "DATE"}, {"type": "int", "logicalType": "date"}),
        ({"code": "TIMESTAMP"}, {"type": "long", "logicalType": "timestamp-micros"}),
        ({"code": "PROTO", "proto_type_fqn": "x.Y"}, "bytes"),
        ({"code": "ENUM", "proto_type_fqn": "x.E"}, "long"),
        ({"code": "UUID"}, {"type": "string", "logicalType": "uuid"}),
        (
            {"code": "ARRAY", "array_element_type": {"code": "INT64"}},
            {"type": "array", "items": ["null", "long"]},
        ),
    ],
)
def test_avro_type_mapping(spec: dict[str, Any], expected: Any) -> None:
    assert avro_type(SpannerType.from_json(spec), "T", "C") == expected


def test_type_given_as_json_text_parses_like_an_object() -> None:
    assert SpannerType.from_json('{"code":"ARRAY","array_element_type":{"code":"DATE"}}') == SpannerType(
        "ARRAY", None, SpannerType("DATE")
    )


@pytest.mark.parametrize(
    "code", ["BOOL", "INT64", "FLOAT64", "NUMERIC", "STRING", "BYTES", "DATE", "TIMESTAMP", "UUID"]
)
def test_null_stays_null(code: str) -> None:
    assert convert({"code": code}, None) is None


def test_bool_and_int64() -> None:
    assert convert({"code": "BOOL"}, True) is True
    assert convert({"code": "INT64"}, "-9223372036854775808") == -(2**63)
    assert convert({"code": "INT64"}, "9223372036854775807") == 2**63 - 1
    assert convert({"code": "INT64"}, 42) == 42


@pytest.mark.parametrize(
    ("value", "expected"),
    [("NaN", math.nan), ("Infinity", math.inf), ("-Infinity", -math.inf), (1.25, 1.25), (3, 3.0)],
)
def test_float64_including_special_values(value: Any, expected: float) -> None:
    result = convert({"code": "FLOAT64"}, value)
    assert (math.isnan(result) and math.isnan(expected)) or result == expected


def test_float32_special_values() -> None:
    assert math.isnan(convert({"code": "FLOAT32"}, "NaN"))
    assert convert({"code": "FLOAT32"}, "-Infinity") == -math.inf


@pytest.mark.parametrize(
    "text",
    [
        "0",
        "12.345",
        "-0.000000001",
        "99999999999999999999999999999.999999999",
        "-99999999999999999999999999999.999999999",
        "1E+5",
    ],
)
def test_numeric_round_trips_at_precision_38_scale_9(text: str) -> None:
    raw = convert({"code": "NUMERIC"}, text)
    assert decimal_bytes_to_decimal(raw) == decimal.Decimal(text)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("100000000000000000000000000000", "precision"),
        ("0.0000000001", "decimal point"),
        ("NaN", "finite"),
        ("abc", "not a decimal"),
    ],
)
def test_numeric_beyond_precision_or_scale_is_an_error(text: str, reason: str) -> None:
    with pytest.raises(ValueConversionError, match=reason) as caught:
        convert({"code": "NUMERIC"}, text)
    assert caught.value.column == "C" and caught.value.value == text


def test_pg_numeric_keeps_exact_text() -> None:
    spec = {"code": "NUMERIC", "type_annotation": "PG_NUMERIC"}
    long_text = "123456789012345678901234567890123456789012345.123456789012345"
    assert convert(spec, long_text) == long_text
    assert convert(spec, "NaN") == "NaN"
    with pytest.raises(ValueConversionError):
        convert(spec, "twelve")


def test_json_and_pg_jsonb() -> None:
    assert convert({"code": "JSON"}, '{"a":1}') == '{"a":1}'
    assert convert({"code": "JSON", "type_annotation": "PG_JSONB"}, {"b": [1, None]}) == '{"b":[1,null]}'
    with pytest.raises(ValueConversionError):
        convert({"code": "JSON"}, "{not json")


def test_uuid_in_its_canonical_form() -> None:
    """Spanner's UUID type stopped the producer as an unknown type; the emulator (1.5.28) cannot
    create a UUID column, so the conversion is tested here and the column end to end from Kafka
    on (tests/integration/test_consumer_types.py)."""
    canonical = "0b9e3f52-6c1d-4a8e-9f21-7d2c5e4b1a90"
    assert convert({"code": "UUID"}, canonical) == canonical
    assert convert({"code": "UUID"}, canonical.upper().replace("-", "")) == canonical
    array = {"code": "ARRAY", "array_element_type": {"code": "UUID"}}
    assert convert(array, [canonical, None]) == [canonical, None]
    for bad in ("not-a-uuid", 7):
        with pytest.raises(ValueConversionError):
            convert({"code": "UUID"}, bad)


def test_bytes_from_base64() -> None:
    assert convert({"code": "BYTES"}, base64.b64encode(b"\x00\xff").decode()) == b"\x00\xff"
    with pytest.raises(ValueConversionError, match=r"cannot convert '\*\*\*'"):
        convert({"code": "BYTES"}, "***")


def test_date_to_days_since_epoch() -> None:
    assert convert({"code": "DATE"}, "1970-01-01") == 0
    assert convert({"code": "DATE"}, "2020-01-02") == 18263
    assert convert({"code": "DATE"}, "0001-01-01") == -719162
    with pytest.raises(ValueConversionError, match="2020-02-30"):
        convert({"code": "DATE"}, "2020-02-30")


def test_timestamp_keeps_microseconds() -> None:
    assert convert({"code": "TIMESTAMP"}, "2022-09-27T12:30:00.123456Z") == 1664281800123456
    assert convert({"code": "TIMESTAMP"}, "2022-09-27T14:30:00.123456+02:00") == 1664281800123456
    assert convert({"code": "TIMESTAMP"}, "2022-09-27T12:30:00.123456000Z") == 1664281800123456
    assert convert({"code": "TIMESTAMP"}, "1970-01-01T00:00:00Z") == 0
    assert format_timestamp_micros(parse_timestamp_micros("9999-12-31T23:59:59.999999Z")) == (
        "9999-12-31T23:59:59.999999Z"
    )


@pytest.mark.parametrize(
    "text", ["2022-09-27T12:30:00.123456789Z", "2022-09-27 noon", "2022-13-01T00:00:00Z"]
)
def test_bad_timestamp_is_an_error_naming_the_value(text: str) -> None:
    with pytest.raises(ValueConversionError) as caught:
        convert({"code": "TIMESTAMP"}, text)
    assert text in str(caught.value) and "'C'" in str(caught.value)


def test_array_with_null_elements() -> None:
    spec = {"code": "ARRAY", "array_element_type": {"code": "INT64"}}
    assert convert(spec, ["1", None, "3"]) == [1, None, 3]
    assert convert(spec, []) == []
    assert convert({"code": "ARRAY", "array_element_type": {"code": "FLOAT64"}}, [None, "NaN"])[0] is None


def test_int64_that_does_not_parse_names_column_and_value() -> None:
    with pytest.raises(ValueConversionError) as caught:
        convert({"code": "INT64"}, "abc")
    assert str(caught.value).startswith("table 'T', column 'C': cannot convert 'abc'")


@pytest.mark.parametrize(
    ("spec", "value"),
    [
        ({"code": "INT64"}, "99999999999999999999"),
        ({"code": "INT64"}, True),
        ({"code": "BOOL"}, "true"),
        ({"code": "STRING"}, 5),
        ({"code": "FLOAT64"}, "1.5"),
        ({"code": "ARRAY", "array_element_type": {"code": "INT64"}}, "1,2"),
        ({"code": "ARRAY", "array_element_type": {"code": "INT64"}}, ["x"]),
    ],
)
def test_values_of_the_wrong_shape_are_errors_not_coercions(spec: dict[str, Any], value: Any) -> None:
    with pytest.raises(ValueConversionError):
        convert(spec, value)


@pytest.mark.parametrize("code", ["INTERVAL", "STRUCT", "INT"])
def test_unknown_type_names_table_column_and_type(code: str) -> None:
    with pytest.raises(UnsupportedTypeError) as caught:
        converter(SpannerType.from_json({"code": code}), "Orders", "Amount")
    assert str(caught.value) == f"table 'Orders', column 'Amount': unsupported Spanner type '{code}'"
    with pytest.raises(UnsupportedTypeError):
        avro_type(SpannerType.from_json({"code": code}), "Orders", "Amount")
