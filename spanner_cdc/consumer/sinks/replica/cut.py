"""Whole transactions and a consistent cut: what of a micro-batch the replica may apply now.

A transaction's events arrive on several topics and partitions, possibly in different
micro-batches. The producer's watermark records (schemas.watermark) say when everything
committed at or before a timestamp is on Kafka: once this consumer has read a watermark of at
least ``W`` on every partition of every subscribed event topic, it has every change committed at
or before ``W``. That ``W`` — the minimum over partitions of the newest watermark read — is the
**cut**.

Per micro-batch, inside the replica's transaction (so a replay repeats it exactly):

1. merge the batch's watermarks into ``cdc$watermarks`` (one row per expected partition: those
   the newest record's topic list names, and those expected before whose topic is still on the
   broker) and compute the cut;
2. events committed after the cut are held in ``cdc$pending``: their Kafka messages, as the
   tasks staged them (sinks.replica.stage.rows), so nothing is decoded to hold them;
3. events committed at or before it — from this batch and from ``cdc$pending`` — are applied
   together, so every transaction up to the cut lands whole, in one database transaction, and
   none after it lands at all. They are handed to the merge in commit-time order, in slices of
   at most ``slice_events`` held events (a slice never splits a commit timestamp, so never a
   transaction): a backlog held for hours is not brought into memory at once. This batch's
   events are named by their outline rows (the tasks staged their stage rows); held ones are
   staged by the function the batch gives: the rows kept from the batch that held them
   (sinks.replica.stage.held), and what is not kept staged again from its bytes (consumer.batch:
   Spark tasks, or the driver for a few);
4. ``cdc$consistent_cut`` records the cut: the replica equals the source as of that commit
   timestamp.

A transaction whose events did not all arrive by the time the cut passes its commit timestamp
(the producer's table filter or the consumer's ``--tables`` left some out) is applied with what
arrived: counted and logged, never waited for. An event at or before a cut already recorded
(a producer reset to an earlier start) is applied when it arrives, also counted and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from spanner_cdc.consumer.decode.decoded import WatermarkSeen
from spanner_cdc.consumer.decode.outline_rows import COORDINATES, EVENT
from spanner_cdc.consumer.errors import ConsumerError
from spanner_cdc.consumer.sinks.replica.backends import REBUILT_TABLE, SqlBackend, find_table
from spanner_cdc.consumer.sinks.replica.names import quote, quote_all
from spanner_cdc.consumer.sinks.replica.stage.rows import MESSAGES_SCHEMA, StagedEvents, rows_of_events
from spanner_cdc.schemas.timestamps import datetime_from_micros

log = logging.getLogger("spanner_cdc.consumer")
PENDING = "cdc$pending"
WATERMARKS = "cdc$watermarks"
CUT = "cdc$consistent_cut"
_COMMIT = "commit_micros"
#: ``cdc$pending``'s columns. No key: two held events may share Kafka coordinates — an event of a
#: topic deleted and created again, at an offset an event of the old topic still held has (a
#: consumer told to go on with ``--fail-on-data-loss false``). Nothing holds a message twice:
#: the replica's transaction records the batch id, and a message sent again is a duplicate
#: uuid, which dedupe drops before the cut sees it.
_PENDING_COLUMNS = (
    'topic VARCHAR NOT NULL, "partition" INTEGER NOT NULL, "offset" BIGINT NOT NULL, '
    "commit_micros BIGINT NOT NULL, key BYTEA, value BYTEA NOT NULL"
)


@dataclass(frozen=True)
class Slice:
    """Events the cut lets through together: this batch's, as outline rows
    (consumer.decode.outline_rows), and held ones brought back, staged again."""

    fresh: pa.Table
    held: StagedEvents | None = None

    @property
    def rows(self) -> pa.Table:
        """Outline rows of every event of the slice."""
        if self.held is None:
            return self.fresh
        return pa.concat_tables([self.fresh, self.held.outline.select(self.fresh.column_names)])


@dataclass(frozen=True)
class Release:
    """Where the cut stands after one micro-batch, and what its release found."""

    cut_micros: int | None
    held: int
    incomplete_transactions: int
    behind_cut: int
    #: The cut recorded before this batch.
    previous_cut_micros: int | None
    #: Outline rows of this batch's events that it held.
    newly_held: pa.Table


class ConsistentCut:
    def __init__(
        self,
        backend: SqlBackend,
        subscribed: Callable[[str], bool],
        slice_events: int,
        on_broker: Callable[[], Mapping[str, int]],
    ) -> None:
        self.backend = backend
        #: Held events brought back per slice (the consumer passes its --max-events-per-batch).
        self.slice_events = slice_events
        self.subscribed = subscribed
        #: Topic → partition count on the broker: a partition stops being waited for only when
        #: its topic is gone from there (consumer.decode.driver.BrokerPartitions.counts).
        self.on_broker = on_broker
        with backend.transaction():
            backend.execute(f"CREATE TABLE IF NOT EXISTS {quote(PENDING)} ({_PENDING_COLUMNS})")
            _drop_coordinates_key(backend)
        backend.execute(
            f"CREATE TABLE IF NOT EXISTS {quote(WATERMARKS)} (topic VARCHAR NOT NULL, "
            '"partition" INTEGER NOT NULL, watermark_micros BIGINT, PRIMARY KEY (topic, "partition"))'
        )
        backend.execute(
            f"CREATE TABLE IF NOT EXISTS {quote(CUT)} (id INTEGER PRIMARY KEY, cut_micros BIGINT NOT NULL, "
            "cut TIMESTAMPTZ NOT NULL, topics_from_micros BIGINT NOT NULL, updated_at TIMESTAMPTZ NOT NULL)"
        )

    def release(
        self,
        fresh: pa.Table,
        messages: pa.Table,
        watermarks: Sequence[WatermarkSeen],
        apply: Callable[[Slice, int], None],
        stage: Callable[[pa.Table], StagedEvents],
    ) -> Release:
        """Call inside the replica transaction of the batch that delivered ``fresh`` (outline
        rows of its kept events); ``messages`` (``stage.rows.MESSAGES_SCHEMA``) has their Kafka
        messages, and maybe others', for the ones held. ``apply`` is called with each slice of
        what may be applied now, oldest commits first, and the cut they are applied up to;
        ``stage`` stages held events again from their messages (``stage.rows.MESSAGES_SCHEMA``)
        when the cut passes them."""
        previous, topics_from = self._stored()
        computed, topics_from = self._merge_watermarks(watermarks, topics_from)
        known = [c for c in (previous, computed) if c is not None]
        commits = fresh.column(_COMMIT)
        if not known:
            self._hold(messages, fresh)
            return Release(None, self._held_count(), 0, 0, previous, fresh)
        cut = max(known)
        held = fresh.filter(pc.greater(commits, cut))
        self._hold(messages, held)
        behind = 0 if previous is None else pc.sum(pc.less_equal(commits, previous)).as_py() or 0
        due = fresh.filter(pc.less_equal(commits, cut))
        held_up_to = cut if previous is None or cut > previous else None
        incomplete: list[str] = []
        for piece in self._slices(due, held_up_to, stage):
            rows = piece.rows
            newly_cut = rows if previous is None else rows.filter(pc.greater(rows.column(_COMMIT), previous))
            incomplete += incomplete_transactions(newly_cut)
            apply(piece, cut)
        if incomplete:
            log.warning(
                "%d transaction(s) applied without all their records (first: %s); the cut passed them",
                len(incomplete),
                incomplete[0],
            )
        if behind:
            log.warning("%d event(s) arrived committed at or before the recorded cut; applied now", behind)
        self._record(cut, topics_from)
        return Release(cut, self._held_count(), len(incomplete), behind, previous, held)

    def _slices(
        self, due: pa.Table, held_up_to: int | None, stage: Callable[[pa.Table], StagedEvents]
    ) -> Iterator[Slice]:
        """``due`` with the held events committed at or before ``held_up_to``, in slices that end
        at a commit timestamp: each has at most ``slice_events`` held events, unless one commit
        timestamp alone has more (a transaction is never split). The last slice of held events
        takes the rest of ``due`` with it (already in memory, so not bounded by the slices): a
        merge less per batch, each costing its statements whatever its size."""
        after = -1  # every event committed at or before it has been handed over
        upper = None if held_up_to is None else self._slice_end(after, held_up_to)
        if upper is None or held_up_to is None:  # no held event comes back: the batch's own alone
            if due.num_rows:
                yield Slice(due)
            return
        commits = due.column(_COMMIT)
        while True:
            following = self._slice_end(upper, held_up_to)
            within = pc.greater(commits, after)
            if following is not None:
                within = pc.and_(within, pc.less_equal(commits, upper))
            yield Slice(due.filter(within), self._take_held(after, upper, stage))
            if following is None:
                return
            after, upper = upper, following

    # --- watermarks and the cut -------------------------------------------------------------

    def _stored(self) -> tuple[int | None, int]:
        """The recorded cut, and the watermark whose topic list defines the expected partitions."""
        rows = self.backend.execute(f"SELECT cut_micros, topics_from_micros FROM {quote(CUT)} WHERE id = 1")
        return (int(rows[0][0]), int(rows[0][1])) if rows else (None, -1)

    def _merge_watermarks(self, seen: Sequence[WatermarkSeen], topics_from: int) -> tuple[int | None, int]:
        """Fold the batch's watermarks into ``cdc$watermarks``.

        Returns the cut they give (None while an expected partition has no watermark yet) and
        the watermark the expected partitions now come from. The newest record's topic list adds
        the partitions it names; a partition expected before stays expected while its topic is
        on the broker and subscribed (a consumer may start again with fewer ``--tables``). So a
        dropped topic stops holding the cut back, and one forged watermark listing one topic
        cannot make the cut that topic's alone (it moved the cut 59 minutes ahead and released
        held events of unfinished transactions).
        """
        rows = self.backend.execute(f'SELECT topic, "partition", watermark_micros FROM {quote(WATERMARKS)}')
        marks: dict[tuple[str, int], int | None] = {(str(t), int(p)): w for t, p, w in rows}
        if seen:
            newest = max(seen, key=lambda s: s.watermark.watermark_micros).watermark
            if newest.watermark_micros > topics_from:
                topics_from = newest.watermark_micros
                on_broker = self.on_broker()
                marks = {
                    **{
                        (topic, partition): micros
                        for (topic, partition), micros in marks.items()
                        if self.subscribed(topic) and partition < on_broker.get(topic, 0)
                    },
                    **{
                        (topic, partition): marks.get((topic, partition))
                        for topic, count in newest.topics.items()
                        if self.subscribed(topic)
                        for partition in range(count)
                    },
                }
            for mark in seen:
                where = (mark.topic, mark.partition)
                if where in marks:
                    stored, micros = marks[where], mark.watermark.watermark_micros
                    marks[where] = micros if stored is None else max(stored, micros)
            self.backend.execute(f"DELETE FROM {quote(WATERMARKS)}")
            for (topic, partition), mark_micros in marks.items():
                self.backend.execute(
                    f"INSERT INTO {quote(WATERMARKS)} VALUES (?, ?, ?)", [topic, partition, mark_micros]
                )
        values = list(marks.values())
        if not values or None in values:
            return None, topics_from
        return min(v for v in values if v is not None), topics_from

    def _record(self, cut: int, topics_from: int) -> None:
        self.backend.execute(
            f"INSERT INTO {quote(CUT)} VALUES (1, ?, ?, ?, now()) ON CONFLICT (id) DO UPDATE SET "
            "cut_micros = excluded.cut_micros, cut = excluded.cut, "
            "topics_from_micros = excluded.topics_from_micros, updated_at = excluded.updated_at",
            [cut, datetime_from_micros(cut), topics_from],
        )

    # --- held events ------------------------------------------------------------------------

    def _hold(self, messages: pa.Table, events: pa.Table) -> None:
        """Keep the messages of ``events`` (outline rows) in ``cdc$pending``."""
        if events.num_rows:
            [held] = rows_of_events([messages], _COMMIT, COORDINATES, events)
            self.backend.load(PENDING, held.select(MESSAGES_SCHEMA.names).cast(MESSAGES_SCHEMA))

    def _slice_end(self, after: int, up_to: int) -> int | None:
        """The commit timestamp of the ``slice_events``-th held event committed after ``after``
        (at most ``up_to``), or of the last one if fewer are held; None when none is."""
        rows = self.backend.execute(
            f"SELECT max(commit_micros) FROM (SELECT commit_micros FROM {quote(PENDING)} "
            "WHERE commit_micros > ? AND commit_micros <= ? ORDER BY commit_micros LIMIT ?) AS s",
            [after, up_to, self.slice_events],
        )
        return None if rows[0][0] is None else int(rows[0][0])

    def _take_held(
        self, after: int, upper: int, stage: Callable[[pa.Table], StagedEvents]
    ) -> StagedEvents | None:
        """The held events committed after ``after`` and at or before ``upper``, no longer held,
        staged again."""
        between = "commit_micros > ? AND commit_micros <= ?"
        names = quote_all(MESSAGES_SCHEMA.names)
        table = self.backend.select_arrow(
            f"SELECT {names} FROM {quote(PENDING)} WHERE {between}", [after, upper], MESSAGES_SCHEMA
        )
        if not table.num_rows:
            return None
        self.backend.execute(f"DELETE FROM {quote(PENDING)} WHERE {between}", [after, upper])
        staged = stage(table)
        kinds = staged.outline.column("kind")
        others = staged.outline.filter(pc.not_equal(kinds, EVENT))
        if others.num_rows:
            first = others.slice(0, 1).to_pylist()[0]
            raise ConsumerError(
                f"a held event no longer decodes ({first['reason'] or first['kind']}); "
                f"{PENDING} is inconsistent with the schemas topic"
            )
        return staged

    def _held_count(self) -> int:
        return int(self.backend.execute(f"SELECT count(*) FROM {quote(PENDING)}")[0][0])


def _drop_coordinates_key(backend: SqlBackend) -> None:
    """A ``cdc$pending`` made before its key was dropped (a primary key on the Kafka
    coordinates, which refused the second of two held events at one offset) made again without
    it, its rows kept. DuckDB cannot drop a primary key, so both databases copy the table."""
    keys = backend.execute(
        "SELECT count(*) FROM information_schema.table_constraints WHERE table_schema = current_schema() "
        "AND table_name = ? AND constraint_type = 'PRIMARY KEY'",
        [PENDING],
    )
    if not keys[0][0]:
        return
    rebuilt = quote(REBUILT_TABLE)
    backend.execute(f"CREATE TABLE {rebuilt} ({_PENDING_COLUMNS})")
    backend.execute(f"INSERT INTO {rebuilt} SELECT * FROM {quote(PENDING)}")
    backend.execute(f"DROP TABLE {quote(PENDING)}")
    backend.execute(f"ALTER TABLE {rebuilt} RENAME TO {quote(PENDING)}")


def recorded_cut(backend: SqlBackend) -> int | None:
    """The replica's consistent cut, for readers (streams); None before the first one."""
    if find_table(backend, CUT) is None:
        return None
    rows = backend.execute(f"SELECT cut_micros FROM {quote(CUT)} WHERE id = 1")
    return int(rows[0][0]) if rows else None


