"""The streams themselves: one row each in ``cdc$streams``, in the replica database.

A stream is a name, the Spanner table it is on, a mode and an offset — a consistent cut of the
replica. Keeping it in the replica database is what lets a consume move the offset in the same
transaction as the rows it writes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spanner_cdc.consumer.errors import ConsumerError
from spanner_cdc.consumer.sinks.replica.backends import SqlBackend, find_table
from spanner_cdc.consumer.sinks.replica.names import quote
from spanner_cdc.consumer.status import StreamSeen
from spanner_cdc.schemas.timestamps import datetime_from_micros, now_micros

STREAMS = "cdc$streams"
MAX_NAME_CHARACTERS = 128


class StreamError(ConsumerError):
    """A stream command cannot be done as asked; the message says why."""


@dataclass(frozen=True)
class Stream:
    name: str
    table_on: str
    mode: str
    offset_micros: int
    comment: str
    created_on: dt.datetime


class StreamCatalog:
    def __init__(self, backend: SqlBackend) -> None:
        self.backend = backend
        backend.execute(
            f"CREATE TABLE IF NOT EXISTS {quote(STREAMS)} (name VARCHAR PRIMARY KEY, "
            "table_on VARCHAR NOT NULL, mode VARCHAR NOT NULL, offset_micros BIGINT NOT NULL, "
            "comment VARCHAR NOT NULL, created_micros BIGINT NOT NULL)"
        )

    def add(self, name: str, table_on: str, mode: str, offset_micros: int, comment: str) -> None:
        check_name(name)
        if self.find(name) is not None:
            raise StreamError(f"stream {name!r} exists already (drop it first to start it again)")
        self.backend.execute(
            f"INSERT INTO {quote(STREAMS)} VALUES (?, ?, ?, ?, ?, ?)",
            [name, table_on, mode, offset_micros, comment, now_micros()],
        )

    def find(self, name: str) -> Stream | None:
        found = _select(self.backend, "WHERE name = ?", [name])
        return found[0] if found else None

    def get(self, name: str) -> Stream:
        found = self.find(name)
        if found is None:
            raise StreamError(f"no stream named {name!r} (spanner-cdc stream show lists them)")
        return found

    def all(self) -> list[Stream]:
        return _select(self.backend, "ORDER BY name")

    def remove(self, name: str) -> None:
        self.get(name)
        self.backend.execute(f"DELETE FROM {quote(STREAMS)} WHERE name = ?", [name])

    def move_offset(self, stream: Stream, to_micros: int) -> None:
        """Move the offset from where ``stream`` read it; fails if it moved meanwhile."""
        moved = self.backend.execute(
            f"UPDATE {quote(STREAMS)} SET offset_micros = ? WHERE name = ? AND offset_micros = ? "
            "RETURNING name",
            [to_micros, stream.name, stream.offset_micros],
        )
        if not moved:
            raise StreamError(
                f"stream {stream.name!r} was consumed or dropped by another transaction meanwhile; "
                "nothing was written"
            )


def existing_streams(backend: SqlBackend) -> list[Stream]:
    """Every stream, without creating the catalog (the consumer's status page reads it)."""
    return _select(backend, "ORDER BY name") if find_table(backend, STREAMS) is not None else []


def streams_seen(backend: SqlBackend) -> list[StreamSeen]:
    """Every stream as the consumer's status page shows it."""
    return [StreamSeen(s.name, s.table_on, s.mode, s.offset_micros) for s in existing_streams(backend)]


def _select(backend: SqlBackend, rest: str, params: Sequence[Any] = ()) -> list[Stream]:
    rows = backend.execute(
        f"SELECT name, table_on, mode, offset_micros, comment, created_micros FROM {quote(STREAMS)} {rest}",
        params,
    )
    return [_stream(r) for r in rows]


def check_name(name: str) -> None:
    if not name or len(name) > MAX_NAME_CHARACTERS or not name.isprintable():
        raise StreamError(f"a stream name is 1 to {MAX_NAME_CHARACTERS} printable characters; got {name!r}")


def _stream(row: tuple[object, ...]) -> Stream:
    name, table_on, mode, offset, comment, created = row
    return Stream(
        str(name),
        str(table_on),
        str(mode),
        int(str(offset)),
        str(comment),
        datetime_from_micros(int(str(created))),
    )
