"""Spanner column types → Avro types, change-record JSON values → Avro values, and back.

Change records carry values as JSON (INT64 as a decimal string, BYTES as base64, TIMESTAMP as
RFC 3339 text, FLOAT64 as a number or "NaN"/"Infinity"/"-Infinity"). Converters return the Avro
*physical* values (days, microseconds, two's-complement decimal bytes) so fastavro and any other
Avro implementation encode them without guessing, and so precision problems surface here, named,
instead of as silent rounding inside an encoder.
"""

from __future__ import annotations

import base64
import binascii
import decimal
import json
import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spanner_cdc.schemas import row_values
from spanner_cdc.schemas.errors import UnsupportedTypeError, ValueConversionError
from spanner_cdc.schemas.timestamps import (
    date_from_days,
    days_since_epoch,
    format_timestamp_micros,
    parse_timestamp_micros,
)

AvroType = str | dict[str, Any] | list[Any]
Converter = Callable[[Any], Any]

NUMERIC_PRECISION = 38
NUMERIC_SCALE = 9
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NUMERIC_CONTEXT = decimal.Context(prec=NUMERIC_PRECISION + 40)
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


@dataclass(frozen=True)
class SpannerType:
    """A column type as change records describe it: ``{"code": ..., ...}``.

    ``annotation`` distinguishes PostgreSQL-dialect types that share a code (PG_NUMERIC is
    ``NUMERIC`` + annotation), ``element`` is set for ARRAY.
    """

    code: str
    annotation: str | None = None
    element: SpannerType | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | str) -> SpannerType:
        """Parse the ``type`` of a ``column_types`` entry (a JSON object or its text)."""
        spec = json.loads(raw) if isinstance(raw, str) else raw
        element = spec.get("array_element_type")
        return cls(
            code=str(spec["code"]),
            annotation=spec.get("type_annotation") or None,
            element=cls.from_json(element) if element is not None else None,
        )

    def to_json(self) -> dict[str, Any]:
        """The canonical JSON form, used for ``schema_key``."""
        out: dict[str, Any] = {"code": self.code}
        if self.annotation:
            out["type_annotation"] = self.annotation
        if self.element is not None:
            out["array_element_type"] = self.element.to_json()
        return out

    def __str__(self) -> str:
        name = self.annotation or self.code
        return f"ARRAY<{self.element}>" if self.element is not None else name


def avro_type(spanner_type: SpannerType, table: str, column: str) -> AvroType:
    """The Avro type of a non-null value of ``spanner_type`` (docs/design.md §3, Types)."""
    if spanner_type.element is not None and spanner_type.code == "ARRAY":
        return {"type": "array", "items": ["null", avro_type(spanner_type.element, table, column)]}
    mapped = _AVRO_TYPES.get(_type_name(spanner_type))
    if mapped is None:
        raise UnsupportedTypeError(table, column, str(spanner_type))
    return mapped


def converter(spanner_type: SpannerType, table: str, column: str) -> Converter:
    """A function turning one change-record JSON value into the Avro value (None stays None)."""
    if spanner_type.element is not None and spanner_type.code == "ARRAY":
        element = converter(spanner_type.element, table, column)

        def convert_array(value: Any) -> Any:
            if value is None:
                return None
            if not isinstance(value, list):
                raise ValueConversionError(table, column, value, "expected a JSON array")
            return [element(item) for item in value]

        return convert_array
    parse = _PARSERS.get(_type_name(spanner_type))
    if parse is None:
        raise UnsupportedTypeError(table, column, str(spanner_type))

    def convert(value: Any) -> Any:
        if value is None:
            return None
        try:
            return parse(value)
        except (ValueError, TypeError, ArithmeticError, binascii.Error) as exc:
            raise ValueConversionError(table, column, value, str(exc) or type(exc).__name__) from exc

    return convert


def row_value_kind(spanner_type: SpannerType) -> int:
    """How ``schemas.row_values`` reads this type's common forms in C (``OTHER``: it hands every
    value to :func:`converter`'s function)."""
    if spanner_type.element is not None and spanner_type.code == "ARRAY":
        return row_values.OTHER
    return _ROW_VALUE_KINDS.get(_type_name(spanner_type), row_values.OTHER)


def json_formatter(spanner_type: SpannerType) -> Converter:
    """The inverse of :func:`converter`: one Avro value → the change-record JSON form of it (None
    stays None), as JSON events carry column values (``schemas.json_events``)."""
    if spanner_type.element is not None and spanner_type.code == "ARRAY":
        element = json_formatter(spanner_type.element)
        return lambda value: None if value is None else [element(item) for item in value]
    format_value = _FORMATTERS.get(_type_name(spanner_type), _same)
    return lambda value: None if value is None else format_value(value)


def _type_name(spanner_type: SpannerType) -> str:
    return spanner_type.annotation if spanner_type.annotation else spanner_type.code


def _parse_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("expected a JSON boolean")
    return value


