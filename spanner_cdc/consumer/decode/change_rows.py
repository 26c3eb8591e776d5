"""Decoded events of one table → the Arrow tables the sinks write.

Both sinks see the same events in the same order (``sort_keys``), with the columns of every
table version in the batch merged (a column added mid-stream is null for older events; one
Spanner changed between STRING and BYTES is BYTES: table_version.merged):

- the changelog row: the payload as typed columns, ``change$type`` (the event's own change
  type: one row per event, not a stream's net change) and ``change$row_id``, and the envelope
  under ``envelope$…``. ``$`` cannot occur in a Spanner identifier, so
  these names never collide with a table's own columns;
- the replica stage row: keys, values, one ``set$<column>`` flag per value column (was the
  column part of the change; a partial update must leave the others alone), whether the event
  deletes or inserts the row, its row id and the sort key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

from spanner_cdc.consumer.decode.decoded import DecodedEvent, read_columns
from spanner_cdc.consumer.decode.table_version import PayloadColumn, TableVersion, merged
from spanner_cdc.schemas.avro_reader import calendar_converter
from spanner_cdc.schemas.identity import row_id

#: INSERT, UPDATE or DELETE: the event's ``change_type``. Not ``change$action`` and
#: ``change$is_update``: those are a stream's columns (streams.delta), where an update of an
#: older row is a DELETE/INSERT pair of its whole images; an event seldom carries the old image
#: whole (only NEW_ROW_AND_OLD_VALUES does), so the changelog does not claim to.
CHANGE_TYPE = "change$type"
ROW_ID = "change$row_id"
IS_DELETE = "cdc$is_delete"
IS_INSERT = "cdc$is_insert"
#: The replica's copy of ``change$row_id`` (streams report it; history rows carry it).
REPLICA_ROW_ID = "cdc$row_id"
#: The replica's order columns, compared element-wise: commit time, transaction, record, mod.
SORT_COLUMNS = ("cdc$commit_micros", "cdc$tx_id", "cdc$record_sequence", "cdc$mod_index")
COMMIT_TIMESTAMP = "cdc$commit_timestamp"
SET_PREFIX = "set$"

SOURCE_METADATA = "envelope$source_metadata"
OLD_VALUES = "envelope$old_values"
#: The record's own names of its parts (the Avro event's fields).
_SOURCE_METADATA, _OLD_VALUES, _PAYLOAD = "source_metadata", "old_values", "payload"
_TIMESTAMP_MS = pa.timestamp("ms", tz="UTC")
_SORT_KEYS_TYPE = pa.struct(
    [
        ("commit_timestamp_micros", pa.int64()),
        ("tx_id", pa.string()),
        ("record_sequence", pa.string()),
        ("mod_index", pa.int64()),
    ]
)
_SOURCE_METADATA_TYPE = pa.struct(
    [
        ("database", pa.string()),
        ("schema", pa.string()),
        ("table", pa.string()),
        ("change_type", pa.string()),
        ("is_deleted", pa.bool_()),
        ("primary_keys", pa.list_(pa.string())),
        ("tx_id", pa.string()),
        ("commit_timestamp", pa.timestamp("us", tz="UTC")),
        ("record_sequence", pa.string()),
        ("mod_index", pa.int64()),
        ("partition_token", pa.string()),
        ("value_capture_type", pa.string()),
        ("number_of_records_in_transaction", pa.int64()),
        ("number_of_partitions_in_transaction", pa.int64()),
        ("is_last_record_in_transaction_in_partition", pa.bool_()),
        ("transaction_tag", pa.string()),
        ("is_system_transaction", pa.bool_()),
        ("number_of_mods_in_record", pa.int64()),
        ("changed_columns", pa.list_(pa.string())),
    ]
)
_ENVELOPE_SCALARS = (
    ("uuid", pa.string()),
    ("read_timestamp", _TIMESTAMP_MS),
    ("source_timestamp", _TIMESTAMP_MS),
    ("object", pa.string()),
    ("read_method", pa.string()),
    ("stream_name", pa.string()),
    ("schema_key", pa.string()),
)


@dataclass
class TableChanges:
    """The deduplicated events of one table in one batch, in ``sort_keys`` order."""

    table: str
    events: Sequence[DecodedEvent]

    def __post_init__(self) -> None:
        self.events = sorted(self.events, key=lambda event: event.sort_key)

    @cached_property
    def versions(self) -> tuple[TableVersion, ...]:
        """Writer schemas in the order their first event appears (so: oldest first)."""
        return tuple({id(e.version): e.version for e in self.events}.values())

    @cached_property
    def columns(self) -> tuple[PayloadColumn, ...]:
        """Every column of any version, first seen first (versions oldest first): added columns
        last."""
        return merged(self.table, (column for version in self.versions for column in version.columns))

    @property
    def key(self) -> tuple[str, ...]:
        return self.versions[-1].key

    @cached_property
    def value_columns(self) -> tuple[PayloadColumn, ...]:
        return tuple(c for c in self.columns if c.name not in self.key)

    @cached_property
    def record_arrays(self) -> dict[str, pa.Array]:
        """Each part of the events the sinks take as the events hold it, one Arrow array over the
        events in their order: every payload column (by its name), and the envelope's scalars,
        ``source_metadata`` and ``old_values`` (by their changelog names, ``envelope$…``).

        Each table version's events are taken in one pass from the columns the gate read them
        into (decoded.read_columns), as a struct of that version's fields (a column it lacks is
        null), then put back in their order."""
        parts = self._version_parts
        return {name: self._in_event_order([part[name] for part in parts]) for name in parts[0]}

    @cached_property
    def _version_parts(self) -> list[dict[str, pa.Array]]:
        """:attr:`record_arrays` of each table version's events alone, as :attr:`_grouped` lists
        them (the row ids read their key columns here, before the events are put back in order)."""
        return [
            self._version_arrays(version, [self.events[i] for i in positions])
            for version, positions in zip(self.versions, self._grouped, strict=True)
        ]

    @cached_property
    def _grouped(self) -> list[list[int]]:
        """Each table version's events, as their positions in :attr:`events` (in order)."""
        if len(self.versions) == 1:
            return [list(range(len(self.events)))]
        grouped: list[list[int]] = [[] for _ in self.versions]
        for position, version in enumerate(self._version_index):
            grouped[version].append(position)
        return grouped

    @cached_property
    def _back(self) -> pa.Array:
        """Each event's place among the versions' rows laid end to end (:attr:`_grouped`)."""
        back = [0] * len(self.events)
        for place, position in enumerate(p for positions in self._grouped for p in positions):
            back[position] = place
        return pa.array(back, type=pa.int64())

    def _in_event_order(self, parts: list[pa.Array]) -> pa.Array:
        """One array per table version (its events', as :attr:`_grouped` lists them) → one over
        every event in their order."""
        if len(parts) == 1:
            return parts[0]
        return pa.concat_arrays(parts).take(self._back)

    @property
    def payload_arrays(self) -> dict[str, pa.Array]:
        """Each column's values, typed, one per event (both sinks start from these)."""
        return {column.name: self.record_arrays[column.name] for column in self.columns}

    def _version_arrays(self, version: TableVersion, events: list[DecodedEvent]) -> dict[str, pa.Array]:
        """:attr:`record_arrays` over ``events``, all of ``version``."""
        fields = version.fields_by_name
        present = [c for c in self.columns if c.name in fields]
        values = pa.struct([(fields[c.name], c.type.arrow) for c in present])
        converted = cast(pa.StructArray, _projected(read_columns(events), event_type(values)))
        arrays = {f"envelope${name}": converted.field(name) for name, _ in _ENVELOPE_SCALARS}
        payload = dict(zip((c.name for c in present), converted.field(_PAYLOAD).flatten(), strict=True))
        for column in self.columns:
            arrays[column.name] = payload.get(column.name, pa.nulls(len(events), column.type.arrow))
        described = converted.field(_SOURCE_METADATA)
        arrays[SOURCE_METADATA] = pa.StructArray.from_arrays(
            [described.field(f.name) for f in _SOURCE_METADATA_TYPE], fields=list(_SOURCE_METADATA_TYPE)
        )
        old = described.field(_OLD_VALUES)
        old_columns = dict(zip((c.name for c in present), old.flatten(), strict=True))
        arrays[OLD_VALUES] = pa.StructArray.from_arrays(
            [old_columns.get(c.name, pa.nulls(len(events), c.type.arrow)) for c in self.columns],
            fields=[pa.field(c.name, c.type.arrow) for c in self.columns],
            mask=old.is_null(),
        )
        return arrays

    @cached_property
    def _version_index(self) -> list[int]:
        """Each event's table version, as its index in :attr:`versions`."""
        if len(self.versions) == 1:  # the usual batch: no event to look at
            return [0] * len(self.events)
        index = {id(version): number for number, version in enumerate(self.versions)}
        return [index[id(event.version)] for event in self.events]

    def _described(self, field: str) -> pa.Array:
        """One field of every event's ``source_metadata``."""
        return pc.struct_field(self.record_arrays[SOURCE_METADATA], field)

    def changelog(self) -> pa.Table:
        columns = dict(self.payload_arrays)
        columns[CHANGE_TYPE] = self._described("change_type")
        columns[ROW_ID] = self.row_ids
        for name, _ in _ENVELOPE_SCALARS:
            columns[f"envelope${name}"] = self.record_arrays[f"envelope${name}"]
        columns["envelope$sort_keys"] = pa.StructArray.from_arrays(
            list(self.sort_key_arrays), fields=list(_SORT_KEYS_TYPE)
        )
        columns[SOURCE_METADATA] = self.record_arrays[SOURCE_METADATA]
        columns[OLD_VALUES] = self.record_arrays[OLD_VALUES]
        columns["kafka$topic"] = pa.array([e.topic for e in self.events], type=pa.string())
        columns["kafka$partition"] = pa.array([e.partition for e in self.events], type=pa.int32())
        columns["kafka$offset"] = pa.array([e.offset for e in self.events], type=pa.int64())
        return pa.table(columns)

    @cached_property
    def sort_key_arrays(self) -> tuple[pa.Array, ...]:
        """The four parts of each event's sort key as columns, once for both sinks: taken from
        ``source_metadata``'s columns, which every event's sort keys equal (the gate quarantines
        one whose do not: event_rules), a missing transaction id or record sequence as "", rather
        than from each event's sort key tuple, per event."""
        return (
            pc.cast(self._described("commit_timestamp"), pa.int64()),
            pc.fill_null(self._described("tx_id"), ""),
            pc.fill_null(self._described("record_sequence"), ""),
            self._described("mod_index"),
        )

    @cached_property
    def row_ids(self) -> pa.Array:
        """``change$row_id`` per event, computed once per distinct key and batch (the changelog
        and the replica both need it; a hash per event is measurable). Each event's own key
        columns: a table created again with another key has events of both in one batch, so keys
        are told apart within each table version (which fixes the key's names and types), by
        Arrow over the key columns (:func:`_key_codes`); a Python signature per event cost more
        than the ids themselves. Each key's id is made from the values its first event's record
        holds, as it always was (:meth:`_first_keys`)."""
        parts = []
        for version, positions, arrays in zip(self.versions, self._grouped, self._version_parts, strict=True):
            codes, distinct = _key_codes([arrays[name] for name in version.key], len(positions))
            firsts = pc.index_in(pa.array(range(distinct), type=pa.int64()), value_set=codes)
            hashed = _hashed_key(version)
            keys = self._first_keys(version, arrays, firsts)
            parts.append(
                pa.array([row_id(self.table, hashed(key)) for key in keys], type=pa.string()).take(codes)
            )
        return self._in_event_order(parts)

    def _first_keys(
        self, version: TableVersion, arrays: dict[str, pa.Array], firsts: pa.Array
    ) -> list[tuple[Any, ...]]:
        """The key values (in key order) of the events of ``version`` at ``firsts``, as their
        records hold them: their key columns as the version's own types (a column Spanner changed
        from STRING to BYTES is BYTES in the batch's columns: its STRING events' keys are text
        again), timestamps and dates as the numbers written (:func:`_as_written`)."""
        if not version.key:
            return [()] * len(firsts)
        own = {column.name: column.type.arrow for column in version.columns}
        values = (_as_written(arrays[name].take(firsts), own[name]).to_pylist() for name in version.key)
        return list(zip(*values, strict=True))

    def _set_flags(self, deleted: pa.Array) -> dict[str, pa.Array]:
        """``set$<column>`` per value column: did the event name the column (its own version's
        field) in ``changed_columns``. Deletes set nothing: their changed_columns name the old
        values they carry. Compared in Arrow over every event's names at once, as
        :attr:`record_arrays` holds them, not by a Python test per column and event."""
        named = self._described("changed_columns")
        names, owner = named.flatten(), pc.list_parent_indices(named)
        counted = pc.invert(deleted.take(owner))
        names, owner = names.filter(counted), owner.filter(counted)
        owner_version = pa.array(self._version_index, type=pa.int64()).take(owner)
        # each name as the number of the value column it is in its event's version (null: none)
        numbers = pa.nulls(len(names), type=pa.int32())
        for version_number, version in enumerate(self.versions):
            fields = pa.array(
                [version.fields_by_name.get(c.name) for c in self.value_columns], type=pa.string()
            )
            in_version = pc.equal(owner_version, version_number)
            numbers = pc.if_else(in_version, pc.index_in(names, value_set=fields), numbers)
        every_event = pa.array(range(len(self.events)), type=pa.int64())
        flags = {}
        for number, column in enumerate(self.value_columns):
            setting = owner.filter(pc.fill_null(pc.equal(numbers, number), False))
            flags[SET_PREFIX + column.name] = pc.is_in(every_event, value_set=setting)
        return flags

    def replica_stage(self) -> pa.Table:
        """Keys, values, ``set$`` flags, delete and insert flags, row id, sort key and commit
        timestamp per event."""
        deleted = pc.fill_null(self._described("is_deleted"), False)
        columns = dict(self.payload_arrays)
        columns.update(self._set_flags(deleted))
        columns[IS_DELETE] = deleted
        columns[IS_INSERT] = pc.fill_null(pc.equal(self._described("change_type"), "INSERT"), False)
        columns[REPLICA_ROW_ID] = self.row_ids
        columns.update(zip(SORT_COLUMNS, self.sort_key_arrays, strict=True))
        columns[COMMIT_TIMESTAMP] = self._described("commit_timestamp")
        return pa.table(columns)


