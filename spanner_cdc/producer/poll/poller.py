"""Commit-timestamp polling: the changes of a table without a change stream.

Every ``interval`` seconds one poll reads, at an exact read timestamp R, the rows whose
commit-timestamp column is at or after the boundary — the newest stamp already on Kafka —
ordered by stamp and key, and publishes each as the whole row (``EventBuilder.build_polled_rows``).
Commit timestamps are not unique (transactions on disjoint rows may share one), so the boundary
is read again each time and the keys already published at exactly that stamp are skipped
(``PollPosition``). Every commit at or before R is visible at R, so once a poll's rows are
acknowledged, a watermark record may say that R is complete.

What polling cannot see, by its nature: deleted rows, versions of a row overwritten between two
polls (only the newest is read), rows whose column is not set to the commit timestamp, and a
value written by hand (a past timestamp is allowed) older than the boundary. A row that did not
exist at the previous poll's read timestamp is an INSERT, one that did an UPDATE.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from contextlib import suppress
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from google.api_core import exceptions as google_exceptions

from spanner_cdc.common.waiting import set_within
from spanner_cdc.producer.backfill.runner import BackfillTable
from spanner_cdc.producer.errors import ProducerError
from spanner_cdc.producer.poll.store import PollPosition
from spanner_cdc.producer.publish.chunks import Chunk, ChunkEvents, publish_chunks
from spanner_cdc.producer.publish.control_records import ControlRecords
from spanner_cdc.producer.publish.publisher import EventSender
from spanner_cdc.producer.spanner.snapshot_read import rows_by_key, rows_stamped_since
from spanner_cdc.schemas.events import Event, EventBuilder
from spanner_cdc.schemas.timestamps import clock_text, now_micros, parse_timestamp_micros

log = logging.getLogger(__name__)

#: A poll whose read hands over no row for this long is an error.
READ_TIMEOUT_SECONDS = 300.0
#: Polls in a row that Spanner may refuse (each logged, the next one tried) before the poller stops.
MAX_FAILED_POLLS = 5
#: An idle poller still records its read timestamp this often (a restart's watermark and
#: INSERT/UPDATE reference then start close to now).
IDLE_SAVE_SECONDS = 30.0


async def run_unless_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run ``work`` until it ends (True; its error raised) or ``stop`` is set first (it is
    cancelled and awaited; False)."""
    task = asyncio.create_task(work)
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task
    return False


class PollError(ProducerError):
    """A poll cannot be published (Spanner keeps refusing the read, or Kafka the rows)."""


@dataclass
class Poller:
    database: Any
    dialect: str
    table: BackfillTable
    column: str
    position: PollPosition
    builder: EventBuilder
    sender: EventSender
    store: ControlRecords[PollPosition]
    interval: float
    #: Rows Kafka acknowledged in this run (the progress line).
    rows_published: int = 0
    _saved_at: float = 0.0
    _warned_unknown_before: bool = False

    async def run(self, stop: asyncio.Event) -> None:
        """Poll every ``interval`` seconds until ``stop``. A stop during a poll (a first one can
        be long) ends it at once: the position then stands after the rows acknowledged so far
        and is written, and the caller flushes what is in flight."""
        failures = 0
        while not stop.is_set():
            try:
                if not await run_unless_stopped(self.poll(), stop):
                    await self.store.write(self.position)
                    return
                failures = 0
            except google_exceptions.GoogleAPICallError as exc:
                failures += 1
                if failures == MAX_FAILED_POLLS:
                    raise PollError(
                        f"poll of {self.table.name}: Spanner refused {failures} reads in a row: {exc.message}"
                    ) from None
                log.warning("poll of %s failed (%s); trying again", self.table.name, exc.message)
            await set_within(stop, self.interval)

    async def poll(self) -> None:
        """One poll at now: every row stamped at or after the boundary and not yet published."""
        position = self.position
        read_micros, previous = now_micros(), position.polled_micros
        published_before = self.rows_published
        failure = await publish_chunks(
            f"poll-{self.table.name}",
            lambda: rows_stamped_since(
                self.database,
                dialect=self.dialect,
                snapshot_micros=read_micros,
                table=self.table.name,
                columns=self.table.columns,
                stamp_column=self.column,
                key=self.table.key,
                since_micros=position.boundary_micros,
            ),
            table=self.table.version,
            sender=self.sender,
            events_of=lambda chunk: self._events(chunk, previous),
            save=lambda: self.store.write(position),
            read_timeout=READ_TIMEOUT_SECONDS,
        )
        if failure is not None:
            raise PollError(
                f"poll of {self.table.name}: Kafka did not take its rows ({failure}); a restart goes "
                f"on from {clock_text(position.boundary_micros)}"
            )
        position.polled_micros = read_micros
        if self.rows_published > published_before or time.monotonic() - self._saved_at > IDLE_SAVE_SECONDS:
            await self.store.write(position)
            self._saved_at = time.monotonic()

    async def _events(self, chunk: Chunk, previous_micros: int) -> ChunkEvents:
        """The chunk's rows not yet on Kafka as events; the position passes all of the chunk."""
        columns, position = self.table.columns, self.position
        stamp_at = columns.index(self.column)
        key_of = _key_getter([columns.index(name) for name in self.table.key])
        # A transaction stamps all its rows alike: each stamp of the chunk is parsed once.
        micros = {text: parse_timestamp_micros(text) for text in {row[stamp_at] for row in chunk}}
        stamped = [(micros[row[stamp_at]], key_of(row), row) for row in chunk]
        fresh = [(stamp, key, row) for stamp, key, row in stamped if not position.published(stamp, key)]
        existed = await self._existing([key for _, key, _ in fresh], previous_micros)
        events: list[Event] = self.builder.build_polled_rows(
            self.table.version,
            columns,
            [row for _, _, row in fresh],
            stamps_micros=[stamp for stamp, _, _ in fresh],
            existed_before=[key in existed for _, key, _ in fresh],
            read_timestamp_millis=int(time.time() * 1000),
        )

        def passed() -> None:
            for stamp, key, _ in stamped:
                position.passed(stamp, key)
            self.rows_published += len(fresh)

        return events, passed

    @property
    def complete_micros(self) -> int | None:
        """Every commit at or before this is on Kafka, as far as polling sees (a watermark);
        None before the first poll of a new table."""
        return self.position.polled_micros or None

    async def _existing(self, keys: Sequence[tuple[Any, ...]], at_micros: int) -> set[tuple[Any, ...]]:
        """Which of ``keys`` had a row at ``at_micros`` (0: before any poll — none did).

        A time Spanner no longer keeps versions of (older than the database's
        version_retention_period, after a long pause) cannot tell: those rows count as having
        existed (UPDATE, which every sink applies as an upsert), with one warning.
        """
        if not keys or at_micros <= 0:
            return set()
        try:
            rows = await asyncio.to_thread(
                rows_by_key, self.database, at_micros, self.table.name, self.table.key, keys
            )
        except google_exceptions.FailedPrecondition as exc:
            if not self._warned_unknown_before:
                log.warning(
                    "poll of %s: cannot read the table as of the previous poll (%s): rows are "
                    "published as UPDATE, whether new or not",
                    self.table.name,
                    exc.message,
                )
                self._warned_unknown_before = True
            return set(keys)
        return {tuple(row) for row in rows}


def _key_getter(positions: list[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A row's key (its values at ``positions``) as a tuple, for one key column or several."""
    if len(positions) == 1:
        (at,) = positions
        return lambda row: (row[at],)
    return itemgetter(*positions)
