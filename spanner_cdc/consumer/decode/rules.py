"""What a decoded message must satisfy before any sink sees it.

A message that decodes under a valid schema can still lie: name another table than its topic
or its writer schema, use the replica's reserved names, carry sort keys that are malformed or
far in the future (a row frozen forever, the dedupe horizon pushed past everything), hold values
a sink cannot store (a NUMERIC of 39 digits, a UUID column holding other text, JSON with ``NaN``
or a lone surrogate, a PG_NUMERIC ``sNaN``), or be a watermark that declares partitions that do
not exist (the consistent cut frozen, or moved to 9999-12-31). Every rule here raises
:class:`DecodeError` with a reason tag; the decoder turns that into a quarantine
row, so a bad message never reaches a sink and never stops the query.

An event's rules are checked over a share's events at once, as Arrow expressions over the
columns they were read into (:class:`EventRows`); :func:`broken_rules` gives each event that
breaks one the reason of the first it breaks, in the order they are listed there.
"""

from __future__ import annotations

import decimal
import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spanner_cdc.consumer.decode.table_version import PayloadColumn, TableVersion
from spanner_cdc.schemas.avro_steps import UNION_BRANCH
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
CHANGE_TYPES = {"INSERT": False, "UPDATE": False, "DELETE": True}
#: Logical types whose values a sink parses: an event of a table version with such a column
#: (or an array of them) has those values checked one by one, for DuckDB and PostgreSQL alike.
#: NUMERIC (decimal(38, 9): below 10^29 in magnitude) is bounded by reading it: the columns
#: reader refuses a decimal of 38 digits or more (``OverflowError``, a ``bad-value``).
_CHECKED_TYPES = ("json", "number", "uuid")
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


#: One item of ``sort_keys`` (the contract's union ["string", "long"]) as the columns reader reads
#: a union: the branch taken, and the value in the field of its branch.
STRING_BRANCH, LONG_BRANCH = 0, 1
SORT_KEY_ITEM = pa.struct(
    [(UNION_BRANCH, pa.int8()), (str(STRING_BRANCH), pa.string()), (str(LONG_BRANCH), pa.int64())]
)
#: The branch of each of the four sort keys: [commit micros, tx id, record sequence, mod index].
SORT_KEY_BRANCHES = (LONG_BRANCH, STRING_BRANCH, STRING_BRANCH, LONG_BRANCH)


@dataclass(frozen=True)
class EventRows:
    """Events of one writer schema as the rules read them: ``columns`` (``events.gate_type``:
    the envelope, ``source_metadata``, the payload and ``sort_keys`` as :data:`SORT_KEY_ITEM`),
    the topic each was read from, and each one's table version (a number into ``versions``)."""

    columns: pa.StructArray
    topics: pa.Array
    versions: tuple[TableVersion, ...]
    version_numbers: pa.Array

    @functools.cached_property
    def tables(self) -> pa.DictionaryArray:
        """Each event's ``object``, dictionary-encoded: the rules about its table are checked
        once per distinct table."""
        return pc.dictionary_encode(self.field("object"))

    def field(self, *path: str) -> pa.Array:
        """A field of the columns, nulls of the structs it is in included."""
        array: pa.Array = self.columns
        for name in path:
            array = pc.struct_field(array, name)
        return array


Broken = Iterator[tuple[int, DecodeError]]


def broken_rules(rows: EventRows, topics: Topics, now_micros: int) -> dict[int, DecodeError]:
    """Each row of ``rows`` that breaks a rule → the reason of the first it breaks: its topic,
    its table, its envelope, its sort keys, its values."""
    broken: dict[int, DecodeError] = {}
    rules: tuple[Callable[[], Broken], ...] = (
        lambda: _own_topic(rows, topics),
        lambda: _own_table(rows),
        lambda: _envelope(rows),
        lambda: _sort_keys(rows, now_micros),
        lambda: _values(rows),
    )
    for rule in rules:
        for row, error in rule():
            broken.setdefault(row, error)
    return broken


