"""What a decoded message must satisfy before any sink sees it.

A message that decodes under a valid schema can still lie: name another table than its topic
or its writer schema, use the replica's reserved names, carry sort keys that are malformed or
far in the future (a row frozen forever, the dedupe horizon pushed past everything), hold values
a sink cannot store (a NUMERIC of 39 digits, a UUID column holding other text, JSON with ``NaN``
or a lone surrogate, a PG_NUMERIC ``sNaN``), or be a watermark that declares partitions that do
not exist (the consistent cut frozen, or moved to 9999-12-31). Every rule here raises
:class:`DecodeError` with a reason tag; the decoder turns that into a quarantine
row, so a bad message never reaches a sink and never stops the query.
"""

from __future__ import annotations

import decimal
import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from spanner_cdc.consumer.decode.table_version import PayloadColumn, TableVersion
from spanner_cdc.schemas.errors import DecodeError
from spanner_cdc.schemas.table import table_namespace
from spanner_cdc.schemas.topics import TopicNameError, Topics
from spanner_cdc.schemas.watermark import Watermark

#: How far ahead of this machine's clock a commit timestamp may be (clock skew).
MAX_FUTURE_MICROS = 3_600 * 1_000_000
#: How far ahead of this machine's clock a watermark may be. A watermark is a time up to which
#: every change was read from Spanner already, so it is never ahead of the true time: only
#: this machine's clock skew separates them, well under a minute for an NTP-kept clock. The
#: bound is how far forged watermarks on every partition could move the consistent cut.
MAX_WATERMARK_AHEAD_MICROS = 60 * 1_000_000
#: The longest uuid an event may carry (the producer's are 36 characters).
MAX_UUID_CHARS = 64
#: The longest name Spanner allows (table, column, named schema: 128 characters each).
MAX_NAME_CHARS = 128
#: ``$`` never occurs in a Spanner identifier; the sinks use it for their own names.
_RESERVED = re.compile(r"[$\x00/\\]")
#: (commit micros, transaction id, record sequence, mod index), compared element-wise.
SortKey = tuple[int, str, str, int]
CHANGE_TYPES = {"INSERT": False, "UPDATE": False, "DELETE": True}
#: Logical types whose values a sink parses or bounds: an event of a table version with such a
#: column (or an array of them) has those values checked one by one, for DuckDB and PostgreSQL
#: alike (the columnar gate hands such versions to the record gate).
_CHECKED_TYPES = ("json", "number", "uuid", "decimal")
#: NUMERIC is decimal(38, 9): below 10^29 in magnitude.
_NUMERIC_LIMIT = decimal.Decimal("1e29")
#: PostgreSQL's NUMERIC (and Spanner's PG_NUMERIC): digits before and after the point.
_PG_NUMERIC_DIGITS = (131_072, 16_383)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def check_name(what: str, name: object) -> None:
    """A table, schema or column name the sinks can hold, or DecodeError ``bad-name``."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS or _RESERVED.search(name):
        raise DecodeError("bad-name", f"{what} {name!r:.200} is not a name Spanner could have given")


def check_version(version: TableVersion) -> None:
    """Column names of a table version (checked once per writer schema and key)."""
    for column in version.columns:
        check_name("column", column.name)


def check_event(
    topics: Topics, topic: str, record: Mapping[str, Any], version: TableVersion, now_micros: int
) -> SortKey:
    """The event's sort key, once every rule holds; DecodeError naming the first that does not."""
    table = record["object"]
    expected = own_topic(topics, table)
    if expected != topic:
        raise DecodeError(
            "wrong-topic", f"an event of table {table!r} on topic {topic!r} (its topic is {expected!r})"
        )
    if table_namespace(str(table)) != version.namespace:
        raise DecodeError(
            "wrong-table", f"an event of table {table!r} in a writer schema of {version.namespace!r}"
        )
    if not record["uuid"] or len(record["uuid"]) > MAX_UUID_CHARS:
        raise DecodeError("bad-envelope", f"uuid {record['uuid']!r:.80} is empty or too long")
    metadata = record["source_metadata"]
    deleted = CHANGE_TYPES.get(metadata["change_type"])
    if deleted is None or deleted != metadata["is_deleted"]:
        raise DecodeError(
            "bad-envelope",
            f"change_type {metadata['change_type']!r:.40} with is_deleted {metadata['is_deleted']!r}",
        )
    order = _sort_key(record["sort_keys"], metadata, now_micros)
    checked = value_checked_columns(version)
    if checked:
        _check_values(checked, record["payload"])
        if metadata["old_values"] is not None:
            _check_values(checked, metadata["old_values"])
    return order


@functools.lru_cache(maxsize=4_096)
def own_topic(topics: Topics, table: object) -> str:
    """The topic a table's events belong on, once its name is checked: per table, not per
    event (a batch has few tables and many events; failures are not cached)."""
    for part in str(table).split("."):
        check_name("table", part)
    try:
        return topics.event(str(table))
    except TopicNameError as exc:
        raise DecodeError("bad-name", str(exc)) from None


