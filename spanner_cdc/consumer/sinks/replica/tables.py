"""The replica's tables as the database's catalog has them, made to hold what a batch brings:
created, given the columns a new table version (or this version of the replica) adds, a column
converted where Spanner changed it between STRING and BYTES, the replica's names of Spanner's
in ``cdc$names``. What it cannot hold — any other change of a column's type, and in DuckDB a
table name that differs only in case from the table it holds — is found before anything of the
table is changed (``ReplicaTables.name_refusal``, ``type_refusal``): the merge stops that table (stopped.py).

What the catalog says is kept per process — a table's columns, the names recorded, the catalog's
name of each SQL type — and read again after a batch's transaction rolls back (:meth:`forget`),
after a table is dropped (:meth:`drop`), or once a table is found gone (:meth:`forget_dropped`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from spanner_cdc.consumer.decode.table_version import PayloadColumn
from spanner_cdc.consumer.errors import ReplicaQueryError
from spanner_cdc.consumer.sinks.replica.backends import SqlBackend
from spanner_cdc.consumer.sinks.replica.history import HISTORY_COLUMNS, INSERT_COLUMNS, ROW_VERSION_COLUMNS
from spanner_cdc.consumer.sinks.replica.names import NAMES_TABLE, ReplicaNames, quote, quote_all
from spanner_cdc.consumer.sinks.replica.stage.table import ORDER_COLUMNS, ReplicaTable, order_types
from spanner_cdc.consumer.sinks.replica.stored_columns import (
    TYPE_COLUMNS,
    StoredColumn,
    catalog_type,
    needs_recoding,
)

log = logging.getLogger("spanner_cdc.consumer")


@dataclass
class ReplicaTables:
    backend: SqlBackend
    #: Each table the catalog has, by catalog key (ReplicaNames.catalog_key), as it has it.
    _known: dict[str, CatalogTable] = field(default_factory=dict)
    #: (Spanner table, Spanner column or '', replica name) rows this process knows are in cdc$names.
    _recorded_names: set[tuple[str, str, str]] = field(default_factory=set)
    #: SQL type → the catalog's name for it (SqlBackend.catalog_type).
    _catalog_types: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.backend.execute(
            f"CREATE TABLE IF NOT EXISTS {quote(NAMES_TABLE)} (source_table VARCHAR NOT NULL, "
            "source_column VARCHAR NOT NULL, replica_name VARCHAR NOT NULL, "
            "PRIMARY KEY (source_table, source_column))"
        )

    @property
    def names(self) -> ReplicaNames:
        return ReplicaNames.for_dialect(self.backend.dialect)

    def forget(self) -> None:
        """Forget what this process knows of the catalog: a rolled-back transaction took its DDL
        and names with it."""
        self._forget_tables()
        self._recorded_names.clear()

    def drop(self, tables: Iterable[str]) -> None:
        """Drop ``tables`` where they exist (a table starting over: generations.py)."""
        for table in tables:
            self.backend.execute(f"DROP TABLE IF EXISTS {quote(table)}")
        self._forget_tables()

    def allow_null_keys(self, table: str, key: Sequence[str]) -> None:
        """Let ``table``'s ``key`` columns hold NULL (a NULL key value arrived: SqlBackend)."""
        self.backend.allow_null_keys(table, key)
        columns = self.columns(table)
        for column in key:
            stored = columns[self.names.catalog_key(column)]
            columns[self.names.catalog_key(column)] = replace(stored, nullable=True)

    def forget_dropped(self) -> None:
        """Forget the columns this process knows of tables that are gone — dropped outside the
        consumer since its last batch (the way to start a table over: docs/consumer.md,
        Guarantees) — so this batch finds them gone and starts the table over, as a restart
        would, rather than failing on a table it thought it had. One catalog query a batch."""
        if not self._known:
            return
        catalog_key = self.names.catalog_key
        present = self.backend.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
        if not self._known.keys() <= {catalog_key(str(name)) for (name,) in present}:
            self._forget_tables()

    def name_refusal(self, changes: ReplicaTable) -> str | None:
        """Why the replica cannot hold ``changes``' table under its name, as one sentence; None
        when it can: the catalog spells the table's name otherwise (DuckDB finds ``Accounts``
        for ``accounts``), so it is another table's."""
        spelled = self.spelling(changes.names.table)
        if spelled is None or spelled == changes.names.table:
            return None
        return (
            f"the replica holds table {spelled}, and DuckDB takes {changes.names.table} for the same "
            "name; drop one of them to replicate the other (or replicate into PostgreSQL, which "
            "holds both)"
        )

    def type_refusal(self, changes: ReplicaTable, with_history: bool) -> str | None:
        """Why the replica's tables cannot hold ``changes``, as one sentence; None when they can.
        Asked before :meth:`ensure` changes anything: a column's type in the catalog is not the
        events' and not one Spanner changes in place (only STRING <-> BYTES is: :meth:`_retype`)."""
        for table, columns, _, _ in self._layouts(changes, with_history):
            existing = self.columns(table)
            for column in columns:
                stored = existing.get(self.names.catalog_key(column.name))
                if stored is None or needs_recoding(stored.text_or_bytes, column.type.text_or_bytes):
                    continue
                wanted = column.type.sql(self.backend.dialect)
                if stored.type_name != self._catalog_type(wanted):
                    return (
                        f"column {column.name} is {json.dumps(column.type.avro)} in the events of "
                        f"{changes.changes.table} ({wanted}), but the replica's {table} holds it as "
                        f"{stored.type_name}: not a change Spanner makes in place (only STRING <-> BYTES) "
                        "but a table dropped and created again under its name and key with other types; "
                        "drop its replica tables to start it over"
                    )
        return None

    def ensure(self, changes: ReplicaTable, with_history: bool) -> None:
        """Create the table, its tombstones and (``with_history``) its history tables, or add the
        columns a new table version — or this version of the replica — brought, and convert a
        column Spanner changed between STRING and BYTES (:meth:`_retype`). Call when
        :meth:`type_refusal` found nothing.

        Names are compared as the database compares them (:meth:`ReplicaNames.catalog_key`).
        """
        dialect, declared = self.backend.dialect, self.backend.declares_primary_keys
        catalog_key = self.names.catalog_key
        for table, columns, extra, keyed in self._layouts(changes, with_history):
            definitions = {c.name: f"{quote(c.name)} {c.type.sql(dialect)}" for c in columns}
            definitions |= {name: f"{quote(name)} {sql_type}" for name, sql_type in extra}
            existing = self.columns(table)
            if not existing:
                created = [
                    f"{definition} NOT NULL" if keyed and not declared and name in changes.key else definition
                    for name, definition in definitions.items()
                ]
                if keyed and declared and changes.key:
                    created.append(f"PRIMARY KEY ({quote_all(changes.key)})")
                self.backend.execute(f"CREATE TABLE {quote(table)} ({', '.join(created)})")
                continue  # its columns are read from the catalog when next asked for, as made
            added = [
                definition for name, definition in definitions.items() if catalog_key(name) not in existing
            ]
            for definition in added:
                self.backend.execute(f"ALTER TABLE {quote(table)} ADD COLUMN {definition}")
            if added:
                self._forget_table(table)
                existing = self.columns(table)
            retyped = [
                c
                for c in columns
                if needs_recoding(existing[catalog_key(c.name)].text_or_bytes, c.type.text_or_bytes)
            ]
            for column in retyped:
                self._retype(changes, table, column)
            if retyped:  # read again: what the conversion left (DuckDB's copy takes NULL keys)
                self._forget_table(table)

    def _layouts(
        self, changes: ReplicaTable, with_history: bool
    ) -> Iterator[tuple[str, Sequence[PayloadColumn], list[tuple[str, str]], bool]]:
        """Each replica table of ``changes``' table: its name, the events' columns it holds, the
        replica's own columns (name, SQL type), and whether it holds one row per key."""
        order = list(zip(ORDER_COLUMNS, order_types(self.backend.dialect), strict=True))
        # The table and its tombstones hold one row per key: their key, declared or NOT NULL.
        yield changes.names.table, changes.columns, [*order, *ROW_VERSION_COLUMNS], True
        yield (
            changes.names.tombstones,
            tuple(c for c in changes.columns if c.name in changes.key),
            order,
            True,
        )
        if with_history:
            yield changes.names.history, changes.columns, list(HISTORY_COLUMNS), False
            yield changes.names.inserts, changes.columns, [*INSERT_COLUMNS, *order], False

    def _catalog_type(self, sql_type: str) -> str:
        """``SqlBackend.catalog_type``, asked once per type and process."""
        known = self._catalog_types.get(sql_type)
        if known is None:
            known = self._catalog_types[sql_type] = self.backend.catalog_type(sql_type)
        return known

    def _retype(self, changes: ReplicaTable, table: str, column: PayloadColumn) -> None:
        """Column ``column`` of ``table``, of STRING before and BYTES now or the other way round
        (Spanner's ``ALTER COLUMN``, a key column too), converted with its rows: bytes are a
        text's UTF-8 (SqlBackend.retype)."""
        to = column.type.text_or_bytes
        assert to is not None
        spanner_type = "BYTES" if to.is_bytes else "STRING"
        try:
            self.backend.retype(table, column.name, column.type.sql(self.backend.dialect), to)
        except ReplicaQueryError as exc:
            raise ReplicaQueryError(
                f"table {changes.changes.table}: column {column.name} is {spanner_type} in Spanner now, "
                f"and converting it in {table} failed (bytes that are not UTF-8 cannot be a STRING): "
                f"{exc}"
            ) from None
        log.info(
            "table %s: column %s is %s now, as in Spanner; its values in %s converted",
            changes.changes.table,
            column.name,
            spanner_type,
            table,
        )

    def record_names(self, changes: ReplicaTable) -> None:
        """Keep the table's name and its renamed columns' names in ``cdc$names`` (once per
        process: a replica written by an earlier version gets them at the table's next change)."""
        source = changes.changes
        names = [(source.table, "", changes.names.table)]
        names += [
            (source.table, column.name, renamed.name)
            for column, renamed in zip(source.columns, changes.columns, strict=True)
            if column.name != renamed.name
        ]
        for name in names:
            if name not in self._recorded_names:
                self.backend.execute(
                    f"INSERT INTO {quote(NAMES_TABLE)} VALUES (?, ?, ?) ON CONFLICT DO NOTHING", list(name)
                )
                self._recorded_names.add(name)

    def columns(self, table: str) -> dict[str, StoredColumn]:
        """The table's columns by catalog key; empty when there is no such table."""
        found = self._catalog_table(table)
        return found.columns if found is not None else {}

    def spelling(self, table: str) -> str | None:
        """The name of ``table`` as the catalog spells it; None when there is no such table."""
        found = self._catalog_table(table)
        return found.name if found is not None else None

    def _catalog_table(self, table: str) -> CatalogTable | None:
        catalog_key = self.names.catalog_key
        known = self._known.get(catalog_key(table))
        if known is None:
            rows = self.backend.execute(
                f"SELECT table_name, column_name, is_nullable, {TYPE_COLUMNS} FROM "
                "information_schema.columns WHERE table_schema = current_schema() "
                "AND lower(table_name) = lower(?)",
                [table],
            )
            own = [row for row in rows if catalog_key(str(row[0])) == catalog_key(table)]
            if own:
                columns = {
                    catalog_key(str(column)): StoredColumn(nullable == "YES", catalog_type(data_type, udt))
                    for _, column, nullable, data_type, udt in own
                }
                known = self._known[catalog_key(table)] = CatalogTable(str(own[0][0]), columns)
        return known

    def _forget_table(self, table: str) -> None:
        self._known.pop(self.names.catalog_key(table), None)

    def _forget_tables(self) -> None:
        self._known.clear()


@dataclass
class CatalogTable:
    """A replica table as the catalog has it: its name as spelled there, its columns by catalog key."""

    name: str
    columns: dict[str, StoredColumn]