def _failing(holds: pa.Array) -> list[int]:
    """The rows where ``holds`` is false or null."""
    return pc.indices_nonzero(pc.invert(pc.fill_null(holds, False))).to_pylist()  # type: ignore[no-any-return]


def _own_topic(rows: EventRows, topics: Topics) -> Broken:
    """Each event is on its table's topic, and names a table the sinks can hold."""
    tables = rows.tables
    expected: list[str | None] = []
    refused: dict[int, DecodeError] = {}
    for number, table in enumerate(tables.dictionary.to_pylist()):
        try:
            expected.append(own_topic(topics, table))
        except DecodeError as exc:
            expected.append(None)
            refused[number] = exc
    named = pa.array(expected, pa.string()).take(tables.indices)
    for row in _failing(pc.equal(named, rows.topics)):
        number = tables.indices[row].as_py()
        table, topic = tables.dictionary[number].as_py(), rows.topics[row].as_py()
        yield (
            row,
            refused.get(number)
            or DecodeError(
                "wrong-topic",
                f"an event of table {table!r} on topic {topic!r} (its topic is {expected[number]!r})",
            ),
        )


def _own_table(rows: EventRows) -> Broken:
    """Each event names the table its writer schema describes (the schema's namespace)."""
    tables = rows.tables
    namespaces = pa.array([table_namespace(str(t)) for t in tables.dictionary.to_pylist()], pa.string())
    described = pa.array([version.namespace for version in rows.versions], pa.string())
    same = pc.equal(namespaces.take(tables.indices), described.take(rows.version_numbers))
    for row in _failing(same):
        table = tables.dictionary[tables.indices[row].as_py()].as_py()
        namespace = rows.versions[rows.version_numbers[row].as_py()].namespace
        yield (
            row,
            DecodeError("wrong-table", f"an event of table {table!r} in a writer schema of {namespace!r}"),
        )


def _envelope(rows: EventRows) -> Broken:
    """A uuid of 1 to :data:`MAX_UUID_CHARS` characters; a change type that agrees with
    ``is_deleted``."""
    uuids = rows.field("uuid")
    chars = pc.utf8_length(uuids)
    for row in _failing(pc.and_(pc.greater(chars, 0), pc.less_equal(chars, MAX_UUID_CHARS))):
        yield row, DecodeError("bad-envelope", f"uuid {uuids[row].as_py()!r:.80} is empty or too long")
    change_type, is_deleted = (
        rows.field("source_metadata", "change_type"),
        rows.field("source_metadata", "is_deleted"),
    )
    known = pc.is_in(change_type, value_set=pa.array(list(CHANGE_TYPES)))
    agrees = pc.equal(pc.equal(change_type, "DELETE"), is_deleted)
    for row in _failing(pc.and_(known, agrees)):
        yield (
            row,
            DecodeError(
                "bad-envelope",
                f"change_type {change_type[row].as_py()!r:.40} with is_deleted {is_deleted[row].as_py()!r}",
            ),
        )


