"""A PostgreSQL replica's stage rows, loaded by the tasks that built them.

With a PostgreSQL replica, a task that staged its share of a batch (stage/rows.py) also loads each
part's stage rows (of a few thousand rows or more: :data:`TASKS_LOAD_FROM_ROWS`) into a table
of its own — ``cdc$staged$<query>$<batch>$<job>$<task>$<part>``, UNLOGGED, laid out as the
merge's stage table (stage/table.py), U+0000 already replaced (postgres_text.py) — by COPY, in
parallel with the other tasks, each on its own connection and in its own transaction. The rows
in the task's files are numbered as loaded (``StagedPart.loaded_into``), so the driver's merge
takes exactly the rows it was handed from those tables by number, in the database
(``INSERT … SELECT``), rather than sending them itself; rows only a file holds (held events
kept from earlier batches, a few read again on the driver, parts too small for a task to load)
it still sends by COPY.

Why a table per task and part, not one staging table per replicated table: a task creates,
fills and commits its own table without waiting for another task, a retried or speculative
attempt replaces it whole (drop and create in the attempt's transaction: the names are
deterministic, so the attempt whose files the driver reads is the attempt whose table it
finds), and a table created again in Spanner with other column types cannot meet the old
layout. The price is a few catalog entries per part (created by tasks, dropped by the driver).

The tables of a batch are dropped in the replica transaction that merges it (replayed or not),
and every table of the query at its first batch after a start: nothing outlives a batch but
what a crash left, and the next start removes that.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import psycopg

from spanner_cdc.common.secrets import redact
from spanner_cdc.consumer.errors import ReplicaConnectionError
from spanner_cdc.consumer.sinks.replica.names import ReplicaNames, quote
from spanner_cdc.consumer.sinks.replica.postgres_copy import copy_rows
from spanner_cdc.consumer.sinks.replica.postgres_text import without_nul
from spanner_cdc.consumer.sinks.replica.stage.rows import STAGED_ROW, StagedPart
from spanner_cdc.consumer.sinks.replica.stage.table import ReplicaTable, stage_definitions

#: Every table a task loads begins with it.
STAGED_TABLE_PREFIX = "cdc$staged$"
#: A part of fewer rows is left to the driver: a task's connection, table and commit cost a fixed
#: time whatever the rows, about what the driver's COPY takes for this many. Below this the task
#: would lengthen a small batch more than it spares the driver, and a batch over many tables
#: would create a table per table and task.
TASKS_LOAD_FROM_ROWS = 4_000
#: The tasks' connections name themselves so (``pg_stat_activity``, the server's log).
APPLICATION_NAME = "spanner-cdc stage task"
_DIALECT = "postgres"


def query_tag(query_id: str) -> str:
    """A streaming query's part of its staged tables' names: several queries may share a replica."""
    return hashlib.sha256(query_id.encode()).hexdigest()[:8]


def query_prefix(query_id: str) -> str:
    """The name prefix of every table the query's tasks load."""
    return f"{STAGED_TABLE_PREFIX}{query_tag(query_id)}$"


def batch_prefix(query_id: str, batch_id: int) -> str:
    """The name prefix of every table the tasks load for one batch of the query."""
    return f"{query_prefix(query_id)}{batch_id}$"


@dataclass(frozen=True)
class StagedTables:
    """Where one job's tasks load their stage rows: the replica's connection string (it travels
    with the task, as a JDBC URL does with Spark's own JDBC writer) and the tables' name prefix."""

    dsn: str
    query_id: str
    batch_id: int
    #: The batch's own read is job ``b``; held events read again are ``h0``, ``h1``, …
    job: str = "b"

    def for_job(self, job: str) -> StagedTables:
        return replace(self, job=job)

    def name(self, task: int, part: int) -> str:
        return f"{batch_prefix(self.query_id, self.batch_id)}{self.job}${task}${part}"

    def load(self, task: int, parts: Sequence[StagedPart]) -> list[StagedPart]:
        """Load each part of at least :data:`TASKS_LOAD_FROM_ROWS` stage rows into a table of its
        own (see the module docstring); the parts, those loaded with their rows numbered as loaded."""
        if all(part.rows.num_rows < TASKS_LOAD_FROM_ROWS for part in parts):
            return list(parts)
        names = ReplicaNames.for_dialect(_DIALECT)
        loaded = []
        try:
            with (
                psycopg.connect(
                    self.dsn, connect_timeout=10, application_name=f"{APPLICATION_NAME} {task}"
                ) as db,
                db.cursor() as cursor,
            ):
                for number, part in enumerate(parts):
                    if part.rows.num_rows < TASKS_LOAD_FROM_ROWS:
                        loaded.append(part)
                        continue
                    name = self.name(task, number)
                    located = part.loaded_into(name)
                    table = ReplicaTable.of(located, names)
                    rows = without_nul(table.stage_rows(), table.columns).rows
                    rows = rows.append_column(STAGED_ROW, located.rows.column(STAGED_ROW))
                    definitions = [*stage_definitions(table, _DIALECT), f"{quote(STAGED_ROW)} BIGINT"]
                    cursor.execute(f"DROP TABLE IF EXISTS {quote(name)}")
                    cursor.execute(f"CREATE UNLOGGED TABLE {quote(name)} ({', '.join(definitions)})")
                    copy_rows(cursor, name, rows)
                    loaded.append(located)
        except psycopg.Error as exc:
            detail = redact(str(exc)).strip()
            raise ReplicaConnectionError(
                f"a task could not load its stage rows into the PostgreSQL replica: {detail}"
            ) from None
        return loaded
