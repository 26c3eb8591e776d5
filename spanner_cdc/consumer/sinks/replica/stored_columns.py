"""A replica column as the database's catalog describes it, and when its type must follow
Spanner's.

Spanner changes a column between STRING and BYTES in place (``ALTER COLUMN``, arrays too); the
replica follows by converting the column with its rows (merge.py), and a stage table a task
loaded before the change has its values converted as they are taken (docs/consumer.md,
Guarantees). Any other difference between the type a replica column has and the type its
events bring stops the table (``ReplicaTables.type_refusal``, stopped.py): no such change
happens in place in Spanner, and the database would otherwise cast the new values into the old
type where it has a cast (INT64 then FLOAT64: 7.25 stored as 7) or refuse the statement in its
own words (INT64 then STRING). A batch holding both types has them in parts of their own
(contents.by_table).
"""

from __future__ import annotations

from dataclasses import dataclass

from spanner_cdc.consumer.decode.table_version import TextOrBytes

#: A column's :func:`catalog_type` → which of text and bytes it holds.
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
#: The columns of ``information_schema.columns`` :func:`catalog_type` reads, in its order.
TYPE_COLUMNS = "data_type, udt_name"


@dataclass(frozen=True)
class StoredColumn:
    """One column of a replica table, as the catalog has it."""

    nullable: bool
    #: Its type as the catalog names it (:func:`catalog_type`), to compare with
    #: ``SqlBackend.catalog_type`` of the type the events bring.
    type_name: str

    @property
    def text_or_bytes(self) -> TextOrBytes | None:
        """Which of text and bytes it holds; None for any other type."""
        return text_or_bytes(self.type_name)


def catalog_type(data_type: object, udt_name: object) -> str:
    """The type of a column of the catalog's ``data_type`` and ``udt_name``, lowercased:
    PostgreSQL's ``udt_name`` (its ``data_type`` says only ``ARRAY`` for every array), DuckDB's
    ``data_type`` (it has no udt_name)."""
    return str(udt_name if udt_name is not None else data_type).lower()


def text_or_bytes(type_name: str) -> TextOrBytes | None:
    """Which of text and bytes a column the catalog names ``type_name`` holds (:func:`catalog_type`)."""
    return _TEXT_OR_BYTES.get(type_name)


def needs_recoding(stored: TextOrBytes | None, wanted: TextOrBytes | None) -> bool:
    """Whether a column holding ``stored`` must be converted to hold ``wanted``: text to bytes
    or bytes to text, arrays alike."""
    return stored is not None and wanted is not None and stored.is_other_of(wanted)
