"""A task's offset ranges read into Arrow batches of Kafka rows (the schema of Spark's ``kafka``
source) by one confluent-kafka consumer, assigned, never subscribed through a group.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import pyarrow as pa
from confluent_kafka import Consumer, Message, TopicPartition
from pyspark.sql.datasource import InputPartition

from spanner_cdc.common.kafka_offsets import positions as kafka_positions
from spanner_cdc.consumer.kafka_ranges import RangeGroup, TopicPartitionRange
from spanner_cdc.consumer.kafka_rows import ARROW_SCHEMA, ARROW_SCHEMA_WITH_HEADERS, HEADERS_TYPE
from spanner_cdc.consumer.kafka_source_options import KafkaSourceError, SourceOptions
from spanner_cdc.consumer.worker_collector import collector_paused

ROWS_PER_ARROW_BATCH = 10_000
#: How long one ``consume`` waits to fill its batch. Short, because a range rarely fills it:
#: every partition a transactional producer writes ends with a transaction marker, and markers
#: between transactions take offsets too, which ``consume`` never hands over — with 1 s here
#: every such range waited 1 s at its end, a grouped task 1 s per range (the suite's Spark tests
#: ran 5-9 s longer each once the producer wrote transactions; measured 2026-11-27).
CONSUME_WAIT_SECONDS = 0.05
#: How long a read waits for offsets the driver saw as available before giving up.
READ_TIMEOUT_SECONDS = 120.0


def read_group(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """What a Spark task of the source runs: its :class:`RangeGroup` read (:func:`read_ranges`)."""
    if not isinstance(partition, RangeGroup):
        raise KafkaSourceError(f"unexpected input partition {partition!r}")
    with collector_paused():  # a task's messages hold no reference cycles (worker_collector)
        yield from read_ranges(options, partition.ranges)


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
