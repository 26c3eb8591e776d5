"""Streams over the replica: the Python API (``spanner-cdc stream …`` and ``changes`` call it).

Every read happens in one snapshot transaction, so the replica's cut and the rows it reads
belong together even while ``spanner-cdc consume`` commits batches. Reading never moves an
offset; :meth:`StreamReplica.consuming` moves it in the transaction that writes what was read —
the caller's own statements included — so a failure leaves the stream as it was and of two
racing consumers exactly one commits.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from spanner_cdc.consumer.errors import ReplicaConflictError
from spanner_cdc.consumer.sinks.replica.backends import Selected, SqlBackend, find_table
from spanner_cdc.consumer.sinks.replica.cut import recorded_cut
from spanner_cdc.consumer.sinks.replica.generations import recreated_since
from spanner_cdc.consumer.sinks.replica.history import HistoryState, read_state
from spanner_cdc.consumer.sinks.replica.names import REPLICA_PREFIX, ReplicaNames, quote, quote_all
from spanner_cdc.consumer.sinks.replica.stopped import STOPPED_TABLE, stopped_tables
from spanner_cdc.consumer.streams.catalog import Stream, StreamCatalog, StreamError
from spanner_cdc.consumer.streams.delta import CHANGE_COLUMNS, delta_query
from spanner_cdc.consumer.streams.modes import DEFAULT_MODE, MODES
from spanner_cdc.consumer.streams.tables import (
    SourceNames,
    replicated_table,
    replicated_tables,
    source_names,
)
from spanner_cdc.schemas.timestamps import datetime_from_micros

#: Where a consume keeps the rows it read, for the caller's statements (a temporary table).
DELTA_TABLE = "stream$delta"


@dataclass(frozen=True)
class StreamState:
    """One stream as ``stream show`` prints it."""

    stream: Stream
    stale: bool
    #: When the cut passing it makes the stream stale (offset + retention); None before history.
    stale_after: dt.datetime | None
    invalid_reason: str


@dataclass(frozen=True)
class Consumption:
    """What one consume read, inside its transaction: :attr:`table` holds the rows for SQL."""

    backend: SqlBackend
    rows: Selected
    table: str = quote(DELTA_TABLE)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """A statement in the consume's transaction (``?`` placeholders)."""
        return self.backend.execute(sql, params)


@dataclass(frozen=True)
class TableStatus:
    """One replicated table in ``replica status``."""

    #: The Spanner table; the replica's name when it kept none (no change since version 0.3.0).
    source: str
    #: None for a table stopped before the replica held it (its name was another's: stopped.py).
    replica_table: str | None
    rows: int | None
    #: Spanner column → replica column, for the columns the replica renamed (names.py).
    renamed_columns: dict[str, str]
    #: Why the replica stopped the table, since when and how many changes it did not apply;
    #: None while it replicates.
    stopped: str | None = None


@dataclass(frozen=True)
class ReplicaStatus:
    cut: dt.datetime | None
    tables: list[TableStatus]


