"""A Spanner table dropped and created again under its name: a new generation of the table.

Change records name a table, never an identity, so a table dropped and created again looks
like the same table — unless its primary key differs, which Spanner cannot change in place:
then the events themselves show a new table. The replica keeps one row per generation in
``cdc$generations`` (the table, the commit time of its first event, its key) and, when events
with another key arrive committed after the current generation began, starts the table over:
the old generation's rows, tombstones and history are dropped (Spanner dropped them), and
streams on the table created before become invalid (streams.api). Events with another key
committed *before* the current generation began belong to a dropped one and are skipped.

A table created again with the same primary key cannot be told apart (no identity, and the
emulator does not list DDL operations, where a ``DROP TABLE`` with its time could be found):
its events merge into the existing replica table. A user starts such a table over by dropping
its replica table: the replica then finds a table it has generations of but no table for, and
starts a generation with the same key (the only way one gets its key again), so streams created
on it before are invalid as after a re-creation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from spanner_cdc.consumer.sinks.replica.backends import SqlBackend, find_table
from spanner_cdc.consumer.sinks.replica.names import quote

GENERATIONS_TABLE = "cdc$generations"


@dataclass(frozen=True)
class Generation:
    """One life of a Spanner table in the replica."""

    table: str
    started_micros: int
    #: The replica's names of its key columns.
    key: tuple[str, ...]
    #: The key of the generation before it; None for the first one the replica saw.
    previous_key: tuple[str, ...] | None


def create_generations_table(backend: SqlBackend) -> None:
    backend.execute(
        f"CREATE TABLE IF NOT EXISTS {quote(GENERATIONS_TABLE)} (source_table VARCHAR NOT NULL, "
        "started_micros BIGINT NOT NULL, key_columns VARCHAR NOT NULL, previous_key_columns VARCHAR, "
        "PRIMARY KEY (source_table, started_micros))"
    )


def record_generation(backend: SqlBackend, generation: Generation) -> None:
    previous = None if generation.previous_key is None else json.dumps(generation.previous_key)
    backend.execute(
        f"INSERT INTO {quote(GENERATIONS_TABLE)} VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
        [generation.table, generation.started_micros, json.dumps(generation.key), previous],
    )


def table_generations(backend: SqlBackend, table: str) -> list[Generation]:
    """``table``'s generations, oldest first; empty for a replica written before 0.3.0 (or none)."""
    if find_table(backend, GENERATIONS_TABLE) is None:
        return []
    rows = backend.execute(
        f"SELECT started_micros, key_columns, previous_key_columns FROM {quote(GENERATIONS_TABLE)} "
        "WHERE source_table = ? ORDER BY started_micros",
        [table],
    )
    return [
        Generation(
            table, int(started), tuple(json.loads(key)), None if old is None else tuple(json.loads(old))
        )
        for started, key, old in rows
    ]


def recreated_since(backend: SqlBackend, table: str, since_micros: int) -> Generation | None:
    """The latest re-creation of ``table`` that began after ``since_micros``, if any."""
    later = [
        g
        for g in table_generations(backend, table)
        if g.previous_key is not None and g.started_micros > since_micros
    ]
    return later[-1] if later else None
