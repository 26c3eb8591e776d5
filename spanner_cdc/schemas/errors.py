"""Errors raised by the event contract.

They carry enough context (table, column, value) for one clear line to the user: a change that
cannot be represented must stop the pipeline loudly rather than be dropped or coerced.
"""

from __future__ import annotations

from spanner_cdc.errors import SpannerCdcError


class ContractError(SpannerCdcError):
    """Base class: input that cannot be turned into a contract-conforming event."""


class UnsupportedTypeError(ContractError):
    """A column's Spanner type has no mapping in the contract."""

    def __init__(self, table: str, column: str, spanner_type: object) -> None:
        super().__init__(f"table {table!r}, column {column!r}: unsupported Spanner type {spanner_type!r}")
        self.table = table
        self.column = column
        self.spanner_type = spanner_type


class ValueConversionError(ContractError):
    """A change-record value does not parse as its column's declared type."""

    def __init__(self, table: str, column: str, value: object, reason: str) -> None:
        super().__init__(f"table {table!r}, column {column!r}: cannot convert {value!r}: {reason}")
        self.table = table
        self.column = column
        self.value = value
        self.reason = reason


class DecodeError(ContractError):
    """Bytes that are not a decodable single-object-encoded event.

    ``reason`` is a short machine-friendly tag (``bad-magic``, ``unknown-fingerprint``,
    ``truncated``, ``corrupt``) so a consumer can quarantine with it.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
