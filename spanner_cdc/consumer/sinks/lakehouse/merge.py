"""The lakehouse replica's side of a micro-batch: the ledger's transaction around it, each slice
of what the cut lets through merged into its tables' Delta tables, the cut table, then the
ledger made durable (ledger.py).

A table is ``<output-dir>/lakehouse/<table>`` (its tombstones in ``_tombstones/<table>``), by
its Spanner name, and its columns are the Spanner columns by their names, followed by the
change that wrote the row (``cdc$commit_micros``, ``cdc$tx_id``, ``cdc$record_sequence``,
``cdc$mod_index``, ``cdc$commit_timestamp``, ``cdc$row_id``). ``_cut`` names, after every batch,
the consistent cut and each table's Delta version at it: read each table at its version there
and every table is the source as of one Spanner commit.

What the SQL replicas follow and Delta cannot hold stops the table, as there (stopped.py): a
column whose type changed (Delta does not change a column's type in place), a table created
again with another primary key. Deleting the table's two directories starts it over.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote as url_quote
from urllib.parse import unquote

import pyarrow.compute as pc

from spanner_cdc.consumer.decode.change_rows import IS_DELETE
from spanner_cdc.consumer.errors import ConsumerError
from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.sinks.lakehouse.delta import (
    Commit,
    DeltaSession,
    DeltaTable,
)
from spanner_cdc.consumer.sinks.lakehouse.ledger import Ledger, LedgerBackend
from spanner_cdc.consumer.sinks.replica.cut import recorded_cut
from spanner_cdc.consumer.sinks.replica.history import RowHistory
from spanner_cdc.consumer.sinks.replica.names import quote
from spanner_cdc.consumer.sinks.replica.stage.rows import StagedPart
from spanner_cdc.consumer.sinks.replica.stage.table import ORDER_COLUMNS
from spanner_cdc.consumer.sinks.replica.stopped import StoppedTables
from spanner_cdc.consumer.spark.session import DELTA_SETTINGS
from spanner_cdc.schemas.timestamps import datetime_from_micros

log = logging.getLogger("spanner_cdc.consumer")
#: The Delta tables' directory in ``--output-dir``.
LAKEHOUSE_DIR = "lakehouse"
CUT_FILE = "_cut.json"
#: Each table's Delta version at the recorded cut, in the ledger.
VERSIONS = "cdc$lakehouse_versions"
TOMBSTONES = "_tombstones"
EXTENSIONS, CATALOG = "spark.sql.extensions", "spark.sql.catalog.spark_catalog"


@dataclass(frozen=True)
class LakehouseCut:
    """What ``_cut.json`` says: the consistent cut, each table's Delta version at it (as
    ``<location>@v<version>``, which Delta reads as that version), the stopped tables."""

    cut: dt.datetime | None
    tables: dict[str, str]
    stopped: dict[str, str]

    @classmethod
    def read(cls, root: Location) -> LakehouseCut:
        """The newest cut recorded under ``root`` (none: before the first batch)."""
        if not (root / CUT_FILE).is_file():
            return cls(None, {}, {})
        document = json.loads((root / CUT_FILE).read_text())
        micros = document["cut_micros"]
        tables = {t: f"{(root / _directory(t)).uri}@v{v}" for t, v in document["versions"].items()}
        return cls(None if micros is None else datetime_from_micros(micros), tables, document["stopped"])


def lakehouse_table(root: Location, table: str, key: Sequence[str]) -> DeltaTable:
    return DeltaTable(root / _directory(table), root / TOMBSTONES / _directory(table), tuple(key))


def _directory(table: str) -> str:
    """A table's directory name: its Spanner name, escaped as a URI path segment."""
    return url_quote(table, safe="")