def event_type(values: pa.StructType) -> pa.StructType:
    """What the sinks take of an event's record, as Arrow: the envelope's scalars,
    ``source_metadata`` (its ``old_values`` of type ``values``) and the ``payload`` (``values``:
    the columns by their Avro field names)."""
    metadata = pa.struct([*_SOURCE_METADATA_TYPE, pa.field(_OLD_VALUES, values)])
    return pa.struct([*_ENVELOPE_SCALARS, (_SOURCE_METADATA, metadata), (_PAYLOAD, values)])


def _projected(array: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    """``array`` as ``arrow_type``: a struct's fields chosen by name, the rest cast (a column
    Spanner changed from STRING to BYTES: table_version.merged)."""
    if not pa.types.is_struct(arrow_type):
        return array if array.type == arrow_type else array.cast(arrow_type)
    fields = [_projected(array.field(field.name), field.type) for field in arrow_type]
    return pa.StructArray.from_arrays(
        fields, fields=list(arrow_type), mask=array.is_null() if array.null_count else None
    )


#: Arrow's calendar types → the numbers written (micros, millis, days since the epoch).
_CALENDAR = {
    pa.timestamp("us", tz="UTC"): pa.int64(),
    pa.timestamp("ms", tz="UTC"): pa.int64(),
    pa.date32(): pa.int32(),
}


def _as_written(column: pa.Array, own: pa.DataType) -> pa.Array:
    """A key column as its event's table version wrote it: of that version's own type, with
    timestamps and dates (also an array's) as their numbers. Arrow's Python values of it are
    then the record's (decimals included: the same ``Decimal``, exponent and all)."""
    written = _written_type(own)
    return column if column.type == written else column.cast(written)


def _written_type(arrow_type: pa.DataType) -> pa.DataType:
    if pa.types.is_list(arrow_type):
        return pa.list_(_written_type(arrow_type.value_type))
    return _CALENDAR.get(arrow_type, arrow_type)


def _key_codes(columns: list[pa.Array], rows: int) -> tuple[pa.Array, int]:
    """Each of ``rows`` rows' key (its values in ``columns``; none: one key) as a number, the same
    exactly where every column's value is — 0, 1, ... in the order keys first appear — and how
    many keys there are. Arrow hashes floats by their bits, so 0.0 and -0.0 are two keys, as in
    the row id's JSON; values it cannot hash (lists: no Spanner key is one, a hostile schema may
    say so) are told apart by their ``repr``."""
    codes, distinct = pa.repeat(pa.scalar(0, pa.int64()), rows), 1
    for column in columns:
        hashable = (
            pa.array([repr(value) for value in column.to_pylist()], type=pa.string())
            if pa.types.is_nested(column.type)
            else column
        )
        encoded = pc.dictionary_encode(hashable, null_encoding="encode")
        numbers = encoded.indices.cast(pa.int64())
        if distinct > 1:  # both below ``rows``: the combination fits an int64
            encoded = pc.dictionary_encode(pc.add(pc.multiply(codes, len(encoded.dictionary)), numbers))
            numbers = encoded.indices.cast(pa.int64())
        codes, distinct = numbers, len(encoded.dictionary)
    return codes, distinct


def _hashed_key(version: TableVersion) -> Callable[[tuple[Any, ...]], dict[str, Any]]:
    """A key's values (in key order) → the key ``row_id`` hashes, as it has always hashed it:
    timestamps and dates as fastavro's ``datetime`` and ``date``. The gate reads them as numbers
    (consumer.decode.gate); a row keeps the id earlier versions gave it."""
    types = {column.name: column.type.avro for column in version.columns}
    converters = [calendar_converter(types[name]) for name in version.key]
    if not any(converters):
        return lambda values: dict(zip(version.key, values, strict=True))

    def hashed(values: tuple[Any, ...]) -> dict[str, Any]:
        return {
            name: value if convert is None or value is None else convert(value)
            for name, value, convert in zip(version.key, values, converters, strict=True)
        }

    return hashed
