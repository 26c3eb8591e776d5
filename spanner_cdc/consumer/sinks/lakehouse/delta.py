"""One Spanner table as two Delta tables, changed by Spark: its rows, and its deleted keys'
tombstones (so a late, older change cannot bring a deleted row back).

A slice's changes are folded per key first, from the changes alone: the last change (delete
or upsert), the last delete, and per column the last change that set it, each with its sort
key. The MERGEs then apply the SQL replicas' rules (merge.py) against what the tables hold: a
change counts only when its sort key is greater than the key's stored row's and tombstone's,
so a late, older change, or one applied before, changes nothing.

Each MERGE is committed with Delta's transaction identifiers: ``txnAppId`` the streaming
query's id, ``txnVersion`` the slice's number (:attr:`Commit.version`); Delta skips a MERGE
whose version its table already has. The rows' MERGE reads the tombstones as they were before
the slice, the tombstones' MERGE the rows as that MERGE left them, so a batch replayed after a
crash makes exactly its first attempt's changes, and each of them once, whichever of its
commits were made.

Each commit of ours carries in its ``userMetadata`` the batch, the slice and the consistent cut
(JSON): a reader of one table finds there as of which Spanner commit the table is. Tables are
created with Change Data Feed on (Delta's own readers get the changes), deletion vectors (a
MERGE marks the rows it replaces instead of rewriting their files) and column mapping by name
(a Spanner column name may hold characters Delta's plain column names refuse).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spanner_cdc.consumer.decode.change_rows import IS_DELETE, REPLICA_ROW_ID, SET_PREFIX, SORT_COLUMNS
from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.sinks.replica.stage.table import ORDER_COLUMNS

#: Slices a batch may have; a commit's transaction version is batch times this, plus the slice.
SLICES_PER_BATCH = 1 << 20
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
#: The properties every table is created with.
TABLE_PROPERTIES = {
    "delta.enableChangeDataFeed": "true",
    "delta.enableDeletionVectors": "true",
    "delta.columnMapping.mode": "name",
}
#: The folded change's columns: its last change, its last delete's sort key, the tombstone's.
_LAST, _LAST_DELETE, _TOMBSTONE = "cdc$last", "cdc$last_delete", "cdc$tombstone"
#: The key's row after the rows' MERGE, as the tombstones' MERGE sees it.
_ROW = "cdc$row"
#: Short names of the sort key's fields, so sort keys of any origin compare as one struct type.
_ORDER_FIELDS = ("m", "t", "r", "i")


def quoted(name: str) -> str:
    """``name`` as a Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def table_reference(location: Location) -> str:
    """A Delta table by its location, in Spark SQL."""
    return f"delta.{quoted(location.uri)}"


@dataclass(frozen=True)
class Commit:
    """What a commit of ours is: a slice of a batch, applied up to a cut."""

    batch_id: int
    slice: int
    cut_micros: int | None

    @property
    def version(self) -> int:
        """Its transaction version: later slices and batches have greater ones."""
        return self.batch_id * SLICES_PER_BATCH + self.slice

    def metadata(self) -> str:
        return json.dumps({"batch": self.batch_id, "slice": self.slice, "cut_micros": self.cut_micros})


class DeltaSession:
    """A Spark session of the lakehouse's own (a new session of the job's, sharing its context):
    the transaction identifiers and commit metadata are session settings, and must not reach
    the job's other writes."""

    def __init__(self, spark: Any, app_id: str) -> None:
        self.spark = spark.newSession()
        self.app_id = app_id

    def sql(self, text: str) -> Any:
        return self.spark.sql(text)

    @contextmanager
    def committing(self, commit: Commit, *, idempotent: bool) -> Iterator[None]:
        """Commits made in the block carry ``commit``'s metadata; ``idempotent`` ones also its
        transaction identifiers (DDL takes none)."""
        conf = self.spark.conf
        conf.set(USER_METADATA, commit.metadata())
        if idempotent:
            conf.set(TXN_APP_ID, self.app_id)
            conf.set(TXN_VERSION, str(commit.version))
        try:
            yield
        finally:
            for name in (USER_METADATA, TXN_APP_ID, TXN_VERSION):
                conf.unset(name)

    def frame(self, rows: pa.Table) -> str:
        """``rows`` as a temporary view of this session; its name."""
        return self.view(self.spark.createDataFrame(rows))

    def view(self, frame: Any) -> str:
        """``frame`` as a temporary view of this session; its name."""
        name = f"cdc_{uuid.uuid4().hex[:12]}"
        frame.createOrReplaceTempView(name)
        return name

    def drop_view(self, name: str) -> None:
        self.spark.catalog.dropTempView(name)

    def exists(self, location: Location) -> bool:
        return location.is_dir() and (location / "_delta_log").is_dir()

    def columns(self, location: Location) -> dict[str, str]:
        """The table's columns and their Spark SQL types."""
        schema = self.spark.read.format("delta").load(location.uri).schema
        return {field.name: field.dataType.simpleString() for field in schema.fields}

    def empty(self, location: Location) -> bool:
        """Whether the table holds no rows (no data files)."""
        return int(self.sql(f"DESCRIBE DETAIL {table_reference(location)}").first()["numFiles"]) == 0

    def latest_version(self, location: Location) -> int:
        return int(self.sql(f"DESCRIBE HISTORY {table_reference(location)} LIMIT 1").first()[0])