@dataclass
class LakehouseMerge:
    """The replica store (sink.ReplicaStore) of ``--replica delta``."""

    ledger: Ledger
    #: ``<output-dir>/lakehouse``.
    root: Location
    stopped: StoppedTables = field(init=False)
    #: Streams read the SQL replicas' row history; the lakehouse has Delta's Change Data Feed.
    history: RowHistory | None = None
    _session: DeltaSession | None = None
    _commit: Commit | None = None
    _restored: bool = False
    #: Tables changed in the current batch.
    _changed: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.stopped = StoppedTables(self.ledger.backend)
        self.ledger.backend.execute(
            f"CREATE TABLE IF NOT EXISTS {quote(VERSIONS)} "
            "(table_name VARCHAR PRIMARY KEY, version BIGINT NOT NULL)"
        )

    @property
    def backend(self) -> LedgerBackend:
        return self.ledger.backend

    @contextmanager
    def batch(self, query_id: str, batch_id: int, spark: Any) -> Iterator[bool]:
        """The batch's ledger transaction: yields False for a batch whose state is committed (a
        replay), else True and, on leaving the block, writes ``_cut.json`` and commits the
        ledger's state. ``spark``: the batch's session, which the MERGEs run in (a session of
        their own made from it)."""
        if not self._restored:  # at the first batch: every bookkeeping table has been made
            self.ledger.restore()
            self._restored = True
        last = self.ledger.last_batch
        new = last is None or last < batch_id
        session = self._session_of(spark, query_id)
        try:
            with self.backend.transaction():
                self.ledger.begin()
                self._commit, self._changed = Commit(batch_id, 0, None), set()
                yield new
                if new:
                    self._record_cut(session, batch_id)
                    self.ledger.commit(batch_id)
        except BaseException:
            self.stopped.forget()
            raise
        finally:
            self._commit = None

    def write(self, parts: Sequence[StagedPart], cut: int | None = None) -> None:
        """One slice of the batch: each table's changes merged into its Delta tables; call
        inside :meth:`batch`."""
        assert self._commit is not None and self._session is not None, "write outside a batch"
        commit = Commit(self._commit.batch_id, self._commit.slice, cut)
        for part in parts:
            if part.rows.num_rows:
                target, wanted = lakehouse_table(self.root, part.table, part.key), _spark_types(part)
                stored = self._admitted(self._session, target, part, wanted)
                if stored is not None:
                    added = [(c, kind) for c, kind in wanted.items() if stored and c not in stored]
                    self._merge(self._session, target, part, commit, create=not stored, added=added)
        self._commit = Commit(commit.batch_id, commit.slice + 1, cut)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """``sql`` (names in double quotes) over the tables as they are now, each by its Spanner name."""
        assert self._session is not None
        spark = self._session.spark
        for table in self._tables():
            spark.read.format("delta").load(self._rows(table).uri).createOrReplaceTempView(table)
        return [tuple(row) for row in spark.sql(sql).collect()]

    def has_table(self, table: str) -> bool:
        found: bool = (self._rows(table) / "_delta_log").is_dir()
        return found

    def release(self) -> None:
        self.backend.release()

    def close(self) -> None:
        self.ledger.close()

    # --- per table ---------------------------------------------------------------------------

    def _session_of(self, spark: Any, query_id: str) -> DeltaSession:
        if self._session is None:
            extensions = spark.conf.get(EXTENSIONS, "") or ""
            if DELTA_SETTINGS[EXTENSIONS] not in extensions:
                needed = (EXTENSIONS, CATALOG)
                raise ConsumerError(
                    "--replica delta needs a Spark session with Delta Lake: "
                    + ", ".join(f"{k}={DELTA_SETTINGS[k]}" for k in needed)
                    + " and Delta's jars (docs/deployment.md)"
                )
            self._session = DeltaSession(spark, f"spanner-cdc-{query_id}")
            self._session.spark.conf.set("spark.sql.ansi.doubleQuotedIdentifiers", "true")
        return self._session

    def _admitted(
        self, session: DeltaSession, target: DeltaTable, part: StagedPart, wanted: dict[str, str]
    ) -> dict[str, str] | None:
        """The columns (and Spark SQL types) of ``part``'s rows table when its changes go into
        it (none: its Delta tables are still to be made); None when they do not: the table is
        stopped, or they cannot go in, which stops it. A stopped table whose Delta tables are
        gone starts again. ``wanted``: the changes' columns and their Spark SQL types."""
        table, events = part.table, part.rows.num_rows
        if table in self.stopped.known:
            if session.exists(target.rows):
                self.stopped.skip(table, events)
                return None
            self.stopped.start_again(table)
        if not (session.exists(target.rows) and session.exists(target.tombstones)):
            return {}
        stored = session.columns(target.rows)
        refusal = self._refusal(session, target, part, stored, wanted)
        if refusal is None:
            return stored
        self.stopped.stop(table, refusal, part.first_commit, events)
        return None

    def _refusal(
        self,
        session: DeltaSession,
        target: DeltaTable,
        part: StagedPart,
        stored: dict[str, str],
        wanted: dict[str, str],
    ) -> str | None:
        """Why ``part``'s changes (with the columns ``wanted``) cannot go into its Delta tables,
        whose rows have the columns ``stored``; None when they can."""
        start_over = f"delete {target.rows.uri} and {target.tombstones.uri} to start it over"
        stored_key = tuple(c for c in session.columns(target.tombstones) if c not in ORDER_COLUMNS)
        if stored_key != part.key:
            return (
                f"created again with primary key ({', '.join(part.key)}), its Delta tables have "
                f"({', '.join(stored_key)}): {start_over}"
            )
        changed = [c for c, kind in wanted.items() if c in stored and stored[c] != kind]
        if changed:
            column = changed[0]
            return (
                f"column {column} is {wanted[column]} in these changes and {stored[column]} in its Delta "
                f"table, which cannot change a column's type: {start_over}"
            )
        return None

    def _merge(
        self,
        session: DeltaSession,
        target: DeltaTable,
        part: StagedPart,
        commit: Commit,
        *,
        create: bool,
        added: list[tuple[str, str]],
    ) -> None:
        """``part``'s changes into its Delta tables: made first (``create``), or given the
        columns ``added`` (name, Spark SQL type) first."""
        values = [c.name for c in part.columns if c.name not in part.key]
        stage = session.frame(part.stage_rows())
        try:
            if create:
                target.create(session, stage, values, commit)
            target.add_columns(session, added, commit)
            deletes = bool(pc.any(part.rows.column(IS_DELETE)).as_py())
            target.merge(session, stage, values, commit, deletes=deletes)
        finally:
            session.drop_view(stage)
        self._changed.add(part.table)

    def _record_cut(self, session: DeltaSession, batch_id: int) -> None:
        """``_cut.json``: the batch, the consistent cut and, per table, its Delta version at the
        cut (a table the batch did not change keeps the version recorded before)."""
        for table in sorted(self._changed):
            version = session.latest_version(self._rows(table))
            self.backend.execute(
                f"INSERT INTO {quote(VERSIONS)} VALUES (?, ?) ON CONFLICT (table_name) "
                "DO UPDATE SET version = excluded.version",
                [table, version],
            )
        cut = recorded_cut(self.backend)
        versions = dict(self.backend.execute(f"SELECT table_name, version FROM {quote(VERSIONS)} ORDER BY 1"))
        document = {
            "batch_id": batch_id,
            "cut_micros": cut,
            "cut": None if cut is None else datetime_from_micros(cut).isoformat(),
            "versions": versions,
            "stopped": {table: stopped.described() for table, stopped in sorted(self.stopped.known.items())},
        }
        (self.root / CUT_FILE).write_bytes(json.dumps(document, indent=1).encode())

    def _rows(self, table: str) -> Location:
        return self.root / _directory(table)

    def _tables(self) -> list[str]:
        return [unquote(d.name) for d in self.root.directories() if not d.name.startswith("_")]


def _spark_types(part: StagedPart) -> dict[str, str]:
    """The Spark SQL type of each of ``part``'s columns, as Spark makes them from its Arrow rows."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(part.rows.select([c.name for c in part.columns]).schema)
    return {f.name: f.dataType.simpleString() for f in schema.fields}
