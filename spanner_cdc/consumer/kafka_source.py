"""A Spark source over confluent-kafka (streaming and batch), for machines without Spark's kafka
connector.

Registered as format ``spanner_cdc_kafka``; rows have the schema of Spark's built-in ``kafka``
source (``headers`` with ``includeHeaders``), and the options use its names
(kafka_source_options), so a deployment can switch to the built-in source by changing the
format only.

Offsets are ``{"topic": {"partition": next offset}}``; Spark keeps them in its checkpoint, and
partitions are assigned (never subscribed through a consumer group), as docs/design.md §2 advises.
Offsets are listed for every partition at once and the ends proven by a fetch
(:mod:`spanner_cdc.common.kafka_offsets`: Tansu under-reports the latest offset).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import pyarrow as pa
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spanner_cdc.common.kafka_offsets import listed_offsets, proven_ends
from spanner_cdc.common.kafka_offsets import positions as kafka_positions
from spanner_cdc.consumer.kafka_resume import resume
from spanner_cdc.consumer.kafka_rows import (
    ARROW_SCHEMA,
    ARROW_SCHEMA_WITH_HEADERS,
    HEADERS_TYPE,
    SPARK_DDL,
    SPARK_DDL_WITH_HEADERS,
)
from spanner_cdc.consumer.kafka_source_options import (
    KafkaSourceError,
    Offsets,
    SourceOptions,
    TimeSpec,
    resolve,
    times_for,
)
from spanner_cdc.consumer.offsets_by_time import offsets_at
from spanner_cdc.consumer.worker_collector import collector_paused

SOURCE_NAME = "spanner_cdc_kafka"
logger = logging.getLogger(__name__)
ROWS_PER_ARROW_BATCH = 10_000
#: How long one ``consume`` waits to fill its batch. Short, because a range rarely fills it:
#: every partition a transactional producer writes ends with a transaction marker, and markers
#: between transactions take offsets too, which ``consume`` never hands over — with 1 s here
#: every such range waited 1 s at its end, a grouped task 1 s per range (the suite's Spark tests
#: ran 5-9 s longer each once the producer wrote transactions; measured 2026-11-27).
CONSUME_WAIT_SECONDS = 0.05
#: How long a read waits for offsets the driver saw as available before giving up.
READ_TIMEOUT_SECONDS = 120.0


#: A task reads at least this many offsets (all of a smaller batch in one task). A task costs
#: Spark about 50 ms however little it reads; a micro-batch at demo rates has ~70 records over
#: 12 topic partitions, and one task per partition made its read take 0.8 s of a 1.15 s trigger
#: — in one task, 0.3 s of 0.65 s (``make demo``'s query progress).
MIN_TASK_OFFSETS = 5_000
#: Without ``parallelism``: a task reads at most this many offsets.
TASK_OFFSETS = 10_000
#: With ``parallelism``: a task reads at most this many offsets, so a task's memory (its decoded
#: events, until it writes them) stays bounded however large the batch; a larger batch gets
#: more tasks, in multiples of the slots. A Python worker's peak RSS in 200,000-event batches
#: (scratch script, changelog and replica): 360-390 MiB at 25,000 offsets a task, 460-520 at
#: 50,000; 285-300 with the tasks of at most 10,000 before (docs/consumer.md, run 19).
MAX_TASK_OFFSETS = 25_000


@dataclass(frozen=True)
class TopicPartitionRange:
    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class RangeGroup(InputPartition):
    """The offset ranges one task reads (together: :func:`read_ranges`)."""

    ranges: tuple[TopicPartitionRange, ...]


def task_count(offsets: int, parallelism: int | None) -> int:
    """How many tasks read a batch of ``offsets``: as many as the ``parallelism`` slots (or a
    multiple, when a task would read over :data:`MAX_TASK_OFFSETS`), fewer when a task would read
    under :data:`MIN_TASK_OFFSETS`; without ``parallelism``, tasks of :data:`TASK_OFFSETS`.

    One wave of equal tasks: every task costs Spark its launch and its Python worker's round
    trips whatever it reads, and tasks of a fixed size leave cores idle when their count is not a
    multiple of the cores (a 50,000-event batch from 3 topic partitions was 6 tasks of 8,300 on
    2 cores — three waves; as 2 tasks the bench's changelog pinned to one CPU ran 6-11% faster,
    docs/consumer.md run 19)."""
    if parallelism is None:
        return max(1, math.ceil(offsets / TASK_OFFSETS))
    slots = parallelism * math.ceil(offsets / (parallelism * MAX_TASK_OFFSETS))
    return max(1, min(slots, offsets // MIN_TASK_OFFSETS))


def shares(ranges: list[TopicPartitionRange], count: int) -> list[RangeGroup]:
    """``ranges`` (in order) read by ``count`` tasks of (nearly) equal offsets: a task may read
    the end of one topic partition and the start of the next. One pass over the ranges (a
    query may read thousands of topic partitions)."""
    total = sum(r.end - r.start for r in ranges)
    if not total:
        return []
    count = max(1, min(count, total))
    ends = [total * i // count for i in range(1, count + 1)]  # each share's end, among all offsets
    tasks: list[list[TopicPartitionRange]] = [[] for _ in range(count)]
    task, before = 0, 0  # before: offsets in the ranges before this one
    for offsets in ranges:
        position = offsets.start
        while position < offsets.end:
            share_end = offsets.start + ends[task] - before
            if share_end <= position:
                task += 1
                continue
            end = min(offsets.end, share_end)
            tasks[task].append(replace(offsets, start=position, end=end))
            position = end
        before += offsets.end - offsets.start
    return [RangeGroup(tuple(parts)) for parts in tasks]


def input_partitions(
    start: Offsets,
    end: Offsets,
    min_partitions: int | None,
    parallelism: int | None,
    max_records: int | None = None,
) -> list[RangeGroup]:
    """The tasks that read ``[start, end)``: with ``minPartitions`` one per range of
    :func:`offset_ranges`, as Spark's source plans them; else :func:`shares` of
    :func:`task_count`. With ``maxRecordsPerPartition`` (``max_records``) no task reads more
    offsets than that: a larger range is split in equal parts (Spark's rule), or the shares are
    more."""
    ranges = offset_ranges(start, end, min_partitions)
    if min_partitions:
        if max_records:
            ranges = [
                part
                for whole in ranges
                for part in _split(whole, math.ceil((whole.end - whole.start) / max_records))
            ]
        return [RangeGroup((single,)) for single in ranges]
    total = sum(r.end - r.start for r in ranges)
    count = task_count(total, parallelism)
    if max_records:
        count = max(count, math.ceil(total / max_records))
    return shares(ranges, count)


def read_group(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, RangeGroup):
        raise KafkaSourceError(f"unexpected input partition {partition!r}")
    with collector_paused():  # a task's messages hold no reference cycles (worker_collector)
        yield from read_ranges(options, partition.ranges)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets per topic partition; Trigger.AvailableNow reads to the ends seen when it began.

    Without :class:`SupportsTriggerAvailableNow`, Spark falls back to Trigger.Once for a Python
    source: one batch of everything, ignoring ``maxOffsetsPerTrigger``.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: Offsets | None = None
        #: When the last batch was planned (``time.monotonic``); none yet: the first is not delayed.
        self._last_batch = -math.inf
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None
        #: Where this query starts, resolved once (:meth:`initialOffset`).
        self._initial: Offsets | None = None
        #: The start came from a partition's end and no batch has been planned from it yet.
        self._unlogged_start = False

    # --- driver side --------------------------------------------------------------------------

    def _current(self) -> tuple[Offsets, Offsets]:
        """(earliest, end) offsets of every wanted topic partition that exists now, listed for
        all partitions at once (Spark's own source does the same through its admin client)."""
        wanted, earliest = self._earliest()
        consumer, admin = self._clients()
        highs = proven_ends(consumer, listed_offsets(admin, wanted, "latest", timeout=30), timeout=30)
        ends: Offsets = {}
        for topic, partition in wanted:
            ends.setdefault(topic, {})[str(partition)] = highs[topic, partition]
        return earliest, ends

    def _earliest(self) -> tuple[list[tuple[str, int]], Offsets]:
        """Every wanted topic partition that exists now, and its earliest offset."""
        consumer, admin = self._clients()
        metadata = consumer.list_topics(timeout=30)
        wanted = [
            (topic, partition)
            for topic, info in sorted(metadata.topics.items())
            if self.options.wanted(topic) and info.error is None
            for partition in sorted(info.partitions)
            if self.options.wanted_partition(topic, partition)
        ]
        lows = listed_offsets(admin, wanted, "earliest", timeout=30)
        earliest: Offsets = {}
        for topic, partition in wanted:
            earliest.setdefault(topic, {})[str(partition)] = lows[topic, partition]
        return wanted, earliest

    def _clients(self) -> tuple[Consumer, AdminClient]:
        """Clients for the query's life, as Spark's own Kafka source keeps them: creating and
        closing one on every trigger cost 28 ms of it (median of 20, on Tansu)."""
        if self._consumer is None or self._admin is None:
            self._consumer, self._admin = self.options.consumer(), self.options.admin()
        return self._consumer, self._admin

    def stop(self) -> None:
        """Close the clients (an admin client has no close: dropping it ends it)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._admin = None

    def initialOffset(self) -> Offsets:  # noqa: N802 - Spark's name
        """Resolved once per query run. Spark asks twice for a new query's first batch — for the
        start ``latestOffset`` plans from, and again for the start the batch reads from — and
        with ``startingOffsets=latest`` the end moves between the two: the records written in
        between were skipped. Spark's own source resolves them once too (and keeps them in the
        checkpoint, which a Python source is not given: :meth:`latestOffset` says what stands
        in for that)."""
        if self._initial is None:
            earliest, ends = self._current()
            self._initial = starting_offsets(self.options, earliest, ends, default="latest")
            self._unlogged_start = self.options.may_start_at_an_end
        return self._initial

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:  # noqa: N802
        if self._unlogged_start and start == self._initial:
            # A start taken from a partition's end (``latest``) is where the end was when the
            # query began; resolved again after a restart it would be later. Spark logs a batch's
            # end offsets, not its start: a first batch of records, killed before its commit, was
            # run again from the new end and its records skipped. So the first batch is empty and
            # ends at the start, which Spark's log then keeps for every later batch and restart.
            self._unlogged_start = False
            return start
        earliest, ends = self._current()
        resumed = resume(start, earliest, ends)
        if resumed.lost:
            self._data_lost(resumed.lost)
        begin = resumed.begin
        if self._target is not None:  # AvailableNow: nothing written after it began counts
            ends = {
                t: {
                    p: max(begin[t][p], min(end, self._target.get(t, {}).get(p, begin[t][p])))
                    for p, end in parts.items()
                }
                for t, parts in ends.items()
            }
        if self._target is None and self._waits(begin, ends):
            return begin
        self._last_batch = time.monotonic()
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return _limited(begin, ends, max_rows)

    def _waits(self, begin: Offsets, ends: Offsets) -> bool:
        """Does this trigger wait for more records (``minOffsetsPerTrigger``): fewer are new,
        and ``maxTriggerDelay`` has not passed since the last batch — Spark's rule. Not under
        Trigger.AvailableNow, which would otherwise wait for records that may never come."""
        if self.options.min_rows is None:
            return False
        new = sum(_available(begin, ends).values())
        late = time.monotonic() - self._last_batch >= self.options.max_delay_seconds
        return new < self.options.min_rows and not late

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        self._target = self._current()[1]

    def _data_lost(self, lost: list[str]) -> None:
        """Fail the query naming what was lost (``failOnDataLoss``, the default), or say so in
        the log and go on (kafka_resume)."""
        more = f" and {len(lost) - 5} more" if len(lost) > 5 else ""
        message = "; ".join(lost[:5]) + more
        if self.options.fail_on_data_loss:
            raise KafkaSourceError(
                f"data loss: {message}; failOnDataLoss=false (consume: --fail-on-data-loss false) "
                "goes on from the earliest offsets Kafka has"
            )
        logger.warning("data loss, going on (failOnDataLoss=false): %s", message)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.options.max_rows) if self.options.max_rows else ReadAllAvailable()

    def partitions(self, start: Offsets, end: Offsets) -> list[RangeGroup]:
        if not self.options.fail_on_data_loss:
            start = self._readable(start, end)
        return input_partitions(
            start, end, self.options.min_partitions, self.options.parallelism, self.options.max_records
        )

    def _readable(self, start: Offsets, end: Offsets) -> Offsets:
        """With ``failOnDataLoss=false``, where the batch's reading begins as the broker has it
        now: Spark plans a batch from the last one's end, which may be gone (retention) or past
        this batch's end (offsets went back). The same when Spark replays a batch after a
        restart, where no ``latestOffset`` ran before (kafka_resume). Only the earliest offsets
        are listed: the batch's end is fixed."""
        return resume(start, self._earliest()[1], end).begin

    def commit(self, end: Offsets) -> None:
        """Offsets live in Spark's checkpoint; nothing is committed to Kafka."""

    # --- executor side ------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_group(self.options, partition)


class KafkaBatchReader(DataSourceReader):
    """``spark.read``: from ``startingOffsets`` (default earliest) to ``endingOffsets`` (default
    latest), the ends resolved once, when Spark plans the read."""

    def __init__(self, options: SourceOptions) -> None:
        if options.starting == "latest":
            raise KafkaSourceError(
                "startingOffsets=latest reads nothing in a batch query; use earliest or JSON"
            )
        if options.ending == "earliest":
            raise KafkaSourceError("endingOffsets=earliest reads nothing; use latest or JSON")
        self.options = options

    def partitions(self) -> list[RangeGroup]:
        offsets = KafkaStreamReader(self.options)
        try:
            earliest, ends = offsets._current()
        finally:
            offsets.stop()
        start = starting_offsets(self.options, earliest, ends, default="earliest")
        end = ending_offsets(self.options, earliest, ends)
        return input_partitions(
            start, end, self.options.min_partitions, self.options.parallelism, self.options.max_records
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_group(self.options, partition)


def starting_offsets(options: SourceOptions, earliest: Offsets, ends: Offsets, default: str) -> Offsets:
    """Where a new query starts: by time when asked (``startingTimestamp`` or
    ``startingOffsetsByTimestamp``), else ``startingOffsets`` (or ``default``). A partition with
    no record at or after its time fails the query, or with
    ``startingOffsetsByTimestampStrategy=latest`` starts at its end — Spark's rules."""
    if options.starting_times is None:
        return resolve(options.starting or default, earliest, ends, "startingOffsets")
    name = _time_option(options.starting_times, "starting")
    found = _by_time(options, options.starting_times, name, earliest, ends)
    if options.starting_strategy == "error":
        missing = sorted(
            f"{topic}[{partition}]" for (topic, partition), offset in found.items() if offset is None
        )
        if missing:
            raise KafkaSourceError(
                f"{name}: no record at or after the time in {', '.join(missing[:5])}; "
                "startingOffsetsByTimestampStrategy=latest starts such partitions at their end"
            )
    return _offsets(found, ends)


def ending_offsets(options: SourceOptions, earliest: Offsets, ends: Offsets) -> Offsets:
    """Where a batch read ends: by time when asked (a partition with no record at or after its
    time ends at its end, as in Spark), else ``endingOffsets``."""
    if options.ending_times is None:
        return resolve(options.ending, earliest, ends, "endingOffsets")
    name = _time_option(options.ending_times, "ending")
    return _offsets(_by_time(options, options.ending_times, name, earliest, ends), ends)


def _time_option(spec: TimeSpec, side: str) -> str:
    """The option that gave ``spec`` (``side`` is starting or ending), for error messages."""
    return f"{side}Timestamp" if isinstance(spec, int) else f"{side}OffsetsByTimestamp"


def _by_time(
    options: SourceOptions, spec: TimeSpec, name: str, earliest: Offsets, ends: Offsets
) -> dict[tuple[str, int], int | None]:
    """The first offset at or after its time of every partition read (a client of its own: the
    reads move its assignment)."""
    partitions = [(topic, int(partition)) for topic, parts in earliest.items() for partition in parts]
    bounds = {(t, p): (earliest[t][str(p)], ends[t][str(p)]) for t, p in partitions}
    consumer = options.consumer()
    try:
        return offsets_at(consumer, times_for(spec, partitions, name), bounds)
    finally:
        consumer.close()


def _offsets(found: dict[tuple[str, int], int | None], ends: Offsets) -> Offsets:
    """Offsets by partition, a partition without one at its end."""
    offsets: Offsets = {}
    for (topic, partition), offset in found.items():
        offsets.setdefault(topic, {})[str(partition)] = (
            ends[topic][str(partition)] if offset is None else offset
        )
    return offsets


def offset_ranges(start: Offsets, end: Offsets, min_partitions: int | None) -> list[TopicPartitionRange]:
    """One range per topic partition with records; with ``minPartitions``, large ranges are split
    in proportion to their size (as Spark's source does) until there are at least that many."""
    ranges = []
    for topic, partitions in sorted(end.items()):
        for partition, until in sorted(partitions.items(), key=lambda item: int(item[0])):
            begin = start.get(topic, {}).get(partition, 0)
            if until > begin:
                ranges.append(TopicPartitionRange(topic, int(partition), begin, until))
    total = sum(r.end - r.start for r in ranges)
    if not min_partitions or len(ranges) >= min_partitions or total == 0:
        return ranges
    return [
        part
        for whole in ranges
        for part in _split(
            whole,
            max(1, min(whole.end - whole.start, round((whole.end - whole.start) * min_partitions / total))),
        )
    ]


def _split(whole: TopicPartitionRange, parts: int) -> list[TopicPartitionRange]:
    """``whole`` in ``parts`` ranges of (nearly) equal size."""
    size = whole.end - whole.start
    bounds = [whole.start + size * i // parts for i in range(parts + 1)]
    return [TopicPartitionRange(whole.topic, whole.partition, a, b) for a, b in itertools.pairwise(bounds)]


def _limited(begin: Offsets, ends: Offsets, max_rows: int | None) -> Offsets:
    """End offsets, cut to at most ``max_rows`` records in all, shared by availability."""
    available = _available(begin, ends)
    total = sum(available.values())
    if max_rows is None or total <= max_rows:
        return ends
    shares = {tp: count * max_rows // total for tp, count in available.items()}
    spare = max_rows - sum(shares.values())
    for tp in sorted(available, key=lambda key: available[key] - shares[key], reverse=True):
        if spare <= 0:
            break
        if shares[tp] < available[tp]:
            shares[tp] += 1
            spare -= 1
    return {t: {p: begin[t][p] + shares[(t, p)] for p in ends[t]} for t in ends}


def _available(begin: Offsets, ends: Offsets) -> dict[tuple[str, str], int]:
    """Records from ``begin`` to ``ends`` per topic partition."""
    return {(t, p): max(0, ends[t][p] - begin[t][p]) for t in ends for p in ends[t]}


def read_ranges(options: SourceOptions, ranges: Iterable[TopicPartitionRange]) -> Iterator[pa.RecordBatch]:
    """Records [start, end) of each range's topic partition as Arrow batches, all the ranges read
    together by one consumer, fetched in bulk.

    Together, because a task may hold many small ranges (a batch over hundreds of topic
    partitions, at demo rates, is one task): read one after another, each paid its own client
    and, at its end, a ``consume`` that waits for nothing (a transaction marker) — 400 ranges of
    six records took 22-25 s, together 0.6 s (docs/consumer.md, run 21). Offsets may have gaps
    (transaction markers, compaction), so a range ends when the consumer's position reaches
    ``end``, not after ``end - start`` records; a range that has ended is paused, so nothing more
    is fetched for it. ``consume`` hands over up to a batch of messages per call; each range's
    share of them becomes one Arrow batch, its columns built with one pass each (a per-message
    ``poll`` and per-column appends cost more than the fetch itself).
    """
    reading = {(r.topic, r.partition): r for r in ranges if r.start < r.end}
    if not reading:
        return
    positions = {place: part.start for place, part in reading.items()}
    alone = next(iter(reading)) if len(reading) == 1 else None
    consumer = options.consumer()
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.start) for r in reading.values()])
        deadline = time.monotonic() + READ_TIMEOUT_SECONDS
        while reading:
            left = sum(part.end - positions[place] for place, part in reading.items())
            arrived = _by_range(
                consumer.consume(min(ROWS_PER_ARROW_BATCH, left), CONSUME_WAIT_SECONDS), reading, alone
            )
            for place, taken in arrived.items():
                positions[place] = (taken[-1].offset() or 0) + 1
                yield _record_batch(reading[place], taken, options.include_headers)
            if _past_markers(consumer, reading, positions) or arrived:
                deadline = time.monotonic() + READ_TIMEOUT_SECONDS
            elif time.monotonic() > deadline:
                raise _stopped(reading, positions)
            ended = [place for place, part in reading.items() if positions[place] >= part.end]
            if ended:
                consumer.pause([TopicPartition(*place) for place in ended])
                for place in ended:
                    del reading[place]
    finally:
        consumer.close()


Place = tuple[str, int]


def _by_range(
    messages: list[Message], reading: dict[Place, TopicPartitionRange], alone: Place | None
) -> dict[Place, list[Message]]:
    """``messages`` of the ranges still read, each range's in offset order; none past its end.
    A task that reads ``alone`` one range (the large batches' tasks) has only its messages, and
    only the last can be past its end: telling each message's range apart made such a read 5-8%
    slower (docs/consumer.md, run 21)."""
    arrived: dict[Place, list[Message]] = {}
    for message in messages:
        error = message.error()
        if error is not None:
            raise KafkaSourceError(f"{message.topic()}[{message.partition()}]: {error.str()}")
        if alone is None:
            place = (message.topic() or "", message.partition() or 0)
            part = reading.get(place)
            if part is not None and (message.offset() or 0) < part.end:
                arrived.setdefault(place, []).append(message)
    if alone is None or alone not in reading or not messages:
        return arrived
    end = reading[alone].end
    if (messages[-1].offset() or 0) >= end:
        messages = [m for m in messages if (m.offset() or 0) < end]
    return {alone: messages} if messages else {}


def _past_markers(
    consumer: Consumer, reading: dict[Place, TopicPartitionRange], positions: dict[Place, int]
) -> bool:
    """Move ``positions`` to the consumer's where it is further: past transaction markers the
    position moves without a message. Did any move?"""
    moved = False
    for place, at in kafka_positions(consumer, reading).items():
        if at > positions[place]:
            positions[place], moved = at, True
    return moved


def _stopped(reading: dict[Place, TopicPartitionRange], positions: dict[Place, int]) -> KafkaSourceError:
    stuck = [f"{t}[{p}] stopped at {positions[t, p]} of {part.end}" for (t, p), part in reading.items()]
    more = f" and {len(stuck) - 5} more" if len(stuck) > 5 else ""
    return KafkaSourceError(", ".join(stuck[:5]) + more)


_TIMESTAMP = ARROW_SCHEMA.field("timestamp").type


def _record_batch(part: TopicPartitionRange, messages: list[Message], headers: bool) -> pa.RecordBatch:
    timestamps = [m.timestamp() for m in messages]
    count = len(messages)
    columns = [
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.array([part.topic] * count, pa.string()),
        pa.array([part.partition] * count, pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64()),
        pa.array([ms * 1000 for _, ms in timestamps], pa.int64()).cast(_TIMESTAMP),
        pa.array([kind for kind, _ in timestamps], pa.int32()),
    ]
    if not headers:
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    listed = [[{"key": h[0], "value": h[1]} for h in m.headers() or []] for m in messages]
    columns.append(pa.array(listed, HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA_WITH_HEADERS)


class KafkaSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        headers = SourceOptions.parse(dict(self.options)).include_headers
        return SPARK_DDL_WITH_HEADERS if headers else SPARK_DDL

    def streamReader(self, schema: StructType) -> KafkaStreamReader:  # noqa: N802
        options = SourceOptions.parse(dict(self.options))
        if options.ending != "latest":
            raise KafkaSourceError("endingOffsets is for batch reads (spark.read), not streaming ones")
        return KafkaStreamReader(options)

    def reader(self, schema: StructType) -> KafkaBatchReader:
        return KafkaBatchReader(SourceOptions.parse(dict(self.options)))
