"""A table's stage rows as the replica's stage table holds them: its columns, as the replica
names them, and their SQL types.

The merge (merge.py) creates the stage table in the batch's transaction; with a PostgreSQL
replica the tasks that built the rows create tables of the same layout and load them there
(stage/loaded.py). Both read the layout from here, which imports no database driver: every
Python worker that stages rows imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa

from spanner_cdc.consumer.decode.change_rows import (
    COMMIT_TIMESTAMP,
    IS_DELETE,
    IS_INSERT,
    REPLICA_ROW_ID,
    SET_PREFIX,
    SORT_COLUMNS,
)
from spanner_cdc.consumer.decode.table_version import PayloadColumn
from spanner_cdc.consumer.sinks.replica.names import ReplicaNames, TableNames, quote
from spanner_cdc.consumer.sinks.replica.stage.rows import StagedPart

#: What the replica stores with each row (and tombstone) to order changes: sort key and commit time.
ORDER_COLUMNS = (*SORT_COLUMNS, COMMIT_TIMESTAMP)
_ORDER_SQL_TYPES = {
    "postgres": ("BIGINT", "TEXT", "TEXT", "BIGINT"),
    "duckdb": ("BIGINT", "VARCHAR", "VARCHAR", "BIGINT"),
}


@dataclass(frozen=True)
class ReplicaTable:
    """One table's staged changes (of one primary key) as the replica names them."""

    changes: StagedPart
    names: TableNames
    key: tuple[str, ...]
    columns: tuple[PayloadColumn, ...]

    @classmethod
    def of(cls, changes: StagedPart, names: ReplicaNames) -> ReplicaTable:
        columns = tuple(replace(c, name=names.column(c.name)) for c in changes.columns)
        key = tuple(names.column(k) for k in changes.key)
        return cls(changes, names.of(changes.table), key, columns)

    @property
    def value_columns(self) -> tuple[PayloadColumn, ...]:
        return tuple(c for c in self.columns if c.name not in self.key)

    def stage_rows(self) -> pa.Table:
        """The stage rows (change_rows), their columns renamed as the replica names them."""
        rows = self.changes.stage_rows()
        renamed = {c.name: r.name for c, r in zip(self.changes.columns, self.columns, strict=True)}
        renamed |= {SET_PREFIX + source: SET_PREFIX + name for source, name in renamed.items()}
        return rows.rename_columns([renamed.get(n, n) for n in rows.column_names])


def stage_layout(changes: ReplicaTable, dialect: str) -> list[tuple[str, str]]:
    """The stage table's columns for ``changes``: (name, SQL type) pairs."""
    return [
        *((c.name, c.type.sql(dialect)) for c in changes.columns),
        *((SET_PREFIX + c.name, "BOOLEAN") for c in changes.value_columns),
        (IS_DELETE, "BOOLEAN"),
        (IS_INSERT, "BOOLEAN"),
        (REPLICA_ROW_ID, "VARCHAR"),
        *zip(ORDER_COLUMNS, order_types(dialect), strict=True),
    ]


def stage_definitions(changes: ReplicaTable, dialect: str) -> list[str]:
    """The stage table's column definitions (SQL) for ``changes``."""
    return [f"{quote(name)} {sql_type}" for name, sql_type in stage_layout(changes, dialect)]


def order_types(dialect: str) -> tuple[str, ...]:
    """The SQL types of :data:`ORDER_COLUMNS`."""
    return (*_ORDER_SQL_TYPES[dialect], "TIMESTAMPTZ")
