"""End offsets of topic partitions that are right on every Kafka-protocol broker we run on.

Tansu (the embedded broker) answers ListOffsets(latest) with the base offset of the last record
batch + 1, not the offset after the last record: a batch of 20 records at offsets 0-19 reports
1. The high watermark in a Fetch response is right, so the end is read from there: fetch the
last batch and take the broker's high watermark. On Apache Kafka both agree; the fetch of every
partition's last batch costs about one round trip for all of them.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable
from typing import Literal

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

#: Settings for consumers that read the project's topics to their end (:func:`end_offsets`,
#: :func:`read_to_end`, the Spark source). ``fetch.wait.max.ms``: the broker answers a fetch at
#: once instead of holding it open for 500 ms per partition, which made finding the end of 3
#: partitions take 2 s (measured on Tansu). ``read_uncommitted`` (librdkafka's default is
#: read_committed): the producer writes in transactions (producer.transactions), and the
#: embedded broker answers ListOffsets for read_committed readers with offset 0 while a
#: transaction is open on the partition — nearly always, with a commit every 100 ms — so such a
#: reader saw an empty topic (measured; docs/facts.md). Nothing is lost by reading uncommitted:
#: every message of an aborted transaction is sent again, with the same uuid, and a checkpoint
#: or watermark record is written only after the events it covers were committed.
READER_SETTINGS = {"fetch.wait.max.ms": "10", "isolation.level": "read_uncommitted"}
#: How long one poll waits for a message. Short: the end of a partition a transactional producer
#: wrote is a marker, never handed over as a message, so reaching it is seen only when a poll
#: comes back empty and the position has moved — each such poll costs its whole wait.
POLL_SECONDS = 0.02
#: How long a failed offset listing waits before it is asked again (:func:`listed_offsets`).
LIST_AGAIN_SECONDS = 0.1


def end_offsets(
    consumer: Consumer, partitions: Iterable[tuple[str, int]], timeout: float = 10.0
) -> dict[tuple[str, int], int]:
    """(topic, partition) → offset after its last record, the broker asked one partition at a
    time (for a topic's few partitions; many at once: :func:`listed_offsets`, then
    :func:`proven_ends`). Changes the consumer's assignment."""
    listed = {
        (topic, partition): consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)[
            1
        ]
        for topic, partition in partitions
    }
    return proven_ends(consumer, listed, timeout)


def listed_offsets(
    admin: AdminClient,
    partitions: Iterable[tuple[str, int]],
    which: Literal["earliest", "latest"],
    timeout: float = 10.0,
) -> dict[tuple[str, int], int]:
    """(topic, partition) → the earliest or latest offset the broker lists, for every partition
    in one request per broker, read uncommitted (READER_SETTINGS says why).

    Asked one partition at a time, the earliest and latest of 400 partitions took 160-270 ms
    each, on every trigger of the consumer's source, against 14-20 ms for all at once (on Tansu,
    docs/consumer.md). A latest offset is only a lower bound on Tansu: :func:`proven_ends`.

    A failed listing is asked again until ``timeout``, as librdkafka retries a single
    partition's: right after the client lost its connection, the listing fails at once ("No
    leaders found", not marked retriable) and succeeds 0.2 s later (measured on Tansu).
    """
    spec = OffsetSpec.earliest() if which == "earliest" else OffsetSpec.latest()  # type: ignore[no-untyped-call]
    wanted = {TopicPartition(topic, partition): spec for topic, partition in partitions}
    if not wanted:
        return {}
    deadline = time.monotonic() + timeout
    while True:
        found = admin.list_offsets(
            wanted,
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=max(deadline - time.monotonic(), LIST_AGAIN_SECONDS),
        )
        try:
            return {(place.topic, place.partition): future.result().offset for place, future in found.items()}
        except KafkaException:
            if time.monotonic() + LIST_AGAIN_SECONDS >= deadline:
                raise
            time.sleep(LIST_AGAIN_SECONDS)


def proven_ends(
    consumer: Consumer, listed: dict[tuple[str, int], int], timeout: float = 10.0
) -> dict[tuple[str, int], int]:
    """(topic, partition) → offset after its last record, from the ends the broker ``listed``.
    Changes the consumer's assignment.

    The last batches of all partitions, of all topics, are fetched together, each partition
    paused once it proved its end: fetched one partition at a time, the 12 partitions of a demo
    took 211 / 218 ms — on every micro-batch of the consumer's source — against 17 / 15 ms
    together (median of 20 calls, twice, on Tansu). Messages are taken as many at a time as
    partitions are unproven, and the proven paused together: a poll and a pause per partition
    took 80 of the 130 ms of 400 partitions.
    """
    ends = dict(listed)
    unproven = {place for place, listed in ends.items() if listed > 0}
    if not unproven:
        return ends
    assigned = [
        TopicPartition(topic, partition, ends[topic, partition] - 1) for topic, partition in sorted(unproven)
    ]
    consumer.assign(assigned)
    deadline = time.monotonic() + timeout
    try:
        while unproven and time.monotonic() < deadline:
            messages = consumer.consume(len(unproven), min(POLL_SECONDS, timeout))
            # A message of a partition proves its high watermark is in the cache; so does a
            # position past the last offset when that is a transaction's marker, which is never
            # handed over (every partition a transactional producer writes ends with one: waiting
            # for a message took the whole timeout).
            if messages:
                found = {(m.topic() or "", m.partition() or 0) for m in messages if m.error() is None}
            else:
                found = {place for place, at in positions(consumer, unproven).items() if at >= ends[place]}
            found &= unproven
            if not found:
                continue
            proven = [TopicPartition(*place) for place in found]
            for place, partition in zip(found, proven, strict=True):
                _, fetched = consumer.get_watermark_offsets(partition, cached=True)
                ends[place] = max(ends[place], fetched)
            consumer.pause(proven)
            unproven -= found
    finally:
        consumer.resume(assigned)  # librdkafka keeps a partition paused across assignments
        consumer.unassign()
    return ends


def read_to_end(
    consumer: Consumer, topic: str, positions: dict[int, int], timeout: float = 60.0
) -> Generator[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every message after ``positions``, up to the end now,
    one at a time: a topic of any size is read in the memory of what the caller keeps of it.

    ``positions`` (partition → next offset) moves past each message as it is handed over, so
    calling again reads only what arrived since — also after the caller stopped early or an
    error ended the read. Partitions missing from it are read from offset 0. TimeoutError when
    the broker hands over nothing for ``timeout`` seconds (a long read that makes progress goes
    on: a large topic used to fail after 60 s in all, and what it had read was lost).
    """
    metadata = consumer.list_topics(topic, timeout=timeout)
    partitions = sorted(metadata.topics[topic].partitions)
    highs = {
        p: end for (_, p), end in end_offsets(consumer, [(topic, p) for p in partitions], timeout).items()
    }
    for partition in partitions:
        positions.setdefault(partition, 0)
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