class StreamReplica:
    """Streams and CHANGES over one replica database."""

    def __init__(self, backend: SqlBackend) -> None:
        self.backend = backend
        with backend.transaction():
            self.catalog = StreamCatalog(backend)

    def close(self) -> None:
        self.backend.close()

    # --- the verbs --------------------------------------------------------------------------

    def create(self, name: str, on: str, mode: str = DEFAULT_MODE, comment: str = "") -> Stream:
        """A stream on Spanner table ``on`` whose offset is the replica's current cut (a table
        whose first change has not arrived yet shows every change once it does)."""
        _check_mode(mode)
        with self.backend.snapshot_transaction():
            self.catalog.add(name, on, mode, recorded_cut(self.backend) or 0, comment)
            return self.catalog.get(name)

    def drop(self, name: str) -> None:
        with self.backend.transaction():
            self.catalog.remove(name)

    def show(self) -> list[StreamState]:
        with self.backend.snapshot_transaction():
            state = read_state(self.backend)
            kept_from = self._kept_from(state)
            return [
                StreamState(
                    stream,
                    stream.offset_micros < kept_from,
                    None
                    if state is None
                    else datetime_from_micros(stream.offset_micros + state.retention_micros),
                    self._invalid_reason(f"stream {stream.name!r}", stream.table_on, stream.offset_micros),
                )
                for stream in self.catalog.all()
            ]

    def read(self, name: str) -> Selected:
        """The stream's rows now; the offset does not move."""
        with self.backend.snapshot_transaction():
            stream = self._usable(name)
            return self._delta(
                stream.table_on, stream.mode, stream.offset_micros, recorded_cut(self.backend) or 0
            )

    def has_data(self, name: str) -> bool:
        """Does the stream have rows? When not, its offset moves to the current cut (nothing is
        skipped: there is nothing to read), which keeps an idle stream from going stale."""
        with self.backend.snapshot_transaction():
            stream = self._usable(name)
            cut = recorded_cut(self.backend) or 0
            if self._delta(stream.table_on, stream.mode, stream.offset_micros, cut).rows:
                return True
            if cut != stream.offset_micros:
                self.catalog.move_offset(stream, cut)
            return False

    @contextmanager
    def consuming(self, name: str) -> Iterator[Consumption]:
        """Read the stream in a transaction and move its offset when the block ends without an
        error; the block's statements (:meth:`Consumption.execute`) commit with the move. An
        empty block still moves the offset (Snowflake's ``WHERE 0 = 1`` idiom)."""
        try:
            with self._consume_transaction(name) as consumption:
                yield consumption
        except ReplicaConflictError:
            raise StreamError(
                f"stream {name!r} was consumed by another transaction meanwhile; nothing was written"
            ) from None

    @contextmanager
    def _consume_transaction(self, name: str) -> Iterator[Consumption]:
        with self.backend.snapshot_transaction():
            stream = self._usable(name)
            cut = recorded_cut(self.backend) or 0
            query, params = self._delta_query(stream.table_on, stream.mode, stream.offset_micros, cut)
            self.backend.execute(f"DROP TABLE IF EXISTS {quote(DELTA_TABLE)}")
            self.backend.execute(f"CREATE TEMP TABLE {quote(DELTA_TABLE)} AS {query}", params)
            yield Consumption(self.backend, self.backend.select(f"SELECT * FROM {quote(DELTA_TABLE)}"))
            self.catalog.move_offset(stream, cut)
            # On an error the rollback takes the temporary table with it.
            self.backend.execute(f"DROP TABLE {quote(DELTA_TABLE)}")

    def consume(self, name: str, into: str, columns: Sequence[str] = ()) -> int:
        """Insert the stream's rows (``columns``, default the table's) into table ``into`` of the
        replica database, created with those columns' types when missing; returns the count."""
        self._check_target(into)
        with self.consuming(name) as consumption:
            available = consumption.rows.names
            chosen = list(columns) or [c for c in available if c not in CHANGE_COLUMNS]
            unknown = [c for c in chosen if c not in available]
            if unknown:
                raise StreamError(
                    f"no column {', '.join(unknown)} in stream {name!r}; it has {', '.join(available)}"
                )
            if not chosen:
                return 0  # the table has no columns yet: nothing arrived, the offset still moves
            selected = quote_all(chosen)
            consumption.execute(
                f"CREATE TABLE IF NOT EXISTS {quote(into)} AS "
                f"SELECT {selected} FROM {consumption.table} WHERE FALSE"
            )
            consumption.execute(
                f"INSERT INTO {quote(into)} ({selected}) SELECT {selected} FROM {consumption.table}"
            )
            return len(consumption.rows.rows)

    def changes(
        self, table: str, start_micros: int, end_micros: int | None = None, mode: str = DEFAULT_MODE
    ) -> Selected:
        """CHANGES: the change of ``table`` after cut ``start_micros`` up to ``end_micros`` (default
        the current cut), without a stream. A time between two cuts reads as the older one."""
        _check_mode(mode)
        with self.backend.snapshot_transaction():
            cut = recorded_cut(self.backend) or 0
            end = cut if end_micros is None else min(end_micros, cut)
            self._check_history(f"table {table!r}", start_micros)
            self._check_generation(f"CHANGES of {table!r}", table, start_micros, "start after that time")
            if end < start_micros:
                raise StreamError("the end is before the start")
            return self._delta(table, mode, start_micros, end)

    def status(self) -> ReplicaStatus:
        catalog_key = ReplicaNames.for_dialect(self.backend.dialect).catalog_key
        with self.backend.snapshot_transaction():
            cut = recorded_cut(self.backend)
            sources = source_names(self.backend)
            tables = []
            stopped = stopped_tables(self.backend) if find_table(self.backend, STOPPED_TABLE) else {}
            for name in replicated_tables(self.backend):
                rows = int(self.backend.execute(f"SELECT count(*) FROM {quote(name)}")[0][0])
                source = sources.get(catalog_key(name), SourceNames((name,), {}))
                why = [stopped.pop(t).described() for t in source.tables if t in stopped]
                tables.append(
                    TableStatus(
                        ", ".join(source.tables), name, rows, source.renamed_columns, "; ".join(why) or None
                    )
                )
            tables += [TableStatus(t, None, None, {}, s.described()) for t, s in sorted(stopped.items())]
        return ReplicaStatus(None if cut is None else datetime_from_micros(cut), tables)

    # --- inside a transaction -----------------------------------------------------------------

    def _kept_from(self, state: HistoryState | None) -> int:
        """The oldest cut whose state the replica's history holds (before any history: the cut)."""
        return state.kept_from_micros if state is not None else (recorded_cut(self.backend) or 0)

    def _usable(self, name: str) -> Stream:
        stream = self.catalog.get(name)
        self._check_generation(
            f"stream {name!r}", stream.table_on, stream.offset_micros, "drop the stream and create it again"
        )
        self._check_history(f"stream {name!r}", stream.offset_micros)
        return stream

    def _invalid_reason(self, what: str, table: str, start: int) -> str:
        """Why ``what``, on ``table`` from cut ``start``, cannot be read; empty when it can."""
        recreated = recreated_since(self.backend, table, start)
        if recreated is None:
            return ""
        if recreated.key == recreated.previous_key:  # only a replica table dropped by hand starts one so
            how = "started over in the replica (its replica table was dropped)"
        else:
            old_key = ", ".join(recreated.previous_key or ())
            how = f"was dropped and created again (primary key ({', '.join(recreated.key)}), was ({old_key}))"
        when = datetime_from_micros(recreated.started_micros).isoformat()
        return f"{what} is invalid: table {table!r} {how} at {when}, after it starts"

    def _check_generation(self, what: str, table: str, start: int, remedy: str) -> None:
        reason = self._invalid_reason(what, table, start)
        if reason:
            raise StreamError(f"{reason}; {remedy}")

    def _check_history(self, what: str, start: int) -> None:
        kept_from = self._kept_from(read_state(self.backend))
        if start < kept_from:
            raise StreamError(
                f"{what} is stale: it starts at {datetime_from_micros(start).isoformat()}, and the replica "
                f"keeps history from {datetime_from_micros(kept_from).isoformat()} "
                "(consume --history-retention-hours); create the stream again"
            )

    def _delta_query(self, table_on: str, mode: str, start: int, end: int) -> tuple[str, list[Any]]:
        table = replicated_table(self.backend, table_on)
        if not table.exists:  # no change has arrived: no columns yet, no rows
            return f"SELECT {', '.join(f'NULL AS {quote(c)}' for c in CHANGE_COLUMNS)} WHERE FALSE", []
        return delta_query(self.backend, table, mode, start, end)

    def _delta(self, table_on: str, mode: str, start: int, end: int) -> Selected:
        query, params = self._delta_query(table_on, mode, start, end)
        return self.backend.select(query, params)

    def _check_target(self, into: str) -> None:
        replicated = {t.lower() for t in replicated_tables(self.backend)}
        if not into or "$" in into or into.startswith(REPLICA_PREFIX) or into.lower() in replicated:
            raise StreamError(
                f"cannot consume into {into!r}: the target must be a table of your own, not one the "
                "replica maintains (no '$' in its name)"
            )


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise StreamError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
