"""Tables the replica has stopped: their events cannot go into the tables it holds for them.

Two things a table's events can bring that no batch can ever merge: a column of another type
than the replica's table holds it (other than STRING <-> BYTES, which is followed: a table
dropped and created again under its name and key with other types), and, in DuckDB, a table
whose name differs only in case from one the replica holds (DuckDB takes ``accounts`` for
``Accounts``, Kafka's topics and ACLs do not). Failing the batch would fail it at every retry
and stop every table; so the replica stops that one table instead, in the batch's transaction:
``cdc$stopped`` keeps the table, the reason, the commit time of the first change not applied
and a count of those skipped since. The table's replica tables stay as they were at the last
change applied; every other table goes on, and the consistent cut with them.

A stopped table starts again once its replica table is gone: dropped by a user to start the
table over (the replica then starts a new generation of it, generations.py), or, for a name
that differs in case, the other table dropped. Its changes up to then are in the changelog and
on the topics (a backfill brings the rows back).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field, replace

from spanner_cdc.consumer.sinks.replica.backends import SqlBackend
from spanner_cdc.consumer.sinks.replica.names import quote
from spanner_cdc.schemas.timestamps import datetime_from_micros

log = logging.getLogger("spanner_cdc.consumer")
STOPPED_TABLE = "cdc$stopped"


@dataclass(frozen=True)
class StoppedTable:
    table: str
    reason: str
    #: The commit time of the first change not applied.
    since_micros: int
    skipped_events: int

    def described(self) -> str:
        """One line for ``replica status``: since when, how many changes, why."""
        since = datetime_from_micros(self.since_micros).isoformat()
        return f"since {since}, {self.skipped_events} change(s) not applied: {self.reason}"


def stopped_tables(backend: SqlBackend) -> dict[str, StoppedTable]:
    """Every stopped table, by its Spanner name."""
    rows = backend.execute(
        f"SELECT source_table, reason, since_micros, skipped_events FROM {quote(STOPPED_TABLE)}"
    )
    return {str(t): StoppedTable(str(t), str(r), int(s), int(n)) for t, r, s, n in rows}


@dataclass
class StoppedTables:
    """``cdc$stopped`` as this process knows it; call inside the batch's transaction."""

    backend: SqlBackend
    _known: dict[str, StoppedTable] | None = None
    #: Events skipped in the current batch, by table, for :meth:`skipped_in_batch`.
    _batch: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.backend.execute(
            f"CREATE TABLE IF NOT EXISTS {quote(STOPPED_TABLE)} (source_table VARCHAR PRIMARY KEY, "
            "reason VARCHAR NOT NULL, since_micros BIGINT NOT NULL, skipped_events BIGINT NOT NULL)"
        )

    @property
    def known(self) -> dict[str, StoppedTable]:
        if self._known is None:
            self._known = stopped_tables(self.backend)
        return self._known

    def forget(self) -> None:
        """Read the table again when next asked: a rolled-back transaction took its changes."""
        self._known = None
        self._batch.clear()

    def stop(self, table: str, reason: str, since_micros: int, events: int) -> None:
        """Stop ``table``: ``events`` changes from ``since_micros`` on are the first not applied."""
        self.backend.execute(
            f"INSERT INTO {quote(STOPPED_TABLE)} VALUES (?, ?, ?, ?)", [table, reason, since_micros, events]
        )
        self.known[table] = StoppedTable(table, reason, since_micros, events)
        self._batch[table] += events
        log.error("table %s is stopped in the replica, the other tables go on: %s", table, reason)

    def skip(self, table: str, events: int) -> None:
        """``events`` more changes of stopped ``table`` not applied."""
        self.backend.execute(
            f"UPDATE {quote(STOPPED_TABLE)} SET skipped_events = skipped_events + ? WHERE source_table = ?",
            [events, table],
        )
        stopped = self.known[table]
        self.known[table] = replace(stopped, skipped_events=stopped.skipped_events + events)
        self._batch[table] += events

    def start_again(self, table: str) -> None:
        """``table`` is no longer stopped (its replica table is gone: it starts over)."""
        self.backend.execute(f"DELETE FROM {quote(STOPPED_TABLE)} WHERE source_table = ?", [table])
        stopped = self.known.pop(table)
        log.warning(
            "table %s starts over in the replica: its replica table is gone (stopped since it skipped %d "
            "change(s): %s)",
            table,
            stopped.skipped_events,
            stopped.reason,
        )

    def skipped_in_batch(self) -> dict[str, int]:
        """Changes of stopped tables the batch did not apply, by table; cleared by the call."""
        skipped, self._batch = self._batch, Counter()
        return dict(skipped)