@dataclass(frozen=True)
class DeltaTable:
    """One Spanner table's rows and tombstones as Delta tables, and how a slice changes them."""

    rows: Location
    tombstones: Location
    key: tuple[str, ...]

    def create(self, session: DeltaSession, stage: str, value_columns: Sequence[str], commit: Commit) -> None:
        """Both tables, with the columns of the stage view ``stage`` (unless they exist)."""
        properties = ", ".join(f"'{k}' = '{v}'" for k, v in TABLE_PROPERTIES.items())
        layouts = (
            (self.rows, [*self.key, *value_columns, *ORDER_COLUMNS, REPLICA_ROW_ID]),
            (self.tombstones, [*self.key, *ORDER_COLUMNS]),
        )
        with session.committing(commit, idempotent=False):
            for location, columns in layouts:
                if not session.exists(location):
                    session.sql(
                        f"CREATE TABLE {table_reference(location)} USING delta "
                        f"TBLPROPERTIES ({properties}) AS SELECT {_names(columns)} FROM {stage} LIMIT 0"
                    )

    def add_columns(self, session: DeltaSession, columns: Sequence[tuple[str, str]], commit: Commit) -> None:
        """``columns`` (name, Spark SQL type) added to the rows' table."""
        if columns:
            added = ", ".join(f"{quoted(name)} {kind}" for name, kind in columns)
            with session.committing(commit, idempotent=False):
                session.sql(f"ALTER TABLE {table_reference(self.rows)} ADD COLUMNS ({added})")

    def merge(
        self,
        session: DeltaSession,
        stage: str,
        value_columns: Sequence[str],
        commit: Commit,
        *,
        deletes: bool,
    ) -> None:
        """The slice's changes in the stage view ``stage`` into both tables (see the module's
        docstring). ``deletes``: the slice has a delete; without one, the tombstones change only
        when they hold any."""
        folded = self._folded(stage, value_columns)
        with session.committing(commit, idempotent=True):
            session.sql(self._rows_merge(folded, value_columns))
            if deletes or not session.empty(self.tombstones):
                session.sql(self._tombstones_merge(folded))

    def _rows_merge(self, folded: str, value_columns: Sequence[str]) -> str:
        """SQL: the folded changes into the rows, each counted only past the key's stored row
        and tombstone; a value column set only by a change past those and past the last delete
        (a row deleted and written again keeps none of its old values)."""
        last, last_delete, tombstone = (f"f.{quoted(c)}" for c in (_LAST, _LAST_DELETE, _TOMBSTONE))
        stored = f"greatest({_order('t')}, {tombstone})"
        newer, is_delete = f"{last}.o > {stored}", f"{last}.is_delete"
        from_change = [f"{quoted(c)} = {last}.{_field(c)}" for c in (*ORDER_COLUMNS, REPLICA_ROW_ID)]

        def set_past(passed: str, otherwise: str) -> list[str]:
            """Each value column's new value: the setting change's when it is past ``passed``."""
            return [
                f"{quoted(c)} = CASE WHEN f.{quoted(c)}.o > {passed} THEN f.{quoted(c)}.v "
                f"ELSE {otherwise.format(c=quoted(c))} END"
                for c in value_columns
            ]

        # a new key: past its tombstone and its last delete, if any (greatest of none is NULL)
        passed = f"greatest({tombstone}, {last_delete})"
        values = [
            *(f"f.{quoted(k)}" for k in self.key),
            *(
                f"CASE WHEN {passed} IS NULL OR f.{quoted(c)}.o > {passed} THEN f.{quoted(c)}.v END"
                for c in value_columns
            ),
            *(f"{last}.{_field(c)}" for c in (*ORDER_COLUMNS, REPLICA_ROW_ID)),
        ]
        recreated = [*set_past(f"greatest({stored}, {last_delete})", "NULL"), *from_change]
        updated = [*set_past(f"greatest({stored}, {last_delete})", "t.{c}"), *from_change]
        source = (
            f"SELECT f.*, {_order('d', nullable=True)} AS {quoted(_TOMBSTONE)} FROM ({folded}) AS f "
            f"LEFT JOIN {table_reference(self.tombstones)} AS d ON {self._match('f', 'd')}"
        )
        inserted = _names([*self.key, *value_columns, *ORDER_COLUMNS, REPLICA_ROW_ID])
        return (
            f"MERGE INTO {table_reference(self.rows)} AS t USING ({source}) AS f ON {self._match('t', 'f')} "
            f"WHEN MATCHED AND {newer} AND {is_delete} THEN DELETE "
            f"WHEN MATCHED AND {newer} AND {last_delete} > {stored} THEN UPDATE SET {', '.join(recreated)} "
            f"WHEN MATCHED AND {newer} THEN UPDATE SET {', '.join(updated)} "
            f"WHEN NOT MATCHED AND NOT {is_delete} AND ({tombstone} IS NULL OR {last}.o > {tombstone}) "
            f"THEN INSERT ({inserted}) VALUES ({', '.join(values)})"
        )

    def _tombstones_merge(self, folded: str) -> str:
        """SQL: the tombstones after the rows' MERGE — a key without a row whose last change is a
        delete past its tombstone gets one; a key whose row is newer than its tombstone loses it."""
        last, row = f"f.{quoted(_LAST)}", f"f.{quoted(_ROW)}"
        deleted = f"{row} IS NULL AND {last}.is_delete"
        source = (
            f"SELECT f.*, {_order('r', nullable=True)} AS {quoted(_ROW)} FROM ({folded}) AS f "
            f"LEFT JOIN {table_reference(self.rows)} AS r ON {self._match('f', 'r')}"
        )
        moved = ", ".join(f"{quoted(c)} = {last}.{_field(c)}" for c in ORDER_COLUMNS)
        columns = _names([*self.key, *ORDER_COLUMNS])
        values = ", ".join(
            [*(f"f.{quoted(k)}" for k in self.key), *(f"{last}.{_field(c)}" for c in ORDER_COLUMNS)]
        )
        return (
            f"MERGE INTO {table_reference(self.tombstones)} AS d USING ({source}) AS f "
            f"ON {self._match('d', 'f')} "
            f"WHEN MATCHED AND {row} > {_order('d')} THEN DELETE "
            f"WHEN MATCHED AND {deleted} AND {last}.o > {_order('d')} THEN UPDATE SET {moved} "
            f"WHEN NOT MATCHED AND {deleted} THEN INSERT ({columns}) VALUES ({values})"
        )

    def _match(self, left: str, right: str) -> str:
        """Same key, NULL equal to NULL (as in Spanner); a table without key columns has one key."""
        return " AND ".join(f"{left}.{quoted(k)} <=> {right}.{quoted(k)}" for k in self.key) or "TRUE"

    def _folded(self, stage: str, value_columns: Sequence[str]) -> str:
        """SQL: one row per key of ``stage``: its last change (sort key ``o``, delete or not,
        what the row stores of it), the sort key of its last delete, and per value column the
        last change that set it (``o``, value ``v``; NULL: none did)."""
        last = (
            f"max(named_struct('o', {_order()}, 'is_delete', {quoted(IS_DELETE)}, "
            + ", ".join(f"'{_field_name(c)}', {quoted(c)}" for c in [*ORDER_COLUMNS, REPLICA_ROW_ID])
            + f")) AS {quoted(_LAST)}"
        )
        last_delete = f"max(CASE WHEN {quoted(IS_DELETE)} THEN {_order()} END) AS {quoted(_LAST_DELETE)}"
        setting = "max(CASE WHEN {flag} THEN named_struct('o', {order}, 'v', {c}) END) AS {c}"
        columns = [
            setting.format(flag=quoted(SET_PREFIX + c), order=_order(), c=quoted(c)) for c in value_columns
        ]
        grouped = f" GROUP BY {_names(self.key)}" if self.key else ""
        selected = ", ".join([*(quoted(k) for k in self.key), last, last_delete, *columns])
        return f"SELECT {selected} FROM {stage}{grouped}"


def _order(alias: str | None = None, *, nullable: bool = False) -> str:
    """A change's sort key as one comparable struct (of a stored row or tombstone, by ``alias``);
    ``nullable``: NULL where an outer join found none."""
    prefix = f"{alias}." if alias else ""
    fields = (f"'{name}', {prefix}{quoted(c)}" for name, c in zip(_ORDER_FIELDS, SORT_COLUMNS, strict=True))
    order = f"named_struct({', '.join(fields)})"
    if nullable:
        return f"CASE WHEN {prefix}{quoted(SORT_COLUMNS[0])} IS NULL THEN NULL ELSE {order} END"
    return order


def _field_name(column: str) -> str:
    """A column of ours as a field of the folded change's struct (``cdc$tx_id`` → ``tx_id``)."""
    return column.removeprefix("cdc$")


def _field(column: str) -> str:
    return quoted(_field_name(column))


def _names(names: Sequence[str]) -> str:
    return ", ".join(quoted(n) for n in names)