def _parse_int64(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError("expected an integer or its decimal text")
    number = int(value) if isinstance(value, int) else int(value.strip(), 10)
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise ValueError("out of INT64 range")
    return number


def _parse_float(value: Any) -> float:
    if isinstance(value, str):
        if value not in _SPECIAL_FLOATS:
            raise ValueError('expected a number, "NaN", "Infinity" or "-Infinity"')
        return _SPECIAL_FLOATS[value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError("expected a JSON number")
    return float(value)


def _parse_numeric(value: Any) -> bytes:
    """NUMERIC → Avro decimal(38, 9): the unscaled value as big-endian two's complement."""
    number = _parse_decimal(value)
    if not number.is_finite():
        raise ValueError("NUMERIC must be finite")
    unscaled_decimal = _NUMERIC_CONTEXT.scaleb(number, decimal.Decimal(NUMERIC_SCALE))
    if unscaled_decimal != unscaled_decimal.to_integral_value():
        raise ValueError(f"more than {NUMERIC_SCALE} digits after the decimal point")
    unscaled = int(unscaled_decimal)
    if abs(unscaled) >= 10**NUMERIC_PRECISION:
        raise ValueError(f"exceeds NUMERIC precision {NUMERIC_PRECISION}, scale {NUMERIC_SCALE}")
    return unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)


def _parse_pg_numeric(value: Any) -> str:
    """PG_NUMERIC is arbitrary precision (and may be NaN): kept as its exact decimal text."""
    number = _parse_decimal(value)
    if number.is_infinite():
        raise ValueError("PG_NUMERIC cannot be infinite")
    return "NaN" if number.is_nan() else str(value).strip()


def _parse_decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | decimal.Decimal):
        raise TypeError("expected decimal text")
    try:
        return decimal.Decimal(value.strip() if isinstance(value, str) else value)
    except decimal.InvalidOperation as exc:
        raise ValueError("not a decimal number") from exc


def _parse_string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("expected a JSON string")
    return value


def _parse_json(value: Any) -> str:
    """JSON columns arrive as JSON text; an already-parsed value is re-serialised compactly."""
    if isinstance(value, str):
        json.loads(value)
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _parse_bytes(value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError("expected base64 text")
    return base64.b64decode(value, validate=True)


def _parse_uuid(value: Any) -> str:
    """The canonical form (lower case, 8-4-4-4-12), whatever form Spanner sent."""
    if not isinstance(value, str):
        raise TypeError("expected UUID text")
    return str(uuid.UUID(value))


def _parse_date(value: Any) -> int:
    if not isinstance(value, str) or len(value) != 10:
        raise ValueError("expected YYYY-MM-DD")
    return days_since_epoch(value)


_DECIMAL_38_9 = {
    "type": "bytes",
    "logicalType": "decimal",
    "precision": NUMERIC_PRECISION,
    "scale": NUMERIC_SCALE,
}
_JSON_STRING = {"type": "string", "logicalType": "json"}
#: Avro's own logical type: Kafka Connect, Flink and Java readers know it.
_UUID_STRING = {"type": "string", "logicalType": "uuid"}

_AVRO_TYPES: dict[str, AvroType] = {
    "BOOL": "boolean",
    "INT64": "long",
    "FLOAT64": "double",
    "FLOAT32": "float",
    "NUMERIC": _DECIMAL_38_9,
    "PG_NUMERIC": {"type": "string", "logicalType": "number"},
    "STRING": "string",
    "JSON": _JSON_STRING,
    "PG_JSONB": _JSON_STRING,
    "BYTES": "bytes",
    "DATE": {"type": "int", "logicalType": "date"},
    "TIMESTAMP": {"type": "long", "logicalType": "timestamp-micros"},
    "PROTO": "bytes",
    "ENUM": "long",
    "UUID": _UUID_STRING,
}

_PARSERS: dict[str, Converter] = {
    "BOOL": _parse_bool,
    "INT64": _parse_int64,
    "FLOAT64": _parse_float,
    "FLOAT32": _parse_float,
    "NUMERIC": _parse_numeric,
    "PG_NUMERIC": _parse_pg_numeric,
    "STRING": _parse_string,
    "JSON": _parse_json,
    "PG_JSONB": _parse_json,
    "BYTES": _parse_bytes,
    "DATE": _parse_date,
    "TIMESTAMP": parse_timestamp_micros,
    "PROTO": _parse_bytes,
    "ENUM": _parse_int64,
    "UUID": _parse_uuid,
}
#: The types whose parser above ``row_values`` also has in C, for the forms Spanner sends.
_ROW_VALUE_KINDS = {
    "STRING": row_values.STRING,
    "INT64": row_values.INT64,
    "ENUM": row_values.INT64,
    "TIMESTAMP": row_values.TIMESTAMP,
    "FLOAT64": row_values.FLOAT,
    "FLOAT32": row_values.FLOAT,
    "BOOL": row_values.BOOL,
}


def _same(value: Any) -> Any:
    return value


def _format_float(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _format_numeric(value: bytes) -> str:
    unscaled = int.from_bytes(value, "big", signed=True)
    number = decimal.Decimal(unscaled).scaleb(-NUMERIC_SCALE, _NUMERIC_CONTEXT).normalize(_NUMERIC_CONTEXT)
    return format(number, "f")


def _format_bytes(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


_FORMATTERS: dict[str, Converter] = {
    "INT64": str,
    "ENUM": str,
    "FLOAT64": _format_float,
    "FLOAT32": _format_float,
    "NUMERIC": _format_numeric,
    "BYTES": _format_bytes,
    "PROTO": _format_bytes,
    "DATE": lambda days: date_from_days(days).isoformat(),
    "TIMESTAMP": format_timestamp_micros,
}
