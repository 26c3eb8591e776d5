# cython: language_level=3, boundscheck=False, wraparound=False
"""A data change record's mods, and whole rows read from a table, → events, in C: the step
every change, backfilled row and polled row the producer sends takes.

What an event holds is ``schemas.events``' contract (``EventBuilder``, ``ENVELOPE_FIELDS``,
``METADATA_FIELDS``); this is its per-mod and per-row work with fewer interpreter steps: the
fields every mod of a record (every row of a chunk) shares are read once, the tuples are made
in C, and each ``Event`` is made without its named tuple's Python constructor. The uuids and the
sort keys come from ``schemas.identity``, their one definition.
"""

from spanner_cdc.schemas.identity import change_uuid, sort_keys
from spanner_cdc.schemas.timestamps import format_timestamp_micros

#: What the emulator reports for a PENDING_COMMIT_TIMESTAMP() column (docs/design.md §2).
EMULATOR_PENDING_COMMIT_TIMESTAMP = "9999-12-31T23:59:59Z"

cdef object _new_tuple = tuple.__new__


cdef class ChangeEvents:
    """Makes the events of one change stream's data change records (``EventBuilder``'s)."""

    cdef object event_type
    cdef object database
    cdef object default_schema
    cdef object stream_name
    cdef object read_method

    def __init__(self, event_type, database, default_schema, stream_name, read_method):
        """``event_type``: the named tuple each event is (``schemas.events.Event``);
        ``read_method``: the envelope's ``read_method`` of a change."""
        self.event_type = event_type
        self.database = database
        self.default_schema = default_schema
        self.stream_name = stream_name
        self.read_method = read_method

    def build(self, record, table, partition_token, read_timestamp_millis):
        """Every mod of ``record`` (of the table version ``table``) as an event, in mod order."""
        table_name = record.table_name
        schema_name = table_name.rpartition(".")[0]
        commit_micros = record.commit_timestamp_micros
        transaction = record.server_transaction_id
        sequence = record.record_sequence
        mod_type = record.mod_type
        cdef bint is_delete = mod_type == "DELETE"
        pending_columns = table.commit_timestamp_columns
        commit_text = format_timestamp_micros(record.commit_timestamp_micros) if pending_columns else None
        convert = table.convert_row
        mods = record.mods
        before_index = (
            self.database,
            schema_name or self.default_schema,
            table_name,
            mod_type,
            is_delete,
            table.key_names,
            transaction,
            commit_micros,
            sequence,
        )
        after_index = (
            partition_token,
            record.value_capture_type,
            record.number_of_records_in_transaction,
            record.number_of_partitions_in_transaction,
            record.is_last_record_in_transaction_in_partition,
            record.transaction_tag,
            record.is_system_transaction,
            len(mods),
        )
        commit_millis = commit_micros // 1000
        schema_key = table.schema_key
        cdef list events = []
        cdef dict keys, new_values, old_values
        cdef Py_ssize_t mod_index = 0
        for mod in mods:
            keys = convert(mod.keys)
            new_values = convert(
                resolve_pending_commit_timestamps(pending_columns, commit_text, mod.new_values)
                if pending_columns
                else mod.new_values
            )
            old_values = convert(mod.old_values)
            payload, changed = mod_payload(is_delete, keys, new_values, old_values)
            metadata = before_index + (mod_index,) + after_index + (
                changed,
                {**keys, **old_values} if old_values else None,
            )
            fields = (
                change_uuid(self.stream_name, transaction, sequence, mod_index),
                read_timestamp_millis,
                commit_millis,
                table_name,
                self.read_method,
                self.stream_name,
                schema_key,
                sort_keys(commit_micros, transaction, sequence, mod_index),
                metadata,
                payload,
            )
            events.append(_new_tuple(self.event_type, (table, keys, fields)))
            mod_index += 1
        return events


cdef class RowEvents:
    """Makes the events of whole rows read from a table: a backfill's, a poll's (``EventBuilder``'s)."""

    cdef object event_type
    cdef object database
    cdef object default_schema
    cdef object stream_name

    def __init__(self, event_type, database, default_schema, stream_name):
        """``event_type``: the named tuple each event is (``schemas.events.Event``)."""
        self.event_type = event_type
        self.database = database
        self.default_schema = default_schema
        self.stream_name = stream_name

    def build(self, table, columns, rows, stamps, change_types, uuid_of, read_method, read_timestamp_millis):
        """One event per row of ``rows`` (change-record JSON values in ``columns`` order) of the
        table version ``table``, in row order: row ``i`` as committed at ``stamps[i]``
        (microseconds; its sort keys ``[stamp, "", "", 0]``) with ``change_types[i]``, its uuid
        ``uuid_of(stream_name, stamp, table name, raw keys)`` — the key columns' values as read."""
        table_name = table.table
        schema_name = table_name.rpartition(".")[0] or self.default_schema
        convert = table.convert_columns
        key_at = [(column.name, columns.index(column.name), column.avro_name) for column in table.key_columns]
        column_count = len(table.columns)
        key_names = table.key_names
        schema_key = table.schema_key
        cdef list events = []
        cdef dict raw_keys, keys, values
        changed = None
        for row, stamp, change_type in zip(rows, stamps, change_types, strict=True):
            values = convert(columns, row)
            raw_keys = {}
            keys = {}
            for name, at, avro_name in key_at:
                raw_keys[name] = row[at]
                keys[avro_name] = values[avro_name]
            if changed is None:  # every row of the chunk has the same columns
                changed = (
                    table.value_names
                    if len(values) == column_count
                    else sorted(name for name in values if name not in keys)
                )
            metadata = (
                self.database,
                schema_name,
                table_name,
                change_type,
                False,
                key_names,
                None,
                stamp,
                None,
                0,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                changed,
                None,
            )
            fields = (
                uuid_of(self.stream_name, stamp, table_name, raw_keys),
                read_timestamp_millis,
                stamp // 1000,
                table_name,
                read_method,
                self.stream_name,
                schema_key,
                sort_keys(stamp, "", "", 0),
                metadata,
                values,
            )
            events.append(_new_tuple(self.event_type, (table, keys, fields)))
        return events


cdef tuple mod_payload(bint is_delete, dict keys, dict new_values, dict old_values):
    """The payload and changed_columns of one mod, by mod type (docs/design.md §3, payload).

    INSERT and UPDATE carry ``new_values`` (the whole row for NEW_ROW capture types, only the
    changed columns otherwise); DELETE carries the keys plus whatever old values were captured.
    Columns absent from the mod are null in the payload and absent from changed_columns, which
    is how a sink knows not to overwrite them.
    """
    if is_delete:
        return {**keys, **old_values}, sorted(old_values)
    return {**keys, **new_values}, sorted(new_values)


cdef object resolve_pending_commit_timestamps(columns, commit_text, values):
    """``values`` with each of the commit-timestamp ``columns`` the emulator reported as pending
    given the record's commit timestamp (``commit_text``), which is what the column holds."""
    return {
        name: commit_text if name in columns and value == EMULATOR_PENDING_COMMIT_TIMESTAMP else value
        for name, value in values.items()
    }
