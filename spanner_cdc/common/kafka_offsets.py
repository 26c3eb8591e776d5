"""Reading a topic of the project to its end, as a ``read_committed`` reader sees it.

The producer writes in transactions, so every reader of the project reads committed records
only (librdkafka's default ``isolation.level``): a record of an aborted transaction is never
seen, and a partition's end is its last stable offset — what is before the first transaction
still open on it.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable

from confluent_kafka import Consumer, KafkaException, TopicPartition

#: Settings for consumers that read the project's topics to their end (:func:`read_to_end`).
#: ``fetch.wait.max.ms``: the broker answers a fetch at once instead of holding it open for
#: librdkafka's default 500 ms per partition.
READER_SETTINGS = {"fetch.wait.max.ms": "10"}
#: How long one poll waits for a message. Short: the end of a partition a transactional producer
#: wrote is a marker, never handed over as a message, so reaching it is seen only when a poll
#: comes back empty and the position has moved — each such poll costs its whole wait.
POLL_SECONDS = 0.02
#: How long a failed request for a partition's end waits before it is asked again.
ASK_AGAIN_SECONDS = 0.1


def end_offsets(
    consumer: Consumer, partitions: Iterable[tuple[str, int]], timeout: float = 10.0
) -> dict[tuple[str, int], int]:
    """(topic, partition) → the offset a ``read_committed`` reader reads up to now: after the
    last record, or at the first record of a transaction still open."""
    return {place: high for place, (_, high) in offset_ranges(consumer, partitions, timeout).items()}


def offset_ranges(
    consumer: Consumer, partitions: Iterable[tuple[str, int]], timeout: float = 10.0
) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) → (earliest offset Kafka still has, :func:`end_offsets`'s end).

    A failed request is asked again until ``timeout``: right after the client lost its
    connection (the broker restarted or stalled), it fails at once ("Unknown partition") and
    succeeds a moment later."""
    deadline = time.monotonic() + timeout
    ranges = {}
    for topic, partition in partitions:
        while True:
            try:
                left = max(deadline - time.monotonic(), ASK_AGAIN_SECONDS)
                ranges[topic, partition] = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=left
                )
                break
            except KafkaException:
                if time.monotonic() + ASK_AGAIN_SECONDS >= deadline:
                    raise
                time.sleep(ASK_AGAIN_SECONDS)
    return ranges


def read_to_end(
    consumer: Consumer, topic: str, positions: dict[int, int], timeout: float = 60.0
) -> Generator[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every message after ``positions``, up to the end now,
    one at a time: a topic of any size is read in the memory of what the caller keeps of it.

    ``positions`` (partition → next offset) moves past each message as it is handed over, so
    calling again reads only what arrived since — also after the caller stopped early or an
    error ended the read. Partitions missing from it are read from their start (offset 0, or
    the earliest Kafka still has after retention or compaction removed older ones). TimeoutError when
    the broker hands over nothing for ``timeout`` seconds (a long read that makes progress goes
    on: a large topic used to fail after 60 s in all, and what it had read was lost).
    """
    metadata = consumer.list_topics(topic, timeout=timeout)
    partitions = sorted(metadata.topics[topic].partitions)
    ranges = {
        p: found
        for (_, p), found in offset_ranges(consumer, [(topic, p) for p in partitions], timeout).items()
    }
    highs = {p: high for p, (_, high) in ranges.items()}
    for partition in partitions:
        positions[partition] = max(positions.get(partition, 0), ranges[partition][0])
    wanted = {p for p in partitions if positions[p] < highs[p]}
    if not wanted:
        return
    consumer.assign([TopicPartition(topic, p, positions[p]) for p in wanted])
    deadline = time.monotonic() + timeout
    try:
        while any(positions[p] < highs[p] for p in wanted):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: nothing for {timeout:.0f} s at {positions}, expected {highs}")
            message = consumer.poll(POLL_SECONDS)
            if message is None:  # past transaction markers, which are never handed over
                for p in wanted:
                    positions[p] = max(positions[p], position(consumer, (topic, p)))
                continue
            if message.error() is not None:
                continue
            partition, offset = message.partition(), message.offset()
            if partition is None or offset is None:
                continue
            positions[partition] = offset + 1
            deadline = time.monotonic() + timeout
            yield partition, offset, message.key(), message.value()
    finally:
        consumer.unassign()


def position(consumer: Consumer, place: tuple[str, int]) -> int:
    """The consumer's next offset in an assigned partition (-1001 before any fetch); past a
    transaction marker it moves without a message."""
    return positions(consumer, [place])[place]


def positions(consumer: Consumer, places: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """:func:`position` of several assigned partitions, in one call."""
    return {
        (found.topic, found.partition): found.offset
        for found in consumer.position([TopicPartition(*place) for place in places])
    }
