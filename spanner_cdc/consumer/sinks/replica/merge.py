"""One SQL merge path for the replica, shared by PostgreSQL and DuckDB.

Per micro-batch, in one transaction:

1. skip the batch if ``cdc$batches`` says this query already committed it (a replay);
2. per table: create it, add new columns or follow a column from STRING to BYTES or back
   (schema evolution: tables.py), stage the batch's events — or, when its tables cannot
   hold them, stop that table and go on with the others (stopped.py);
3. drop staged events whose sort key is not newer than the row's stored one, or than the key's
   tombstone (so duplicates and out-of-order events change nothing);
4. fold each key's remaining events, in sort-key order, into one net change: the last event
   decides delete or upsert; each column takes the value of the last event that set it
   (``set$<column>``), counting only events after the key's last delete;
5. with whole transactions, keep the row history streams read (consumer.sinks.replica.history):
   the versions step 6 replaces or deletes, and every insert;
6. apply: delete, update only the columns that were set, insert new rows, move tombstones;
7. record the batch id for the query.

Deleted keys keep a tombstone (key and sort key) in ``<table>$deleted``, so a stale insert
arriving after a delete cannot bring the row back. Table and column names are the replica's
(names.py: PostgreSQL cannot hold every Spanner name whole), and PostgreSQL gets U+FFFD for
U+0000 in text (postgres_text.py). A table without key columns
(``PRIMARY KEY ()``, at most one row) is merged as one key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import astuple, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spanner_cdc.consumer.decode.change_rows import (
    IS_DELETE,
    REPLICA_ROW_ID,
    SET_PREFIX,
    SORT_COLUMNS,
)
from spanner_cdc.consumer.decode.table_version import TextOrBytes
from spanner_cdc.consumer.sinks.replica.backends import SqlBackend
from spanner_cdc.consumer.sinks.replica.generations import (
    Generation,
    create_generations_table,
    record_generation,
    table_generations,
)
from spanner_cdc.consumer.sinks.replica.history import (
    VALID_FROM,
    RowHistory,
)
from spanner_cdc.consumer.sinks.replica.names import REPLICA_PREFIX, ReplicaNames, quote, quote_all
from spanner_cdc.consumer.sinks.replica.stage.rows import STAGED_IN, STAGED_ROW, StagedPart
from spanner_cdc.consumer.sinks.replica.stage.table import (
    ORDER_COLUMNS,
    ReplicaTable,
    stage_definitions,
    stage_layout,
)
from spanner_cdc.consumer.sinks.replica.stopped import StoppedTables
from spanner_cdc.consumer.sinks.replica.stored_columns import (
    TYPE_COLUMNS,
    catalog_type,
    needs_recoding,
    text_or_bytes,
)
from spanner_cdc.consumer.sinks.replica.tables import ReplicaTables

log = logging.getLogger("spanner_cdc.consumer")
BATCHES_TABLE = "cdc$batches"
STAGE = "cdc$stage"
FOLDED = "cdc$folded"
_N, _LAST, _LAST_DELETE = "cdc$n", "cdc$last", "cdc$last_delete"
#: Rows a task loaded are selected by ranges of their numbers up to this many ranges.
_MAX_RANGES = 64


@dataclass
class ReplicaMerge:
    backend: SqlBackend
    #: Row history for streams; None keeps none (the replica does not apply whole transactions).
    history: RowHistory | None = None
    #: Spanner table → its current generation (generations.py), as far as this process read it.
    _generations: dict[str, Generation] = field(default_factory=dict)
    _tables: ReplicaTables = field(init=False)
    stopped: StoppedTables = field(init=False)

    @property
    def names(self) -> ReplicaNames:
        return self._tables.names

    def __post_init__(self) -> None:
        self.backend.execute(
            f"CREATE TABLE IF NOT EXISTS {quote(BATCHES_TABLE)} "
            "(query_id VARCHAR PRIMARY KEY, batch_id BIGINT NOT NULL, committed_at TIMESTAMPTZ NOT NULL)"
        )
        self._tables = ReplicaTables(self.backend)
        self.stopped = StoppedTables(self.backend)
        create_generations_table(self.backend)

    def last_batch(self, query_id: str) -> int | None:
        rows = self.backend.execute(
            f"SELECT batch_id FROM {quote(BATCHES_TABLE)} WHERE query_id = ?", [query_id]
        )
        return int(rows[0][0]) if rows else None

    @contextmanager
    def batch(self, query_id: str, batch_id: int, spark: Any = None) -> Iterator[bool]:
        """One database transaction for one micro-batch of one streaming query (``spark``, the
        batch's session, is not needed: the database does the work).

        Yields False, and records nothing, when the query already committed this batch (a
        replay); otherwise True, and on leaving the block records the batch id with whatever
        :meth:`write` (and the consistent cut) did inside it.
        """
        try:
            with self.backend.transaction():
                self._tables.forget_dropped()
                last = self.last_batch(query_id)
                new = last is None or last < batch_id
                yield new
                if new:
                    self.backend.execute(
                        f"INSERT INTO {quote(BATCHES_TABLE)} VALUES (?, ?, now()) "
                        "ON CONFLICT (query_id) DO UPDATE SET batch_id = excluded.batch_id, "
                        "committed_at = excluded.committed_at",
                        [query_id, batch_id],
                    )
        except BaseException:
            # DDL and names of the failed transaction were rolled back too
            self._tables.forget()
            self.stopped.forget()
            self._generations.clear()
            raise

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        return self.backend.execute(sql)

    def has_table(self, table: str) -> bool:
        found = self.backend.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]
        )
        return bool(found[0][0])

    def release(self) -> None:
        self.backend.release()

    def close(self) -> None:
        self.backend.close()

    def write(self, parts: Sequence[StagedPart], cut: int | None = None) -> None:
        """Merge each table's staged changes (stage.rows.combined: one part per table and key, a
        table's keys in commit order); call inside :meth:`batch`. ``cut`` is the consistent cut
        the batch applies up to (the new row versions begin there); None without whole transactions."""
        with_history = cut is not None and self.history is not None
        for part in parts:
            changes = self._mergeable(ReplicaTable.of(part, self.names), with_history)
            if changes is not None:
                self._apply_table(changes, cut)

    # --- per table ---------------------------------------------------------------------------

    def _mergeable(self, changes: ReplicaTable, with_history: bool) -> ReplicaTable | None:
        """``changes`` as the replica applies them; None when it applies none: their table is
        stopped, or its tables cannot hold them, which stops it (stopped.py), or none belong to
        its current generation. A stopped table whose replica table is gone starts again."""
        table, events = changes.changes.table, changes.changes.rows.num_rows
        if table in self.stopped.known:
            if self._tables.spelling(changes.names.table) is not None:
                self.stopped.skip(table, events)
                return None
            self.stopped.start_again(table)
        refusal = self._tables.name_refusal(changes)
        if refusal is None:
            current = self._current_generation(changes)
            if current is None:
                return None
            changes = self._late_texts(current)
            refusal = self._tables.type_refusal(changes, with_history)
        if refusal is None:
            return changes
        self.stopped.stop(table, refusal, changes.changes.first_commit, changes.changes.rows.num_rows)
        return None

    def _current_generation(self, changes: ReplicaTable) -> ReplicaTable | None:
        """``changes`` as far as they belong to the table's current generation (generations.py).
        Events with another primary key start the table over when committed after the current
        generation began, and are skipped when committed before it; None when none is left. A
        table the replica knows whose replica table is gone (dropped by hand, to start it over)
        starts over from these events too: its other tables (history, inserts) belong to the
        generation before, and streams on it would otherwise read the new rows against them."""
        table, events = changes.changes.table, changes.changes.rows.num_rows
        current = self._generation(changes)
        if current is None:
            self._start_generation(Generation(table, changes.changes.first_commit, changes.key, None))
            return changes
        if not self._tables.columns(changes.names.table):
            self._start_over(changes, changes.changes.first_commit, current)
            log.warning(
                "table %s: its replica table %s is gone (dropped outside the consumer): the table "
                "starts over from this batch, and streams created on it before are invalid",
                table,
                changes.names.table,
            )
            return changes
        catalog_key = self.names.catalog_key
        if tuple(map(catalog_key, current.key)) == tuple(map(catalog_key, changes.key)):
            return changes
        newer = changes.changes.committed_from(current.started_micros)
        if newer.rows.num_rows < events:
            log.warning(
                "table %s: %d event(s) with primary key (%s), committed before the table was created "
                "again with key (%s), skipped",
                table,
                events - newer.rows.num_rows,
                ", ".join(changes.key),
                ", ".join(current.key),
            )
        if not newer.rows.num_rows:
            return None
        self._start_over(changes, newer.first_commit, current)
        log.warning(
            "table %s was dropped and created again in Spanner (primary key (%s), was (%s)): its "
            "replica tables start over, and streams created on it before are invalid",
            table,
            ", ".join(changes.key),
            ", ".join(current.key),
        )
        return ReplicaTable.of(newer, self.names)

    def _generation(self, changes: ReplicaTable) -> Generation | None:
        """The table's current generation; None when the replica does not have the table. A
        table of a replica written before 0.3.0 counts as one generation, with its stored key."""
        table = changes.changes.table
        known = self._generations.get(table)
        if known is not None:
            return known
        found = table_generations(self.backend, table)
        if found:
            known = found[-1]
        else:
            stored = self._tables.columns(changes.names.tombstones)
            if not stored:
                return None
            known = Generation(table, 0, tuple(c for c in stored if not c.startswith(REPLICA_PREFIX)), None)
        self._generations[table] = known
        return known

    def _start_over(self, changes: ReplicaTable, started_micros: int, current: Generation) -> None:
        """A new generation of ``changes``' table from ``started_micros``: whatever is left of the
        current one's replica tables dropped (``ReplicaTables.ensure`` creates them again)."""
        self._tables.drop(astuple(changes.names))
        self._start_generation(Generation(changes.changes.table, started_micros, changes.key, current.key))

    def _start_generation(self, generation: Generation) -> None:
        record_generation(self.backend, generation)
        self._generations[generation.table] = generation

    def _apply_table(self, changes: ReplicaTable, cut: int | None) -> None:
        history = self.history if cut is not None else None
        self._tables.ensure(changes, history is not None)
        self._tables.record_names(changes)
        key = changes.key
        staged = self._stage(changes)
        same = self._key_comparison(changes, staged)
        matched = _match(key, same, "t", "f")  # a stored row (t) and its key's folded change (f)
        target, tombstones = quote(changes.names.table), quote(changes.names.tombstones)
        for stored in (target, tombstones):
            self.backend.execute(
                f"DELETE FROM {quote(STAGE)} AS s USING {stored} AS t "
                f"WHERE {_match(key, same)} AND NOT ({_order('s')} > {_order('t')})"
            )
        self._fold(changes)
        if history is not None and cut is not None:
            values = [c.name for c in changes.value_columns]
            changed = f"{quote(FOLDED)} AS f ON {matched}"
            history.close_versions(changes.names.table, changes.names.history, [*key, *values], changed, cut)
            history.keep_inserts(changes.names.inserts, STAGE, key, values, order=ORDER_COLUMNS, cut=cut)
            history.prune(changes.names.history, changes.names.inserts, cut)
        set_or_kept = "CASE WHEN f.{flag} THEN f.{column} ELSE t.{column} END"
        assignments = [
            *(
                (c.name, set_or_kept.format(flag=quote(SET_PREFIX + c.name), column=quote(c.name)))
                for c in changes.value_columns
            ),
            *((n, f"f.{quote(n)}") for n in (*ORDER_COLUMNS, REPLICA_ROW_ID)),
            (VALID_FROM, "?"),
        ]
        self.backend.execute(
            f"DELETE FROM {target} AS t USING {quote(FOLDED)} AS f WHERE {matched} "
            f"AND (f.{quote(IS_DELETE)} OR f.{quote(_LAST_DELETE)} IS NOT NULL)"
        )
        self.backend.update_joined(changes.names.table, assignments, FOLDED, matched, [cut])
        values = [
            *(f"f.{quote(k)}" for k in key),
            *(
                f"CASE WHEN f.{quote(SET_PREFIX + c.name)} THEN f.{quote(c.name)} END"
                for c in changes.value_columns
            ),
            *(f"f.{quote(n)}" for n in ORDER_COLUMNS),
            f"f.{quote(REPLICA_ROW_ID)}",
            "?",
        ]
        inserted = quote_all(
            [*key, *(c.name for c in changes.value_columns), *ORDER_COLUMNS, REPLICA_ROW_ID, VALID_FROM]
        )
        stored = f"SELECT 1 FROM {target} AS t WHERE {matched}"
        self.backend.execute(
            f"INSERT INTO {target} ({inserted}) SELECT {', '.join(values)} FROM {quote(FOLDED)} AS f "
            f"WHERE NOT f.{quote(IS_DELETE)} AND NOT EXISTS ({stored})",
            [cut],
        )
        self.backend.execute(f"DELETE FROM {tombstones} AS t USING {quote(FOLDED)} AS f WHERE {matched}")
        tomb_columns = quote_all([*key, *ORDER_COLUMNS])
        self.backend.execute(
            f"INSERT INTO {tombstones} ({tomb_columns}) SELECT {tomb_columns} FROM {quote(FOLDED)} "
            f"WHERE {quote(IS_DELETE)}"
        )
        self.backend.execute(f"DROP TABLE {quote(FOLDED)}")
        self.backend.execute(f"DROP TABLE {quote(STAGE)}")

    def _late_texts(self, changes: ReplicaTable) -> ReplicaTable:
        """``changes``, with each value column the replica holds as BYTES and the batch has only
        as STRING taken as BYTES (each text its UTF-8) when none of the batch's changes is newer
        than every change the table holds: those are late events from before Spanner changed the
        column to BYTES (a partition that lagged; without whole transactions a batch is not cut
        in commit order), not a change back. The column goes back to STRING with a newer change
        only — not back and forth with lagging partitions, and not failing on bytes a later
        change wrote that are not UTF-8."""
        existing, catalog_key = self._tables.columns(changes.names.table), self.names.catalog_key
        texts = []
        for source, column in zip(changes.changes.columns, changes.columns, strict=True):
            stored, wanted = existing.get(catalog_key(column.name)), column.type.text_or_bytes
            to_text = wanted is not None and not wanted.is_bytes
            if to_text and stored is not None and needs_recoding(stored.text_or_bytes, wanted):
                texts.append(source.name)
        if not texts:
            return changes
        newest = self.backend.execute(
            "SELECT max(m) FROM ("
            + " UNION ALL ".join(
                f"SELECT max({quote(SORT_COLUMNS[0])}) AS m FROM {quote(table)}"
                for table in (changes.names.table, changes.names.tombstones)
            )
            + ") AS newest"
        )[0][0]
        if newest is None or pc.max(changes.changes.commits).as_py() > newest:
            return changes
        log.info(
            "table %s: %d change(s) of column(s) %s as STRING, all older than the replica's newest "
            "change: late events from before the column became BYTES, written as their UTF-8",
            changes.changes.table,
            changes.changes.rows.num_rows,
            ", ".join(texts),
        )
        return ReplicaTable.of(changes.changes.as_bytes(texts), self.names)

    def _key_comparison(self, changes: ReplicaTable, staged: pa.Table) -> Callable[[str, str], str]:
        """How the merge compares keys: ``=`` while the table's key columns cannot hold NULL
        (a primary key, as created); once a NULL key value arrives, the table and its tombstones
        let the key columns hold NULL and keys compare NULL as equal to NULL, as Spanner does."""
        key = changes.key
        if not key:
            return _equal
        existing = self._tables.columns(changes.names.table)
        if all(existing[self.names.catalog_key(k)].nullable for k in key):
            return self.backend.null_safe_equal
        if not any(staged.column(k).null_count for k in key):
            return _equal
        for table in (changes.names.table, changes.names.tombstones):
            self._tables.allow_null_keys(table, key)
        log.info("table %s: a NULL key value arrived; its key columns now take NULL", changes.changes.table)
        return self.backend.null_safe_equal

    def _stage(self, changes: ReplicaTable) -> pa.Table:
        """The batch's rows of the table, in the stage table; returns them as loaded."""
        definitions = stage_definitions(changes, self.backend.dialect)
        self.backend.execute(f"CREATE TEMP TABLE {quote(STAGE)} ({', '.join(definitions)})")
        cleaned = self.backend.storable(changes.stage_rows(), changes.columns)
        if cleaned.replaced:
            log.warning(
                "table %s: %d value(s) held U+0000, which PostgreSQL cannot store; "
                "the replica has U+FFFD in its place, the changelog the exact value",
                changes.changes.table,
                cleaned.replaced,
            )
        part = changes.changes
        loaded = part.loaded()
        if not loaded:
            self.backend.load(STAGE, cleaned.rows)
            return cleaned.rows
        only_in_files = cleaned.rows.filter(pc.is_null(part.rows.column(STAGED_IN)))
        if only_in_files.num_rows:
            self.backend.load(STAGE, only_in_files)
        layout = [name for name, _ in stage_layout(changes, self.backend.dialect)]
        wanted = {c.name: c.type.text_or_bytes for c in changes.columns}
        present = self._loaded_columns([table for table, _ in loaded])
        for table, numbers in loaded:
            self._stage_loaded(layout, wanted, table, present.get(table, {}), numbers)
        return cleaned.rows

    def _loaded_columns(self, tables: Sequence[str]) -> dict[str, dict[str, TextOrBytes | None]]:
        """The columns of each table the tasks loaded, and which hold text or bytes, in one
        catalog query."""
        present: dict[str, dict[str, TextOrBytes | None]] = {}
        for table, column, data_type, udt in self.backend.execute(
            f"SELECT table_name, column_name, {TYPE_COLUMNS} FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ANY(?)",
            [list(tables)],
        ):
            present.setdefault(str(table), {})[str(column)] = text_or_bytes(catalog_type(data_type, udt))
        return present

    def _stage_loaded(
        self,
        layout: Sequence[str],
        wanted: dict[str, TextOrBytes | None],
        table: str,
        present: dict[str, TextOrBytes | None],
        numbers: pa.Array,
    ) -> None:
        """Rows a task loaded into ``table`` (stage/loaded.py; its columns ``present``), by
        their numbers there, into the stage table of columns ``layout``: a column the table lacks
        (an older table version's part) is NULL, and not set; one the task loaded as text that the
        batch holds as bytes (``wanted``; a column Spanner changed: table_version.merged) is
        converted."""
        columns = [name for name in layout if name in present or name.startswith(SET_PREFIX)]
        values = []
        for name in columns:
            stored, to = present.get(name), wanted.get(name)
            if name not in present:
                values.append("FALSE")
            elif to is not None and needs_recoding(stored, to):
                values.append(self.backend.recoded(quote(name), to))
            else:
                values.append(quote(name))
        where, params = _numbered(numbers)
        self.backend.execute(
            f"INSERT INTO {quote(STAGE)} ({quote_all(columns)}) SELECT {', '.join(values)} "
            f"FROM {quote(table)} WHERE {where}",
            params,
        )

    def _fold(self, changes: ReplicaTable) -> None:
        """One row per key of the stage table: its last change since its last delete, each value
        column as the last of those changes that set it (``set$`` false where none did).

        A column's last setting change is found by position, not by a sort of its own: its
        ``set$`` column first carries the position (``cdc$n``) of that change among the key's
        rows, then ``nth_value`` (PostgreSQL's takes an INTEGER) reads the value there. So a
        fold's sorts do not grow with the table's columns (PostgreSQL's plan has three); ordering
        each column's changes by its flag cost a sort per value column (21 for ten columns), and
        such sorts spilled to disk at 45,000 rows.
        """
        key = changes.key
        by_key = f"PARTITION BY {quote_all(key)}" if key else ""
        n = quote(_N)
        # the position of the key's first relevant row: its last delete, else its first row
        first = f"coalesce({quote(_LAST_DELETE)}, 1)"
        whole = f"({by_key} ORDER BY {n} ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)"
        carried = quote_all([*key, _N, _LAST, _LAST_DELETE, IS_DELETE, REPLICA_ROW_ID, *ORDER_COLUMNS])
        flags = [(quote(c.name), quote(SET_PREFIX + c.name)) for c in changes.value_columns]
        positions = "".join(
            f", {column}, max(CASE WHEN {flag} THEN {n} END) OVER ({by_key}) AS {flag}"
            for column, flag in flags
        )
        values = "".join(
            f", nth_value({column}, CAST({flag} - {first} + 1 AS INTEGER)) OVER {whole} AS {column}, "
            f"{flag} IS NOT NULL AS {flag}"
            for column, flag in flags
        )
        self.backend.execute(
            f"CREATE TEMP TABLE {quote(FOLDED)} AS "
            f"WITH ordered AS (SELECT *, row_number() OVER ({by_key} ORDER BY {quote_all(SORT_COLUMNS)}) "
            f"AS {n} FROM {quote(STAGE)}), "
            f"marked AS (SELECT *, max(CASE WHEN {quote(IS_DELETE)} THEN {n} END) OVER ({by_key}) "
            f"AS {quote(_LAST_DELETE)}, max({n}) OVER ({by_key}) AS {quote(_LAST)} FROM ordered), "
            f"relevant AS (SELECT {carried}{positions} FROM marked WHERE {n} >= {first}), "
            f"folded AS (SELECT {carried}{values} FROM relevant) "
            f"SELECT * FROM folded WHERE {n} = {quote(_LAST)}"
        )


def _numbered(numbers: pa.Array) -> tuple[str, list[Any]]:
    """SQL selecting the rows whose ``cdc$staged_row`` is one of ``numbers`` (distinct): a
    range per run of consecutive numbers while they are few (a part taken whole, or up to the
    cut, is one run), else the numbers as an array."""
    ordered = pc.sort_indices(numbers)
    numbers = numbers.take(ordered)
    column = quote(STAGED_ROW)
    starts = [0]
    if len(numbers) > 1:
        steps = pc.subtract(numbers[1:], numbers[:-1])
        starts += [int(i) + 1 for i in pc.indices_nonzero(pc.not_equal(steps, 1)).to_pylist()]
    if len(starts) > _MAX_RANGES:
        return f"{column} = ANY(?)", [numbers.to_pylist()]
    ends = [*(s - 1 for s in starts[1:]), len(numbers) - 1]
    ranges = [(numbers[s].as_py(), numbers[e].as_py()) for s, e in zip(starts, ends, strict=True)]
    return " OR ".join(f"{column} BETWEEN ? AND ?" for _ in ranges), [n for r in ranges for n in r]


def _match(key: Sequence[str], same: Callable[[str, str], str], left: str = "s", right: str = "t") -> str:
    """Same key; a table without key columns has one key, so every row matches."""
    return " AND ".join(same(f"{left}.{quote(k)}", f"{right}.{quote(k)}") for k in key) or "TRUE"


def _equal(left: str, right: str) -> str:
    return f"{left} = {right}"


def _order(alias: str) -> str:
    return "(" + ", ".join(f"{alias}.{quote(n)}" for n in SORT_COLUMNS) + ")"
