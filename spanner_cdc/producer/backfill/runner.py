"""Backfill: the rows a table held before the change stream's start, published as INSERT events.

Without it a replica holds only rows changed since ``--start-timestamp``. Each table is read at
one snapshot timestamp T, in primary-key order (``producer.spanner.snapshot_read``), several tables at
once; every row becomes an event with ``read_method`` ``spanner-backfill``, the contract's
deterministic backfill uuid and sort keys that order it before every change committed after T
(``EventBuilder.build_snapshot_rows``). The change stream runs meanwhile from T, so no change is
missed, and none is applied twice: a sink keeps the newest event per key.

Checkpoints (``producer.backfill.store``): a table's snapshot before its first row, then,
about once a second, the key of the last row whose event — and every event before it — Kafka
acknowledged. A restart reads the same snapshot after that key: rows between the checkpoint and
the crash are published again with the same uuids (deduplicated downstream), none is skipped.

Consistent cuts: until every table's backfill is acknowledged, the producer's safe watermark
stays below the oldest snapshot still being read (:attr:`Backfill.hold`). A consumer's cut
therefore never passes T before all of T's rows are on Kafka: a replica at a cut is Spanner at
that cut, backfilled rows included.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.api_core import exceptions as google_exceptions

from spanner_cdc.producer.backfill.store import TablePlan
from spanner_cdc.producer.errors import ProducerError
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.publish.chunks import Chunk, ChunkEvents, publish_chunks
from spanner_cdc.producer.publish.control_records import ControlRecords
from spanner_cdc.producer.publish.publisher import EventSender
from spanner_cdc.producer.spanner.catalog import TableCatalog
from spanner_cdc.producer.spanner.snapshot_read import table_rows
from spanner_cdc.schemas.errors import UnsupportedTypeError
from spanner_cdc.schemas.events import EventBuilder
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.timestamps import clock_text

log = logging.getLogger(__name__)

#: A partition read silent this long is an error (Spanner streams rows; none for minutes is a hang).
READ_TIMEOUT_SECONDS = 300.0
#: Reads of one table that may fail (each going on from the last checkpoint) before the producer stops.
MAX_READ_ATTEMPTS = 3


class BackfillError(ProducerError):
    """A table's backfill cannot finish (Spanner keeps refusing the read, or Kafka the rows)."""


@dataclass
class BackfillTable:
    """What is needed to read one table: its columns in read order, its primary key in key
    order (which a key range follows), and its table version."""

    name: str
    columns: list[str]
    key: list[str]
    version: TableSchema

    @classmethod
    def from_catalog(cls, catalog: TableCatalog, table: str, keys: Sequence[str]) -> BackfillTable:
        """Every catalog column of ``table``, as the table version its change events also get:
        the key columns as a change record lists them, the rest completed by the catalog."""
        columns = catalog.columns[table]
        key_types = []
        for column in columns:
            if column.name not in keys:
                continue
            if column.type is None:
                raise UnsupportedTypeError(table, column.name, column.type_text)
            key_types.append(
                {
                    "name": column.name,
                    "type": column.type.to_json(),
                    "is_primary_key": True,
                    "ordinal_position": column.ordinal_position,
                }
            )
        version = catalog.table_schema(table, key_types)
        return cls(table, [column.name for column in columns], list(keys), version)


