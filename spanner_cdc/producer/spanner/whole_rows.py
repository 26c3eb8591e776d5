"""``--payload whole-row``: the columns a change record did not capture, read from Spanner.

Datastream's format says each event contains the whole row. Spanner's change records do so only under
some value capture types: with ``OLD_AND_NEW_VALUES`` (the default) and ``NEW_VALUES`` an UPDATE
carries the keys and the changed columns; with ``NEW_ROW`` and ``NEW_VALUES`` a DELETE carries
only the keys. A reader that expects whole rows writes nulls for the rest. With whole-row
payloads the producer reads the missing values, per record (one read for all its mods):

- an UPDATE's row **at** its commit timestamp — the row as the transaction left it;
- a DELETE's row **just before** its commit timestamp (1 µs earlier) — the row it deleted.

The record's own values win over what was read (they are equal: both describe that commit).
The payload, or for a DELETE the old values, then holds every column, and ``changed_columns``
(the columns present) names them all; an UPDATE's ``old_values`` still holds what the stream
captured (under ``OLD_AND_NEW_VALUES``, the old values of the columns that changed).

The cost is one Spanner read per such record, on the path that releases records in commit
order: throughput and latency drop with the share of updates and deletes. A row the read does
not find (it cannot happen for a real commit) keeps the record's values, with a warning.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.api_core import exceptions as google_exceptions

from spanner_cdc.producer.errors import ProducerError
from spanner_cdc.producer.retry import TRANSIENT_SPANNER_ERRORS
from spanner_cdc.producer.spanner.snapshot_read import rows_by_key
from spanner_cdc.schemas.records import DataChangeRecord
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.timestamps import format_timestamp_micros

log = logging.getLogger(__name__)

#: Capture types whose UPDATEs carry only the changed columns.
PARTIAL_UPDATES = frozenset({"OLD_AND_NEW_VALUES", "NEW_VALUES"})
#: Capture types whose DELETEs carry only the keys.
KEY_ONLY_DELETES = frozenset({"NEW_ROW", "NEW_VALUES"})
#: What Spanner uses when a stream sets no value_capture_type.
DEFAULT_CAPTURE_TYPE = "OLD_AND_NEW_VALUES"


def partial_payloads(capture_type: str | None) -> str | None:
    """What events of a stream with ``capture_type`` lack without whole-row payloads, or None."""
    capture = capture_type or DEFAULT_CAPTURE_TYPE
    missing = []
    if capture in PARTIAL_UPDATES:
        missing.append("an UPDATE carries only the changed columns")
    if capture in KEY_ONLY_DELETES:
        missing.append("a DELETE carries only the key")
    return f"with value_capture_type {capture} " + " and ".join(missing) if missing else None


@dataclass
class RowFiller:
    """Completes records from ``database``; ``primary_keys`` lists each table's key columns in
    key order (read once, again when a table is missing from it)."""

    database: Any
    primary_keys: Callable[[], dict[str, list[str]]]
    _keys: dict[str, list[str]] = field(default_factory=dict)

    async def complete(self, record: DataChangeRecord, table: TableSchema) -> DataChangeRecord:
        """``record`` with every mod's whole row, or ``record`` itself when it has them."""
        capture = record.value_capture_type
        if record.mod_type == "UPDATE" and capture in PARTIAL_UPDATES:
            at, into_old = record.commit_timestamp_micros, False
        elif record.mod_type == "DELETE" and capture in KEY_ONLY_DELETES:
            at, into_old = record.commit_timestamp_micros - 1, True
        else:
            return record
        key = await self._key(record.table_name)
        columns = [column.name for column in table.columns]
        try:
            rows = await asyncio.to_thread(
                rows_by_key,
                self.database,
                at,
                record.table_name,
                columns,
                [[mod.keys[name] for name in key] for mod in record.mods],
            )
        except TRANSIENT_SPANNER_ERRORS:
            raise  # the partition retries from its checkpoint
        except google_exceptions.GoogleAPICallError as exc:
            raise ProducerError(
                f"--payload whole-row: cannot read {record.table_name} at {format_timestamp_micros(at)}: "
                f"{exc.message} (a time older than the database's version_retention_period cannot be read)"
            ) from None
        found = {_key_of(table, key, dict(zip(columns, row, strict=True))): row for row in rows}
        mods = []
        for mod in record.mods:
            row = found.get(_key_of(table, key, mod.keys))
            if row is None:
                log.warning(
                    "table %s: no row for key %s at %d µs; its event keeps the captured values",
                    record.table_name,
                    dict(mod.keys),
                    at,
                )
                mods.append(mod)
                continue
            rest = {name: value for name, value in zip(columns, row, strict=True) if name not in key}
            if into_old:
                mods.append(mod._replace(old_values={**rest, **mod.old_values}))
            else:
                mods.append(mod._replace(new_values={**rest, **mod.new_values}))
        return record._replace(mods=tuple(mods))

    async def _key(self, table: str) -> list[str]:
        if table not in self._keys:
            self._keys = await asyncio.to_thread(self.primary_keys)
        return self._keys[table]


def _key_of(table: TableSchema, key: Sequence[str], values: Mapping[str, Any]) -> tuple[Any, ...]:
    """A key compared by value (the record and the read may spell a value differently)."""
    return tuple(table.converters[name](values[name]) for name in key)
