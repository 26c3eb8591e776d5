"""A replica column as the database's catalog describes it, and when its type must follow
Spanner's.

Spanner changes a column between STRING and BYTES in place (``ALTER COLUMN``, arrays too); the
replica follows by converting the column with its rows (merge.py), and a stage table a task
loaded before the change has its values converted as they are taken (docs/consumer.md,
Guarantees). Every other difference of type is left alone: the events' own types are checked
where a batch's columns are merged (table_version.merged).
"""

from __future__ import annotations

from dataclasses import dataclass

from spanner_cdc.consumer.table_version import TextOrBytes

#: ``information_schema.columns``' ``udt_name`` (PostgreSQL) or ``data_type`` (DuckDB, which has
#: no udt_name), lowercased → which of text and bytes the column holds.
_TEXT_OR_BYTES = {
    "text": TextOrBytes(is_bytes=False, is_array=False),
    "varchar": TextOrBytes(is_bytes=False, is_array=False),
    "bytea": TextOrBytes(is_bytes=True, is_array=False),
    "blob": TextOrBytes(is_bytes=True, is_array=False),
    "_text": TextOrBytes(is_bytes=False, is_array=True),
    "varchar[]": TextOrBytes(is_bytes=False, is_array=True),
    "_bytea": TextOrBytes(is_bytes=True, is_array=True),
    "blob[]": TextOrBytes(is_bytes=True, is_array=True),
}
#: The columns of ``information_schema.columns`` :func:`text_or_bytes` reads, in its order.
TYPE_COLUMNS = "data_type, udt_name"


@dataclass(frozen=True)
class StoredColumn:
    """One column of a replica table, as the catalog has it."""

    nullable: bool
    #: Which of text and bytes it holds; None for any other type.
    text_or_bytes: TextOrBytes | None


def text_or_bytes(data_type: object, udt_name: object) -> TextOrBytes | None:
    """Which of text and bytes a column of the catalog's ``data_type`` and ``udt_name`` holds."""
    return _TEXT_OR_BYTES.get(str(udt_name if udt_name is not None else data_type).lower())


def needs_recoding(stored: TextOrBytes | None, wanted: TextOrBytes | None) -> bool:
    """Whether a column holding ``stored`` must be converted to hold ``wanted``: text to bytes
    or bytes to text, arrays alike."""
    return stored is not None and wanted is not None and stored.is_other_of(wanted)