def incomplete_transactions(events: pa.Table) -> list[str]:
    """Transaction ids among ``events`` (outline rows) with fewer records, or fewer mods in a
    record, than announced (a count the contract leaves null, as for snapshot rows, announces
    nothing). Counted in Arrow, over the transactions that announce more than one mod: one that
    announces a single record of a single mod in each of its rows is whole wherever one of them
    is here, and leaving those out first spares the grouping most of a batch."""
    single = pc.and_(
        pc.equal(events.column("records_in_transaction"), 1), pc.equal(events.column("mods_in_record"), 1)
    )
    counted = pc.unique(events.filter(pc.invert(pc.fill_null(single, False))).column("tx_id"))
    events = events.filter(pc.is_in(events.column("tx_id"), value_set=counted))
    if not events.num_rows:
        return []
    records = events.group_by(["tx_id", "record_sequence"], use_threads=False).aggregate(
        [("offset", "count"), ("mods_in_record", "max"), ("records_in_transaction", "max")]
    )
    short = pc.less(records.column("offset_count"), pc.fill_null(records.column("mods_in_record_max"), 0))
    transactions = (
        records.append_column("short", short)
        .group_by("tx_id", use_threads=False)
        .aggregate([("record_sequence", "count"), ("records_in_transaction_max", "max"), ("short", "any")])
    )
    announced = pc.fill_null(transactions.column("records_in_transaction_max_max"), 0)
    incomplete = pc.or_(
        pc.less(transactions.column("record_sequence_count"), announced), transactions.column("short_any")
    )
    return sorted(transactions.filter(incomplete).column("tx_id").to_pylist())
