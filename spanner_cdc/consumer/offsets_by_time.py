"""The first offset of a topic partition whose record is at or after a time — what the options
``startingTimestamp`` and ``endingTimestamp`` (and their per-partition forms) start or end at.

Spark's own source asks the broker (ListOffsets by timestamp). The embedded broker answers
offset 0 for every time — before the first record, between records, after the last — so the
broker's answer is taken only when the records around it confirm it: the record at it is at or
after the time, and the record before it is before. Otherwise the offset is found by bisection,
reading one record a step (about 20 reads for a million records). Bisection is exact when a
partition's timestamps do not go back (``LogAppendTime`` topics, and records of one producer
with ``CreateTime``); with timestamps that go back it finds *a* boundary, which may lie after
records that are at or after the time. A broker that answers ListOffsets right (Apache Kafka)
is confirmed by the first check and its answer is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from spanner_cdc.common.kafka_offsets import position as kafka_position
from spanner_cdc.consumer.kafka_source_options import KafkaSourceError

#: How long one record or one broker answer may take before the start of the query fails.
READ_SECONDS = 30.0
#: The broker's answer for "no record at or after that time".
NO_OFFSET = -1


@dataclass(frozen=True)
class Record:
    offset: int
    millis: int


class PartitionTimes:
    """Reads single records of one topic partition by offset, through one assigned consumer."""

    def __init__(self, consumer: Consumer, topic: str, partition: int, low: int, high: int) -> None:
        self.consumer = consumer
        self.topic = topic
        self.partition = partition
        self.low = low
        self.high = high

    def first_at_or_after(self, offset: int) -> Record | None:
        """The first record at ``offset`` or later and before the partition's end (offsets may
        have gaps: transaction markers, compaction), or None when there is none."""
        if offset >= self.high:
            return None
        self.consumer.assign([TopicPartition(self.topic, self.partition, offset)])
        message = None
        waited = 0.0
        while message is None:
            messages = self.consumer.consume(1, 1.0)
            if messages:
                message = messages[0]
                break
            position = kafka_position(self.consumer, (self.topic, self.partition))
            if position >= self.high:
                return None
            waited += 1.0
            if waited > READ_SECONDS:
                raise KafkaSourceError(
                    f"{self.topic}[{self.partition}]: no record at offset {offset} in time"
                )
        error = message.error()
        if error is not None:
            raise KafkaSourceError(f"{self.topic}[{self.partition}]: {error.str()}")
        found = message.offset() or 0
        return Record(found, message.timestamp()[1]) if found < self.high else None

    def confirms(self, answer: int, millis: int) -> bool:
        """Whether the broker's ``answer`` is the first offset at or after ``millis``."""
        if not self.low <= answer < self.high:
            return False
        at = self.first_at_or_after(answer)
        if at is None or at.offset != answer or at.millis < millis:
            return False
        if answer == self.low:
            return True
        before = self.first_at_or_after(answer - 1)
        return before is not None and before.offset == answer - 1 and before.millis < millis

    def bisect(self, millis: int) -> int | None:
        """The first offset whose record is at or after ``millis``: the smallest offset whose
        first record at or after it is (or has none after it), then that record's offset."""
        first, last = self.low, self.high  # the smallest such offset lies in [first, last]
        while first < last:
            middle = (first + last) // 2
            record = self.first_at_or_after(middle)
            if record is None or record.millis >= millis:
                last = middle
            else:
                first = record.offset + 1
        record = self.first_at_or_after(first)
        return None if record is None else record.offset


def offsets_at(
    consumer: Consumer, times: dict[tuple[str, int], int], bounds: dict[tuple[str, int], tuple[int, int]]
) -> dict[tuple[str, int], int | None]:
    """For each topic partition, the first offset whose record is at or after its time in
    milliseconds (None: no record is), within ``bounds`` (earliest, end)."""
    asked = [TopicPartition(topic, partition, millis) for (topic, partition), millis in times.items()]
    try:
        answers = {
            (tp.topic, tp.partition): tp.offset for tp in consumer.offsets_for_times(asked, READ_SECONDS)
        }
    except KafkaException as exc:
        raise KafkaSourceError(f"the broker did not answer offsets by time: {exc.args[0].str()}") from None
    found: dict[tuple[str, int], int | None] = {}
    for (topic, partition), millis in times.items():
        low, high = bounds[topic, partition]
        reader = PartitionTimes(consumer, topic, partition, low, high)
        answer = answers.get((topic, partition), NO_OFFSET)
        found[topic, partition] = answer if reader.confirms(answer, millis) else reader.bisect(millis)
    return found
