"""The gate's way through the common case: a share's events of one writer schema read straight
into Arrow columns and checked by Arrow, not record by record.

The record gate (consumer.decode.gate) makes a Python record of every message and checks
its rules (consumer.decode.rules) one event at a time, and the outline is then made from those
records; reading the events into columns (``avro_steps.ColumnsReader``), checking them with
Arrow and outlining from the same columns takes a fraction of that time, events made included,
and the sinks take the accepted events' rows from the same columns (change_rows): an event read
here is decoded once.

This path only ever *accepts*: a message it accepts is one the record gate accepts, with the
same table version and sort key; everything else — a message it cannot read, a rule it sees
broken, a kind it does not take (JSON, the Schema Registry's framing, watermarks, tombstones,
a schema or name the batch's context lacks, a table version with JSON, PG_NUMERIC, NUMERIC or
UUID columns, whose values the rules check) — is handed back, and the record gate reads it and
gives the reason. What makes the two agree:

- the columns reader fails wherever the record reader fails (invalid UTF-8, a time outside the
  years 1-9999, an impossible union branch, bytes left over, also in the fields it passes over:
  tests/unit/consumer/decode/test_avro_columns.py); the messages it cannot read are handed back
  (:func:`_readable`);
- each rule of ``rules.check_event`` is checked here as an Arrow expression over the same
  values, and the table version comes from the same lookup;
- tests/unit/consumer/decode/test_columnar_gate.py reads valid and damaged messages both ways and compares the
  events, reasons and outlines.

The events it accepts carry no record (``DecodedEvent.known_record``), only their row of the
columns read (``DecodedEvent.read_into``); the few that want a record read it when they ask.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spanner_cdc.consumer.decode.change_rows import event_type
from spanner_cdc.consumer.decode.decoded import DecodedEvent
from spanner_cdc.consumer.decode.outline_rows import EVENT, OUTLINE_SCHEMA, TRANSACTION_FIELDS
from spanner_cdc.consumer.decode.rules import (
    CHANGE_TYPES,
    MAX_FUTURE_MICROS,
    MAX_UUID_CHARS,
    own_topic,
    value_checked_columns,
)
from spanner_cdc.consumer.decode.table_version import TableVersion, payload_columns
from spanner_cdc.schemas.avro_steps import UNION_BRANCH, ColumnsReader
from spanner_cdc.schemas.errors import ContractError, DecodeError
from spanner_cdc.schemas.table import table_namespace
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import is_watermark
from spanner_cdc.schemas.wire import HEADER_LENGTH, MAGIC, WriterSchema, read_fingerprint

#: One item of ``sort_keys`` (the contract's union ["string", "long"]): the branch taken, and the
#: value in the column of its branch (``ColumnsReader`` reads a union as such a struct).
STRING_BRANCH, LONG_BRANCH = 0, 1
SORT_KEY_ITEM = pa.struct(
    [(UNION_BRANCH, pa.int8()), (str(STRING_BRANCH), pa.string()), (str(LONG_BRANCH), pa.int64())]
)
#: The branch of each of the four sort keys: [commit micros, tx id, record sequence, mod index].
SORT_KEY_BRANCHES = (LONG_BRANCH, STRING_BRANCH, STRING_BRANCH, LONG_BRANCH)


def gate_type(writer: WriterSchema) -> pa.StructType:
    """What the gate reads of an event of ``writer``: every part the sinks take
    (``change_rows.event_type`` over the writer's payload) and the sort keys the rules check.
    Read once: the sinks take the accepted events' columns from what the gate read."""
    values = pa.struct([(column.field, column.type.arrow) for column in payload_columns(writer)])
    return pa.struct([*event_type(values), ("sort_keys", pa.list_(SORT_KEY_ITEM))])


#: Messages read by one call of the columns reader: a call that fails on one message is made
#: again for the messages before it, so the part bounds what one bad message costs.
READ_PART = 1_024
#: Joins a key's column names into one value to group events by (no checked name holds it).
_NAME_JOINER = "\x00"

VersionLookup = Callable[[WriterSchema, tuple[str, ...]], TableVersion]


@dataclass(frozen=True)
class Accepted:
    """What the columnar gate took of a share's rows: the events (in their rows' order), their
    outline rows, and the numbers of the rows it handed back to the record gate (ascending)."""

    events: list[DecodedEvent]
    outlines: tuple[pa.RecordBatch, ...]
    handed_back: np.ndarray


class ColumnarGate:
    """Reads the rows of one share under the batch's context (``gate.DecodeContext``:
    its topics, clock, writer schemas and refused fingerprints)."""

    def __init__(
        self,
        topics: Topics,
        now_micros: int,
        writers: Callable[[int], WriterSchema | None],
        version: VersionLookup,
    ) -> None:
        self.topics = topics
        self.now_micros = now_micros
        self._writers = writers
        self._version = version
        self._readers: dict[bytes, tuple[WriterSchema, ColumnsReader] | None] = {}

    def read(self, rows: pa.RecordBatch | pa.Table) -> Accepted:
        """``rows`` has the Kafka columns key, value, topic, partition and offset."""
        values = _array(rows.column("value"))
        headers = pc.dictionary_encode(pc.binary_slice(values, 0, HEADER_LENGTH))
        codes = headers.indices
        accepted = np.zeros(len(values), dtype=bool)
        events: list[DecodedEvent] = []
        outlines: list[pa.RecordBatch] = []
        event_positions: list[np.ndarray] = []
        for code, header in enumerate(headers.dictionary.to_pylist()):
            known = self._reader(header)
            if known is None:
                continue
            writer, reader = known
            positions = pc.indices_nonzero(pc.fill_null(pc.equal(codes, code), False))
            readable = _readable(reader, positions, values.take(positions).to_pylist())
            taken = self._check(writer, rows, *_joined(readable)) if readable else None
            if taken is not None:
                taken_positions, share_events, outline = taken
                at = taken_positions.to_numpy()
                accepted[at] = True
                events.extend(share_events)
                outlines.append(outline)
                event_positions.append(at)
        if len(outlines) > 1:  # the events in their rows' order, not by schema
            order = np.argsort(np.concatenate(event_positions), kind="stable")
            events = [events[i] for i in order]
        return Accepted(events, tuple(outlines), np.flatnonzero(~accepted))

    def _reader(self, header: bytes | None) -> tuple[WriterSchema, ColumnsReader] | None:
        """The writer schema an event's header names and its reader of :func:`gate_type`, once
        per header; None for anything the record gate must read: a header that is not ours, a
        schema the context lacks or refuses, the watermark's, one whose values are not of those
        types."""
        if header is None or len(header) < HEADER_LENGTH or header[: len(MAGIC)] != MAGIC:
            return None
        if header not in self._readers:
            writer = self._writers(read_fingerprint(header))
            reader = None
            if writer is not None and not is_watermark(writer):
                with contextlib.suppress(TypeError, ContractError):
                    reader = ColumnsReader(writer.column_reader, gate_type(writer))
            self._readers[header] = None if writer is None or reader is None else (writer, reader)
        return self._readers[header]

    def _check(
        self,
        writer: WriterSchema,
        rows: pa.RecordBatch | pa.Table,
        positions: pa.Array,
        messages: list[bytes],
        columns: pa.StructArray,
    ) -> tuple[pa.Array, list[DecodedEvent], pa.RecordBatch] | None:
        """The rules over one schema's ``messages`` (at ``positions`` of ``rows``, read into
        ``columns``): the positions it accepts, their events and outline; None for none."""
        metadata = columns.field("source_metadata")
        keys, versions = self._versions(writer, metadata.field("primary_keys"))
        sort_keys = columns.field("sort_keys")
        ok = pc.and_(pc.is_valid(keys), pc.equal(pc.list_value_length(sort_keys), len(SORT_KEY_BRANCHES)))
        topics = _array(rows.column("topic")).take(positions)
        ok = pc.and_(ok, self._own_topics(columns.field("object"), topics, versions))
        uuid_chars = pc.utf8_length(columns.field("uuid"))
        ok = pc.and_(ok, pc.and_(pc.greater(uuid_chars, 0), pc.less_equal(uuid_chars, MAX_UUID_CHARS)))
        change_type = metadata.field("change_type")
        deletes = pc.equal(change_type, "DELETE")
        known = pc.is_in(change_type, value_set=pa.array(list(CHANGE_TYPES)))
        ok = pc.fill_null(pc.and_(ok, pc.and_(known, pc.equal(deletes, metadata.field("is_deleted")))), False)
        if not pc.any(ok).as_py():
            return None
        # sort keys: four items now, of the contract's branches and equal to source_metadata
        chosen = pc.indices_nonzero(ok)  # of ``messages``
        columns, keys = columns.filter(ok), keys.filter(ok)
        metadata, sort_keys = columns.field("source_metadata"), columns.field("sort_keys")
        micros = pc.cast(metadata.field("commit_timestamp"), pa.int64())
        stated = (
            micros,
            pc.fill_null(metadata.field("tx_id"), ""),
            pc.fill_null(metadata.field("record_sequence"), ""),
            metadata.field("mod_index"),
        )
        ok = pc.and_(pc.greater(micros, 0), pc.less_equal(micros, self.now_micros + MAX_FUTURE_MICROS))
        ok = pc.and_(ok, pc.greater_equal(stated[3], 0))
        for index, (branch, value) in enumerate(zip(SORT_KEY_BRANCHES, stated, strict=True)):
            item = pc.list_element(sort_keys, index)
            same = pc.and_(
                pc.equal(item.field(UNION_BRANCH), branch), pc.equal(item.field(str(branch)), value)
            )
            ok = pc.and_(ok, same)
        ok = pc.fill_null(ok, False)
        if not pc.any(ok).as_py():
            return None
        chosen, columns, keys = chosen.filter(ok), columns.filter(ok), keys.filter(ok)
        stated = tuple(part.filter(ok) for part in stated)
        positions = positions.take(chosen)
        taken = rows.take(positions)
        values = [messages[i] for i in chosen.to_pylist()]
        return (
            positions,
            _events(taken, values, columns, [versions[number] for number in keys.to_pylist()], stated),
            _outline(taken, columns, stated[0]),
        )

    def _versions(self, writer: WriterSchema, primary_keys: pa.Array) -> tuple[pa.Array, list[TableVersion]]:
        """Each message's table version, as a number into the list returned (null where the
        record gate must read it: a key the lookup refuses, a version whose text the rules
        parse, a name it cannot group by)."""
        joined = pc.binary_join(primary_keys, _NAME_JOINER)
        lengths = pc.list_value_length(primary_keys)
        groups = pc.dictionary_encode(joined)
        numbers: list[int | None] = []
        versions: list[TableVersion] = []
        first = pc.index_in(pa.array(range(len(groups.dictionary)), pa.int32()), value_set=groups.indices)
        for number, position in enumerate(first.to_pylist()):
            names = tuple(primary_keys[position].as_py())
            same_shape = pc.all(pc.equal(lengths.filter(pc.equal(groups.indices, number)), len(names)))
            if any(_NAME_JOINER in name for name in names) or not same_shape.as_py():
                numbers.append(None)
                continue
            try:
                version = self._version(writer, names)
            except Exception:  # the record gate reads them and says why
                numbers.append(None)
                continue
            numbers.append(None if value_checked_columns(version) else len(versions))
            versions.append(version)
        return pa.array(numbers, pa.int32()).take(groups.indices), versions

    def _own_topics(self, tables: pa.Array, topics: pa.Array, versions: list[TableVersion]) -> pa.Array:
        """Is each event on its table's topic, and its table the one its writer schema describes
        (null where its table's name is not one)? ``versions`` share one writer schema."""
        named = pc.dictionary_encode(tables)
        namespaces = {version.namespace for version in versions}
        owns: list[str | None] = []
        for table in named.dictionary.to_pylist():
            try:
                topic = own_topic(self.topics, table)
            except DecodeError:
                topic = None
            owns.append(topic if table_namespace(str(table)) in namespaces else None)
        return pc.equal(pa.array(owns, pa.string()).take(named.indices), topics)


def _events(
    taken: pa.RecordBatch | pa.Table,
    values: list[bytes],
    columns: pa.StructArray,
    version_of: list[TableVersion],
    stated: tuple[pa.Array, ...],
) -> list[DecodedEvent]:
    """The accepted events: Kafka coordinates and key from their rows (``taken``), their bytes
    (``values``, the list the reader read: not copied again), table version, table and sort key
    (``stated``: source_metadata's, which the sort keys equal), and their row of ``columns``."""
    coordinates = (taken.column(name).to_pylist() for name in ("topic", "partition", "offset", "key"))
    sort_keys = zip(*(part.to_pylist() for part in stated), strict=True)
    return [
        DecodedEvent(topic, partition, offset, key, value, version, table, sort_key, None, columns, row)
        for row, (topic, partition, offset, key, value, version, table, sort_key) in enumerate(
            zip(*coordinates, values, version_of, columns.field("object").to_pylist(), sort_keys, strict=True)
        )
    ]


def _readable(
    reader: ColumnsReader, positions: pa.Array, messages: list[bytes]
) -> list[tuple[pa.Array, list[bytes], pa.StructArray]]:
    """``messages`` (at ``positions``) read into columns, in parts of at most
    :data:`READ_PART` messages. A message the reader cannot read fails its part's call and
    names itself (``message_index``): the messages before it are read again, it is left to the
    record gate (which says why), and reading goes on after it. A few such messages cost a
    second read of the messages before each in their part, not the columnar path; a failure
    that names no message leaves its part to the record gate."""
    parts = []
    start = 0
    while start < len(messages):
        ahead = messages[start : start + READ_PART]
        try:
            columns = reader(ahead, [HEADER_LENGTH] * len(ahead))
        except Exception as exc:  # the record gate reads them and says why
            failed = getattr(exc, "message_index", None)
            if not isinstance(failed, int) or not 0 <= failed < len(ahead):
                failed = len(ahead) - 1  # the whole part: nothing names the message
            elif failed > 0:
                parts.extend(_readable(reader, positions[start : start + failed], ahead[:failed]))
            start += failed + 1
        else:
            parts.append((positions[start : start + len(ahead)], ahead, columns))
            start += len(ahead)
    return parts


def _joined(
    parts: list[tuple[pa.Array, list[bytes], pa.StructArray]],
) -> tuple[pa.Array, list[bytes], pa.StructArray]:
    """The parts :func:`_readable` read, as one: the rules' Arrow calls cost about the same for a
    part of ten messages as for one of thousands, so checking the parts one by one made a few
    unreadable messages among many cost hundreds of times the clean read."""
    if len(parts) == 1:
        return parts[0]
    return (
        pa.concat_arrays([positions for positions, _, _ in parts]),
        [message for _, messages, _ in parts for message in messages],
        pa.concat_arrays([columns for _, _, columns in parts]),
    )


def _outline(taken: pa.RecordBatch | pa.Table, columns: pa.StructArray, micros: pa.Array) -> pa.RecordBatch:
    """The outline rows (consumer.decode.outline_rows) of accepted events, from their columns."""
    metadata = columns.field("source_metadata")
    found = {
        "topic": _array(taken.column("topic")),
        "partition": _array(taken.column("partition")),
        "offset": _array(taken.column("offset")),
        "kind": pa.repeat(pa.scalar(EVENT), len(columns)),
        "uuid": columns.field("uuid"),
        "commit_micros": micros,
        "object": columns.field("object"),
        **{name: metadata.field(field) for name, field in TRANSACTION_FIELDS.items()},
    }
    return pa.RecordBatch.from_arrays(
        [
            found[field.name].cast(field.type) if field.name in found else pa.nulls(len(columns), field.type)
            for field in OUTLINE_SCHEMA
        ],
        schema=OUTLINE_SCHEMA,
    )


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column of a record batch or table as one array."""
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
