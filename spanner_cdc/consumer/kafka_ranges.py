"""Which offsets each task of a read gets: a batch's offset ranges, split and shared out as
Spark input partitions (:class:`RangeGroup`), one wave of equal tasks over the slots there are.

Planned where Spark plans a read (the source's runner for a stream, the driver for
``spark.read``); the tasks read what they are given with :mod:`kafka_fetch`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from pyspark.sql.datasource import InputPartition

from spanner_cdc.consumer.kafka_source_options import Offsets

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