def _sort_keys(rows: EventRows, now_micros: int) -> Broken:
    """``sort_keys`` are four, ``[long, string, string, long]``, the last not negative, equal to
    ``source_metadata``'s commit timestamp (micros), tx id, record sequence (a missing one is
    "") and mod index, and the commit timestamp after 1970 and at most
    :data:`MAX_FUTURE_MICROS` ahead of this machine's clock."""
    sort_keys = rows.field("sort_keys")
    counts = pc.list_value_length(sort_keys)
    four = pc.equal(counts, len(SORT_KEY_BRANCHES))
    for row in _failing(four):
        yield row, DecodeError("bad-sort-keys", f"{counts[row].as_py()} sort keys, expected 4")
    rows_of_four = pc.indices_nonzero(four)
    items = [pc.list_element(sort_keys.take(rows_of_four), index) for index in range(len(SORT_KEY_BRANCHES))]
    branches = [item.field(UNION_BRANCH) for item in items]

    def failing(holds: pa.Array) -> list[int]:
        return [rows_of_four[row].as_py() for row in _failing(holds)]

    def keys_of(row: int) -> list[Any]:
        return [_branch_value(item) for item in sort_keys[row].as_py()]

    typed = [pc.equal(branch, SORT_KEY_BRANCHES[index]) for index, branch in enumerate(branches[:3])]
    for row in failing(pc.and_(pc.and_(typed[0], typed[1]), typed[2])):
        yield (
            row,
            DecodeError(
                "bad-sort-keys", f"sort keys {keys_of(row)!r:.120} are not [long, string, string, long]"
            ),
        )
    mod_index = items[3].field(str(LONG_BRANCH))
    for row in failing(pc.and_(pc.equal(branches[3], LONG_BRANCH), pc.greater_equal(mod_index, 0))):
        yield (
            row,
            DecodeError("bad-sort-keys", f"mod index {keys_of(row)[3]!r:.40} is not a non-negative long"),
        )
    metadata = [rows.field("source_metadata", name).take(rows_of_four) for name in _STATED]
    stated = (
        pc.cast(metadata[0], pa.int64()),
        pc.fill_null(metadata[1], ""),
        pc.fill_null(metadata[2], ""),
        metadata[3],
    )
    values = [item.field(str(SORT_KEY_BRANCHES[index])) for index, item in enumerate(items)]
    same = [pc.equal(value, stated[index]) for index, value in enumerate(values)]
    for row in failing(pc.and_(pc.and_(same[0], same[1]), pc.and_(same[2], same[3]))):
        yield row, DecodeError("bad-sort-keys", "sort keys disagree with source_metadata")
    micros = values[0]
    plausible = pc.and_(pc.greater(micros, 0), pc.less_equal(micros, now_micros + MAX_FUTURE_MICROS))
    for row in failing(plausible):
        yield (
            row,
            DecodeError("bad-sort-keys", f"commit timestamp {keys_of(row)[0]} µs is not a plausible one"),
        )


#: The fields of ``source_metadata`` the sort keys state again, in their order.
_STATED = ("commit_timestamp", "tx_id", "record_sequence", "mod_index")


def _branch_value(item: Mapping[str, Any]) -> Any:
    """A union item's Python value (:data:`SORT_KEY_ITEM`)."""
    return item[str(item[UNION_BRANCH])]


def _values(rows: EventRows) -> Broken:
    """The payload's values, then ``old_values``', of each column whose values are checked
    (:func:`value_checked_columns`), are ones a sink can hold: the first that is not."""
    for number, version in enumerate(rows.versions):
        checked = value_checked_columns(version)
        if not checked:
            continue
        of_version = pc.indices_nonzero(pc.equal(rows.version_numbers, number))
        values = [
            rows.field(*parent, column.field).take(of_version).to_pylist()
            for parent in (("payload",), ("source_metadata", "old_values"))
            for column, _ in checked
        ]
        kinds = [(column, kind) for _ in range(2) for column, kind in checked]
        for index, row in enumerate(of_version.to_pylist()):
            for (column, kind), column_values in zip(kinds, values, strict=True):
                value = column_values[index]
                bad = next(
                    (
                        item
                        for item in (value if isinstance(value, list) else [value])
                        if item is not None and not _storable(kind, item)
                    ),
                    None,
                )
                if bad is not None:
                    yield (
                        row,
                        DecodeError(
                            "bad-value",
                            f"column {column.name!r}: {bad!r:.80} is not a {kind} a sink can hold",
                        ),
                    )
                    break


def _logical_type(avro: Any) -> Any:
    """A column's logical type, or its array elements' (a nullable union of one type)."""
    if isinstance(avro, dict) and avro.get("type") == "array":
        items = avro.get("items")
        branches = [b for b in items if b != "null"] if isinstance(items, list) else [items]
        return _logical_type(branches[0]) if len(branches) == 1 else None
    return avro.get("logicalType") if isinstance(avro, dict) else None


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