@dataclass
class Backfill:
    """The backfill of ``tables``, resuming ``plans`` where they exist; new plans read at
    ``snapshot_micros``."""

    database: Any
    tables: list[BackfillTable]
    plans: dict[str, TablePlan]
    snapshot_micros: int
    builder: EventBuilder
    sender: EventSender
    store: ControlRecords[TablePlan]
    metrics: ProducerMetrics
    #: Tables read at once.
    parallelism: int = 4
    #: Rows Kafka acknowledged in this run (the progress line).
    rows_published: int = 0
    _unfinished: dict[str, int] = field(default_factory=dict)
    #: Per table: rows acknowledged in this run, and whether it is being read now (the status page).
    _rows: dict[str, int] = field(default_factory=dict)
    _reading: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        for table in self.tables:
            plan = self.plans.get(table.name)
            if plan is None or not plan.finished:
                self._unfinished[table.name] = plan.snapshot_micros if plan else self.snapshot_micros

    @property
    def finished(self) -> bool:
        return not self._unfinished

    @property
    def hold(self) -> int | None:
        """The highest watermark the producer may publish while tables are still being read
        (just below the oldest unfinished snapshot); None once every table is done."""
        return min(self._unfinished.values()) - 1 if self._unfinished else None

    def progress(self) -> list[list[str]]:
        """Per table this run backfills: its snapshot, rows acknowledged in this run, and whether
        it is waiting for its turn, being read or finished (the status page's table)."""
        rows = []
        for table in self.tables:
            snapshot = self._unfinished.get(table.name)
            plan = self.plans.get(table.name)
            if snapshot is None:
                state = "finished"
                snapshot = plan.snapshot_micros if plan is not None else self.snapshot_micros
            else:
                state = "reading" if table.name in self._reading else "waiting"
            rows.append([table.name, clock_text(snapshot), f"{self._rows.get(table.name, 0):,}", state])
        return rows

    async def run(self) -> None:
        """Every unfinished table, ``parallelism`` tables at a time."""
        wanted = [table for table in self.tables if table.name in self._unfinished]
        if not wanted:
            return
        log.info("backfill of %d tables: %s", len(wanted), ", ".join(t.name for t in wanted))
        plans = [self._plan(table) for table in wanted]
        # Every new plan written first (together, one commit): a table still waiting for its turn
        # when the producer stops is then a started backfill too, which the next run finishes.
        # The first reads start meanwhile; no row is sent before the plans are written.
        fresh = [plan for plan in plans if self.plans.get(plan.table) is not plan]
        written = asyncio.ensure_future(asyncio.gather(*(self.store.write(plan) for plan in fresh)))
        slots = asyncio.Semaphore(self.parallelism)
        try:
            await _all_or_none(
                [self._table(table, plan, slots, written) for table, plan in zip(wanted, plans, strict=True)]
            )
        finally:
            written.cancel()

    def _plan(self, table: BackfillTable) -> TablePlan:
        plan = self.plans.get(table.name)
        if plan is None or plan.columns != table.columns:
            # New, or the table's columns changed since: (again) from the start at the run's
            # snapshot, ordered after every change published before it.
            plan = TablePlan(table.name, self.snapshot_micros, table.columns)
        self._unfinished[table.name] = plan.snapshot_micros
        return plan

    async def _table(
        self, table: BackfillTable, plan: TablePlan, slots: asyncio.Semaphore, written: Awaitable[object]
    ) -> None:
        async with slots:
            self._reading.add(table.name)
            for attempt in range(1, MAX_READ_ATTEMPTS + 1):
                try:
                    await self._read(table, plan, written)
                    break
                except google_exceptions.GoogleAPICallError as exc:
                    if attempt == MAX_READ_ATTEMPTS:
                        raise BackfillError(
                            f"backfill of {table.name}: Spanner refuses the read at snapshot "
                            f"{clock_text(plan.snapshot_micros)}: {exc.message} (a snapshot older than "
                            "the database's version_retention_period cannot be read)"
                        ) from None
                    log.warning(
                        "backfill of %s: read failed (%s); going on from the last checkpoint",
                        table.name,
                        exc.message,
                    )
            await asyncio.shield(written)  # rows or none, the plan is written before the end
            plan.finished = True
            await self.store.write(plan)
            del self._unfinished[table.name]
            self._reading.discard(table.name)
            log.info("backfill of %s finished (snapshot %s)", table.name, clock_text(plan.snapshot_micros))

    async def _read(self, table: BackfillTable, plan: TablePlan, written: Awaitable[object]) -> None:
        """Rows after the plan's key → Kafka, once the plans are ``written``; the plan's key
        advanced as Kafka acknowledges them, written about once a second (at the end, the
        caller writes the table finished)."""
        start = plan.after_key

        async def events_of(chunk: Chunk) -> ChunkEvents:
            await asyncio.shield(written)  # one table's cancellation is not the others'
            key, rows = self._key(table, plan, chunk[-1]), len(chunk)

            def passed() -> None:
                plan.after_key = key
                self.rows_published += rows
                self._rows[table.name] = self._rows.get(table.name, 0) + rows
                self.metrics.backfill_rows.labels(table.name).inc(rows)

            events = self.builder.build_snapshot_rows(
                table.version,
                plan.columns,
                chunk,
                snapshot_micros=plan.snapshot_micros,
                read_timestamp_millis=int(time.time() * 1000),
            )
            return events, passed

        failure = await publish_chunks(
            f"backfill-{table.name}",
            lambda: table_rows(self.database, plan.snapshot_micros, table.name, plan.columns, start),
            table=table.version,
            sender=self.sender,
            events_of=events_of,
            save=lambda: self.store.write(plan),
            read_timeout=READ_TIMEOUT_SECONDS,
        )
        if failure is not None:
            raise BackfillError(
                f"backfill of {table.name}: Kafka did not take its rows ({failure}); a restart goes on "
                "from the last checkpoint"
            )

    @staticmethod
    def _key(table: BackfillTable, plan: TablePlan, row: Sequence[Any]) -> list[Any]:
        return [row[plan.columns.index(name)] for name in table.key]


async def _all_or_none(work: Sequence[Coroutine[Any, Any, None]]) -> None:
    """Run ``work`` concurrently; the first failure cancels the rest (awaited) and is raised."""
    tasks = [asyncio.create_task(item) for item in work]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
