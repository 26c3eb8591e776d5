"""Row history for streams: the replica's state at every consistent cut, for a retention.

A stream's offset is a consistent cut, and a stream is the difference between the replica's
state at two cuts (consumer.streams). So the merge keeps, in each batch's transaction and only
when the replica applies whole transactions (there is no cut otherwise):

- on every current row ``cdc$row_id`` (the changelog's ``change$row_id``: one per table and key)
  and ``cdc$valid_from``, the cut of the batch that wrote this version of the row (NULL: written
  before history was kept, so valid since the beginning);
- ``<table>$history``: the versions the merge replaced or deleted, each with ``cdc$valid_from``
  and ``cdc$valid_to`` (the cut of the batch that ended it);
- ``<table>$inserts``: every insert with ``cdc$cut``, its batch's cut (an insert-only stream shows
  inserts of rows deleted since);
- ``cdc$history`` (one row): the retention and ``kept_from_micros``, the oldest cut whose state
  the history still holds whole. Each batch drops from the tables it touches the versions that
  ended, and the inserts made, before ``cut - retention``; ``kept_from_micros`` moves up to that
  point when something was dropped.

The state at cut ``c`` is every current row with ``valid_from <= c`` and every history row with
``valid_from <= c < valid_to``. A time between two cuts reads as the older cut: the replica never
held a state between them. History is per cut, not per event, because a batch folds each key's
changes into one (consumer.sinks.replica.merge) — the same granularity at which it is visible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spanner_cdc.consumer.decode.change_rows import IS_INSERT, REPLICA_ROW_ID, SET_PREFIX
from spanner_cdc.consumer.sinks.replica.backends import SqlBackend, find_table
from spanner_cdc.consumer.sinks.replica.names import quote, quote_all

VALID_FROM = "cdc$valid_from"
VALID_TO = "cdc$valid_to"
INSERT_CUT = "cdc$cut"
SETTINGS = "cdc$history"
#: What every current row carries for its history, with SQL types the same in both databases.
ROW_VERSION_COLUMNS = ((REPLICA_ROW_ID, "VARCHAR"), (VALID_FROM, "BIGINT"))
HISTORY_COLUMNS = (*ROW_VERSION_COLUMNS, (VALID_TO, "BIGINT NOT NULL"))
#: What every insert carries besides its columns (and the merge's order columns).
INSERT_COLUMNS = ((REPLICA_ROW_ID, "VARCHAR"), (INSERT_CUT, "BIGINT NOT NULL"))


@dataclass(frozen=True)
class HistoryState:
    """What ``cdc$history`` says: how long history is kept, and from which cut it is whole."""

    retention_micros: int
    kept_from_micros: int


def read_state(backend: SqlBackend) -> HistoryState | None:
    """None when no consumer has kept history in this replica yet."""
    return _stored_state(backend) if find_table(backend, SETTINGS) is not None else None


def _stored_state(backend: SqlBackend) -> HistoryState | None:
    rows = backend.execute(f"SELECT retention_micros, kept_from_micros FROM {quote(SETTINGS)} WHERE id = 1")
    return HistoryState(int(rows[0][0]), int(rows[0][1])) if rows else None


@dataclass
class RowHistory:
    """The merge's side of the history: called inside the batch's transaction."""

    backend: SqlBackend
    retention_micros: int
    #: The newest prune threshold this batch used that dropped something (0: none).
    _pruned_before: int = 0

    def __post_init__(self) -> None:
        self.backend.execute(
            f"CREATE TABLE IF NOT EXISTS {quote(SETTINGS)} (id INTEGER PRIMARY KEY, "
            "retention_micros BIGINT NOT NULL, kept_from_micros BIGINT NOT NULL)"
        )

    def close_versions(
        self, target: str, history: str, columns: Sequence[str], changed: str, cut: int
    ) -> None:
        """Copy the stored versions of the keys this batch changes into history, ended at ``cut``.

        ``changed`` is SQL joining the stored row ``t`` to a changed key ``f`` (which brings the
        row id a row written before history was kept does not have). A version written earlier
        in this batch (a slice before) began at ``cut``: it was never visible and is not kept.
        """
        names = quote_all(columns)
        values = ", ".join(f"t.{quote(c)}" for c in columns)
        row_id, valid_from = quote(REPLICA_ROW_ID), quote(VALID_FROM)
        self.backend.execute(
            f"INSERT INTO {quote(history)} ({names}, {row_id}, {valid_from}, {quote(VALID_TO)}) "
            f"SELECT {values}, coalesce(t.{row_id}, f.{row_id}), t.{valid_from}, ? "
            f"FROM {quote(target)} AS t JOIN {changed} WHERE coalesce(t.{valid_from}, -1) < ?",
            [cut, cut],
        )

    def keep_inserts(
        self,
        inserts: str,
        stage: str,
        key: Sequence[str],
        values: Sequence[str],
        *,
        order: Sequence[str],
        cut: int,
    ) -> None:
        """Every insert event of the stage, with the values it set and its ``order`` columns
        (the merge's sort key and commit time)."""
        set_values = [f"CASE WHEN {quote(SET_PREFIX + v)} THEN {quote(v)} END" for v in values]
        kept = [REPLICA_ROW_ID, *order]
        names = quote_all([*key, *values, *kept, INSERT_CUT])
        selected = ", ".join([*(quote(k) for k in key), *set_values, *(quote(c) for c in kept), "?"])
        self.backend.execute(
            f"INSERT INTO {quote(inserts)} ({names}) SELECT {selected} FROM {quote(stage)} "
            f"WHERE {quote(IS_INSERT)}",
            [cut],
        )

    def prune(self, history: str, inserts: str, cut: int) -> None:
        """Drop what only cuts older than the retention needed; remember that it is gone."""
        oldest = cut - self.retention_micros
        for table, ended in ((history, VALID_TO), (inserts, INSERT_CUT)):
            where = f"FROM {quote(table)} WHERE {quote(ended)} < ?"
            if self.backend.execute(f"SELECT count(*) {where}", [oldest])[0][0]:
                self.backend.execute(f"DELETE {where}", [oldest])
                self._pruned_before = oldest

    def record(self, cut: int, previous_cut: int | None) -> None:
        """After a batch that applied up to ``cut``: from which cut the history is whole.

        The first batch that keeps history can rebuild the cut before it (every row it changes
        goes to history), and a new replica the empty state before its first cut. It stays whole
        from there until a prune drops something.
        """
        state = _stored_state(self.backend)  # the table exists: __post_init__ made it
        start = state.kept_from_micros if state is not None else (previous_cut or 0)
        kept_from = max(start, self._pruned_before)
        self._pruned_before = 0
        self.backend.execute(
            f"INSERT INTO {quote(SETTINGS)} VALUES (1, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "retention_micros = excluded.retention_micros, kept_from_micros = excluded.kept_from_micros",
            [self.retention_micros, kept_from],
        )