@functools.lru_cache(maxsize=4_096)
def value_checked_columns(version: TableVersion) -> tuple[tuple[PayloadColumn, str], ...]:
    """The columns of ``version`` whose values are checked, with their logical type (many
    versions have none: then an event's values are not looked at)."""
    found = []
    for column in version.columns:
        kind = _logical_type(column.type.avro)
        if kind in _CHECKED_TYPES:
            found.append((column, kind))
    return tuple(found)


def _logical_type(avro: Any) -> Any:
    """A column's logical type, or its array elements' (a nullable union of one type)."""
    if isinstance(avro, dict) and avro.get("type") == "array":
        items = avro.get("items")
        branches = [b for b in items if b != "null"] if isinstance(items, list) else [items]
        return _logical_type(branches[0]) if len(branches) == 1 else None
    return avro.get("logicalType") if isinstance(avro, dict) else None


def _sort_key(
    sort_keys: Sequence[Any], metadata: Mapping[str, Any], now_micros: int
) -> tuple[int, str, str, int]:
    """[commit micros, tx id, record sequence, mod index], typed and agreeing with source_metadata."""
    if len(sort_keys) != 4:
        raise DecodeError("bad-sort-keys", f"{len(sort_keys)} sort keys, expected 4")
    micros, tx_id, sequence, mod_index = sort_keys
    if not (isinstance(micros, int) and isinstance(tx_id, str) and isinstance(sequence, str)):
        raise DecodeError(
            "bad-sort-keys", f"sort keys {list(sort_keys)!r:.120} are not [long, string, string, long]"
        )
    if not isinstance(mod_index, int) or mod_index < 0:
        raise DecodeError("bad-sort-keys", f"mod index {mod_index!r:.40} is not a non-negative long")
    stated = (
        metadata["commit_timestamp"],  # micros: read as a number (consumer.decode.gate)
        metadata["tx_id"] or "",
        metadata["record_sequence"] or "",
        metadata["mod_index"],
    )
    if (micros, tx_id, sequence, mod_index) != stated:
        raise DecodeError("bad-sort-keys", "sort keys disagree with source_metadata")
    if micros <= 0 or micros > now_micros + MAX_FUTURE_MICROS:
        raise DecodeError("bad-sort-keys", f"commit timestamp {micros} µs is not a plausible one")
    return micros, tx_id, sequence, mod_index


def _check_values(checked: Sequence[tuple[PayloadColumn, str]], values: Mapping[str, Any]) -> None:
    for column, kind in checked:
        value = values.get(column.field)
        for item in value if isinstance(value, list) else [value]:
            if item is not None and not _storable(kind, item):
                raise DecodeError(
                    "bad-value", f"column {column.name!r}: {item!r:.80} is not a {kind} a sink can hold"
                )


def _storable(kind: str, value: Any) -> bool:
    """Whether both replicas (and the changelog) can hold ``value`` of logical type ``kind``."""
    try:
        if kind == "json":
            parsed = json.loads(value, parse_constant=_no_constant)
            json.dumps(parsed, ensure_ascii=False).encode()  # a lone surrogate does not encode
            return True
        if kind == "uuid":
            return isinstance(value, str) and _UUID.fullmatch(value) is not None
        number = decimal.Decimal(value)
        if kind == "decimal":
            return number.is_finite() and number.copy_abs() < _NUMERIC_LIMIT  # abs() rounds to 28 digits
        if number.is_snan():
            return False
        if not number.is_finite():
            return True  # NaN and ±Infinity: PostgreSQL's NUMERIC holds them
        before, after = max(number.adjusted() + 1, 0), max(-int(number.as_tuple().exponent), 0)
        return before <= _PG_NUMERIC_DIGITS[0] and after <= _PG_NUMERIC_DIGITS[1]
    except (ValueError, TypeError, UnicodeError, RecursionError, decimal.InvalidOperation):
        return False


def _no_constant(name: str) -> None:
    """JSON's ``NaN`` and ``Infinity`` are not JSON: Spanner never writes them, PostgreSQL refuses them."""
    raise ValueError(f"{name} is not JSON")


def check_watermark(
    watermark: Watermark, topic: str, partition: int, partition_counts: Mapping[str, int], now_micros: int
) -> None:
    """A watermark agrees with the broker: its topics exist with at least the partitions it
    lists, it lists the topic it is on, and it is not ahead of this machine's clock by more
    than the skew allowed."""
    if watermark.watermark_micros <= 0:
        raise DecodeError("bad-watermark", f"watermark {watermark.watermark_micros} µs is not a time")
    ahead = watermark.watermark_micros - now_micros
    if ahead > MAX_WATERMARK_AHEAD_MICROS:
        raise DecodeError(
            "bad-watermark",
            f"watermark {watermark.watermark_micros} µs is {ahead / 1e6:.0f} s ahead of this machine's clock "
            f"(at most {MAX_WATERMARK_AHEAD_MICROS // 1_000_000} s of clock skew is taken)",
        )
    if topic not in watermark.topics or partition >= watermark.topics[topic]:
        raise DecodeError("bad-watermark", f"a watermark on {topic}[{partition}] that does not list it")
    for listed, count in watermark.topics.items():
        existing = partition_counts.get(listed)
        if existing is None or not 0 < count <= existing:
            raise DecodeError(
                "bad-watermark", f"lists {listed!r:.100} with {count} partitions; the broker has {existing}"
            )
