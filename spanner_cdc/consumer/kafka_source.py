"""A Spark source over confluent-kafka (streaming and batch), for machines without Spark's kafka
connector.

Registered as format ``spanner_cdc_kafka``; rows have the schema of Spark's built-in ``kafka``
source (``headers`` with ``includeHeaders``), and the options use its names
(kafka_source_options), so a deployment can switch to the built-in source by changing the
format only.

Offsets are ``{"topic": {"partition": next offset}}``; Spark keeps them in its checkpoint, and
partitions are assigned (never subscribed through a consumer group), as docs/design.md §2 advises.
Offsets are listed for every partition at once and the ends proven by a fetch
(:mod:`spanner_cdc.common.kafka_offsets`: Tansu under-reports the latest offset). What each task
reads is planned by :mod:`kafka_ranges`, and read by :mod:`kafka_fetch`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator

import pyarrow as pa
from confluent_kafka import Consumer
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
from spanner_cdc.consumer.kafka_fetch import read_group
from spanner_cdc.consumer.kafka_ranges import RangeGroup, input_partitions
from spanner_cdc.consumer.kafka_resume import resume
from spanner_cdc.consumer.kafka_rows import SPARK_DDL, SPARK_DDL_WITH_HEADERS
from spanner_cdc.consumer.kafka_source_options import (
    KafkaSourceError,
    Offsets,
    SourceOptions,
    TimeSpec,
    resolve,
    times_for,
)
from spanner_cdc.consumer.offsets_by_time import offsets_at

SOURCE_NAME = "spanner_cdc_kafka"
logger = logging.getLogger(__name__)


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
