"""The project's Spark streaming source over confluent-kafka, against the real broker."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql.streaming.datasource import ReadAllAvailable

from spanner_cdc.consumer.kafka_fetch import read_group
from spanner_cdc.consumer.kafka_ranges import RangeGroup, TopicPartitionRange
from spanner_cdc.consumer.kafka_source import SOURCE_NAME, KafkaStreamReader
from spanner_cdc.consumer.kafka_source_options import SourceOptions
from spanner_cdc.stack import EmbeddedStack
from tests.support.waiting import eventually

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def make_topic(bootstrap: str, partitions: int = 3, topic: str = "") -> str:
    topic = topic or f"src-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    return topic


def produce(bootstrap: str, topic: str, first: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for index in range(first, first + count):
        producer.produce(topic, key=f"k{index % 17}".encode(), value=f"v{index}".encode())
    assert producer.flush(30) == 0


Batches = list[list[dict[str, Any]]]


def start_query(
    spark: Any, bootstrap: str, checkpoint: Path, available_now: bool, **options: str
) -> tuple[Any, dict[int, list[dict[str, Any]]]]:
    """A query collecting the rows of each micro-batch by batch id (a replayed batch overwrites itself)."""
    batches: dict[int, list[dict[str, Any]]] = {}
    reader = spark.readStream.format(SOURCE_NAME).option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = (
        reader.load()
        .writeStream.foreachBatch(
            lambda frame, batch_id: batches.__setitem__(batch_id, [r.asDict() for r in frame.collect()])
        )
        .option("checkpointLocation", str(checkpoint))
    )
    query = (writer.trigger(availableNow=True) if available_now else writer).start()
    return query, batches


def non_empty(batches: dict[int, list[dict[str, Any]]]) -> Batches:
    return [batches[batch_id] for batch_id in sorted(batches) if batches[batch_id]]


def run_available_now(spark: Any, bootstrap: str, checkpoint: Path, **options: str) -> Batches:
    """One Trigger.AvailableNow run: everything available when it starts, then it stops."""
    query, batches = start_query(spark, bootstrap, checkpoint, True, **options)
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    return non_empty(batches)


def committed(query: Any, batch_id: int) -> bool:
    """Whether Spark reported the batch's progress, which it does only after writing its commit log.

    A query stopped between a batch's ``foreachBatch`` and its commit replays that batch on restart
    (Spark's at-least-once contract for ``foreachBatch``; the consumer's sinks are idempotent per batch).
    """
    return any(p["batchId"] == batch_id and p["numInputRows"] > 0 for p in query.recentProgress)


def run_until(spark: Any, bootstrap: str, checkpoint: Path, rows: int, **options: str) -> Batches:
    """A continuously triggered run, stopped once ``rows`` rows arrived and their batch committed."""
    query, batches = start_query(spark, bootstrap, checkpoint, False, **options)
    deadline = time.monotonic() + 120

    def done() -> bool:
        got = dict(batches)
        return sum(map(len, got.values())) >= rows and committed(query, max(got))

    try:
        while not done() and time.monotonic() < deadline and query.isActive:
            time.sleep(0.2)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    return non_empty(batches)


def test_every_message_once_within_the_batch_limit_and_resumes(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    bootstrap = stack.endpoint("kafka")
    topic = make_topic(bootstrap)
    produce(bootstrap, topic, 0, 1000)
    options = {"subscribe": topic, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "300"}
    batches = run_until(spark, bootstrap, tmp_path / "cp", 1000, **options)
    assert len(batches) >= 4 and all(len(batch) <= 300 for batch in batches)
    rows = [row for batch in batches for row in batch]
    assert sorted(row["value"] for row in rows) == sorted(f"v{i}".encode() for i in range(1000))
    assert {row["topic"] for row in rows} == {topic} and {row["partition"] for row in rows} == {0, 1, 2}
    for partition in range(3):
        offsets = [row["offset"] for row in rows if row["partition"] == partition]
        assert offsets == list(range(len(offsets))), "each partition read in order, without gaps or repeats"

    produce(bootstrap, topic, 1000, 50)
    resumed = [
        row for batch in run_available_now(spark, bootstrap, tmp_path / "cp", **options) for row in batch
    ]
    assert sorted(row["value"] for row in resumed) == sorted(f"v{i}".encode() for i in range(1000, 1050))


def test_min_offsets_per_trigger_waits_for_records_or_the_delay_as_sparks_source(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """``minOffsetsPerTrigger``: after the first batch, a trigger with fewer new records makes
    no batch until there are enough (30 and then 30 more make one batch of 60, not two of 30);
    with ``maxTriggerDelay`` past, the few there are make a batch."""
    bootstrap = stack.endpoint("kafka")
    topic = make_topic(bootstrap)
    produce(bootstrap, topic, 0, 30)
    waiting = {"subscribe": topic, "startingOffsets": "earliest", "minOffsetsPerTrigger": "60"}
    query, batches = start_query(spark, bootstrap, tmp_path / "cp", False, **waiting, maxTriggerDelay="1h")
    try:
        wait_for(lambda: sum(map(len, non_empty(batches))) == 30, query)
        produce(bootstrap, topic, 30, 30)
        produce(bootstrap, topic, 60, 30)
        # committed too: stopped before its commit, the batch of 60 would be replayed below
        wait_for(lambda: sum(map(len, non_empty(batches))) == 90 and committed(query, max(batches)), query)
    finally:
        query.stop()
    assert [len(batch) for batch in non_empty(batches)] == [30, 60]

    produce(bootstrap, topic, 90, 10)
    query, batches = start_query(spark, bootstrap, tmp_path / "cp", False, **waiting, maxTriggerDelay="2s")
    try:
        wait_for(lambda: sum(map(len, non_empty(batches))) == 10, query)  # a first batch never waits
        produce(bootstrap, topic, 100, 5)
        wait_for(lambda: sum(map(len, non_empty(batches))) == 15, query)  # 5 < 60: only the delay
    finally:
        query.stop()
    assert [sorted(row["value"] for row in batch) for batch in non_empty(batches)] == [
        sorted(f"v{i}".encode() for i in range(90, 100)),
        sorted(f"v{i}".encode() for i in range(100, 105)),
    ]


def wait_for(done: Any, query: Any) -> None:
    """Until ``done()`` (or the query ended): it must be done, and the query without error."""
    eventually(lambda: done() or not query.isActive, 120)
    assert query.exception() is None, query.exception()
    assert done(), "timed out"


def test_latest_pattern_and_bad_options(spark: Any, stack: EmbeddedStack, tmp_path: Path) -> None:
    bootstrap = stack.endpoint("kafka")
    prefix = f"pat{uuid.uuid4().hex[:6]}"
    first = make_topic(bootstrap, 2)
    spark_topic = f"{prefix}.a"
    make_topic(bootstrap, 2, spark_topic)
    produce(bootstrap, spark_topic, 0, 10)
    produce(bootstrap, first, 0, 10)
    rows = [
        row
        for batch in run_available_now(
            spark,
            bootstrap,
            tmp_path / "pattern",
            subscribePattern=rf"{prefix}\..*",
            startingOffsets="earliest",
        )
        for row in batch
    ]
    assert {row["topic"] for row in rows} == {spark_topic} and len(rows) == 10
    latest = run_available_now(
        spark, bootstrap, tmp_path / "latest", subscribe=first, startingOffsets="latest"
    )
    assert latest == []
    with pytest.raises(Exception, match="exactly one of the options assign, subscribe and subscribePattern"):
        run_available_now(spark, bootstrap, tmp_path / "bad", startingOffsets="earliest")


def test_assign_headers_and_min_partitions_as_sparks_source(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    bootstrap = stack.endpoint("kafka")
    topic = make_topic(bootstrap)
    producer = Producer({"bootstrap.servers": bootstrap})
    for index in range(90):
        producer.produce(
            topic, value=f"v{index}".encode(), partition=index % 3, headers=[("n", str(index).encode())]
        )
    assert producer.flush(30) == 0
    counts: list[int] = []
    rows: list[dict[str, Any]] = []

    def collect(frame: Any, _batch_id: int) -> None:
        counts.append(frame.rdd.getNumPartitions())
        rows.extend(r.asDict(recursive=True) for r in frame.collect())

    query = (
        spark.readStream.format(SOURCE_NAME)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("assign", json.dumps({topic: [0, 2]}))
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("minPartitions", "6")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert {row["partition"] for row in rows} == {0, 2} and len(rows) == 60
    assert all(row["headers"] == [{"key": "n", "value": row["value"][1:]}] for row in rows)
    assert max(counts) >= 6


def test_batch_reads_between_starting_and_ending_offsets(spark: Any, stack: EmbeddedStack) -> None:
    bootstrap = stack.endpoint("kafka")
    topic = make_topic(bootstrap, partitions=1)
    produce(bootstrap, topic, 0, 20)
    frame = (
        spark.read.format(SOURCE_NAME)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps({topic: {"0": 5}}))
        .option("endingOffsets", json.dumps({topic: {"0": 12}}))
        .load()
    )
    assert [row["offset"] for row in frame.orderBy("offset").collect()] == list(range(5, 12))

    def everything() -> Any:  # a new reader each time: option() changes the reader it is called on
        return (
            spark.read.format(SOURCE_NAME)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
        )

    assert everything().load().count() == 20
    capped = everything().option("maxRecordsPerPartition", "4").load()
    assert capped.rdd.getNumPartitions() == 5 and capped.count() == 20  # no task over 4 records
    for option, value, message in (
        ("startingTimestamp", "yesterday", "milliseconds since the epoch"),
        ("startingOffsetsByTimestampStrategy", "earliest", "error or latest"),
        ("kafka.ssl.truststore.location", "/x.jks", r"ssl\.ca\.location"),
        ("endingOffsets", "earliest", "reads nothing"),
    ):
        with pytest.raises(Exception, match=message):
            everything().option(option, value).load().count()


def timed_topic(bootstrap: str) -> str:
    """Partition 0: ten records at 1,000 … 10,000 ms; partition 1: ten at 500 … 5,000 ms."""
    topic = make_topic(bootstrap, partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for index in range(1, 11):
        producer.produce(topic, value=f"a{index}".encode(), partition=0, timestamp=index * 1000)
        producer.produce(topic, value=f"b{index}".encode(), partition=1, timestamp=index * 500)
    assert producer.flush(30) == 0
    return topic


def test_reads_start_and_end_at_times_as_sparks_source(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """``startingTimestamp`` / ``endingTimestamp`` and their per-partition JSON: from the first
    record at or after the start to before the first at or after the end (none: the partition's
    end); a partition with no record after the start fails, or starts at its end with the
    ``latest`` strategy. The broker answers ListOffsets by time wrongly (offset 0), so the
    offsets come from the records (consumer/offsets_by_time.py)."""
    bootstrap = stack.endpoint("kafka")
    topic = timed_topic(bootstrap)

    def read(**options: str) -> list[str]:
        frame = (
            spark.read.format(SOURCE_NAME)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
        )
        for key, value in options.items():
            frame = frame.option(key, value)
        return sorted(row["value"].decode() for row in frame.load().collect())

    assert read(startingTimestamp="3000", endingTimestamp="6000") == [
        "a3", "a4", "a5", "b10", "b6", "b7", "b8", "b9",
    ]  # fmt: skip
    by_partition = json.dumps({topic: {"0": 9000, "1": 4500}})
    assert read(startingOffsetsByTimestamp=by_partition) == ["a10", "a9", "b10", "b9"]
    both = {"startingTimestamp": "3000", "startingOffsetsByTimestamp": by_partition}
    assert read(**both, endingTimestamp="3001") == ["a3", "b6"]  # startingTimestamp wins
    with pytest.raises(Exception, match=r"gives no time for .*\[1\]"):
        read(startingOffsetsByTimestamp=json.dumps({topic: {"0": 9000}}))
    with pytest.raises(Exception, match=r"no record at or after the time in .*\[1\]"):
        read(startingTimestamp="8000")
    assert read(startingTimestamp="8000", startingOffsetsByTimestampStrategy="latest") == ["a10", "a8", "a9"]
    streamed = run_available_now(
        spark, bootstrap, tmp_path / "cp", subscribe=topic, startingTimestamp="4500",
        startingOffsetsByTimestampStrategy="latest",
    )  # fmt: skip
    assert sorted(row["value"].decode() for batch in streamed for row in batch) == [
        "a10", "a5", "a6", "a7", "a8", "a9", "b10", "b9",
    ]  # fmt: skip


def test_a_topic_deleted_or_created_again_is_data_loss_as_in_sparks_source(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """Between two runs one topic is deleted and created again with fewer records (its offsets
    go back) and another deleted for good: by default the query fails naming both; with
    ``failOnDataLoss=false`` it reads the new topic from its start — every record of it, none of
    the old — and goes on from there. (Without the check the source planned nothing for the new
    topic until it grew past the old position, and lost what came before, in silence.)"""
    bootstrap = stack.endpoint("kafka")
    prefix = f"loss{uuid.uuid4().hex[:6]}"
    again, gone = make_topic(bootstrap, 1, f"{prefix}.again"), make_topic(bootstrap, 1, f"{prefix}.gone")
    produce(bootstrap, again, 0, 100)
    produce(bootstrap, gone, 100, 10)
    options = {"subscribePattern": rf"{prefix}\..*", "startingOffsets": "earliest"}
    first = run_available_now(spark, bootstrap, tmp_path / "cp", **options)
    assert sum(map(len, first)) == 110

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([again, gone]).values():
        future.result(30)
    make_topic(bootstrap, 1, again)
    produce(bootstrap, again, 1000, 30)
    lost = rf"{again}\[0\]: offsets went back from 100 to 30 .*; {gone}\[0\]: the partition is gone"
    with pytest.raises(Exception, match=lost):
        run_available_now(spark, bootstrap, tmp_path / "cp", **options)

    going_on = {**options, "failOnDataLoss": "false"}
    rows = [
        row for batch in run_available_now(spark, bootstrap, tmp_path / "cp", **going_on) for row in batch
    ]
    assert sorted(row["value"] for row in rows) == sorted(f"v{i}".encode() for i in range(1000, 1030))
    assert sorted(row["offset"] for row in rows) == list(range(30))
    produce(bootstrap, again, 2000, 5)
    rows = [
        row for batch in run_available_now(spark, bootstrap, tmp_path / "cp", **going_on) for row in batch
    ]
    assert sorted(row["value"] for row in rows) == sorted(f"v{i}".encode() for i in range(2000, 2005))


def test_a_start_at_the_end_is_resolved_once_and_logged_by_an_empty_first_batch(stack: EmbeddedStack) -> None:
    """Spark asks a new query's source for its start twice (for the first batch's end and again
    for the start it reads from): records written in between were skipped. And Spark logs a
    batch's end, not its start: a start at the end (``latest``), resolved again after a restart,
    moved past a first batch that was killed before its commit. So the start is resolved once,
    and a first batch from an end is empty; the one after it reads every record written since."""
    bootstrap = stack.endpoint("kafka")
    topic = make_topic(bootstrap, partitions=2)
    produce(bootstrap, topic, 0, 10)
    at_end = KafkaStreamReader(
        SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    )
    from_earliest = KafkaStreamReader(
        SourceOptions.parse(
            {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest"}
        )
    )
    try:
        start, first = at_end.initialOffset(), from_earliest.initialOffset()
        produce(bootstrap, topic, 10, 5)

        assert at_end.initialOffset() == start and sum(start[topic].values()) == 10
        assert at_end.latestOffset(start, ReadAllAvailable()) == start
        assert sum(at_end.latestOffset(start, ReadAllAvailable())[topic].values()) == 15
        assert sum(from_earliest.latestOffset(first, ReadAllAvailable())[topic].values()) == 15
    finally:
        at_end.stop()
        from_earliest.stop()


def test_a_task_reads_many_ranges_together_exactly(stack: EmbeddedStack) -> None:
    """One task's ranges over many topic partitions (a small batch over many tables is one task)
    are read by one consumer together: each range exactly, from its start to before its end,
    past transaction markers (every partition here ends with one), with nothing of the range's
    partition before or after it and nothing of a partition the task does not read. Read one
    after another, 400 such ranges took 22-25 s (docs/consumer.md, run 21)."""
    bootstrap = stack.endpoint("kafka")
    topics = [make_topic(bootstrap, partitions=10) for _ in range(4)]
    writer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"ranges-{topics[0]}"})
    writer.init_transactions(30)
    for round_ in range(2):
        writer.begin_transaction()
        for topic in topics:
            for partition in range(10):
                for index in range(3):
                    writer.produce(topic, value=f"{round_}-{index}".encode(), partition=partition)
        writer.commit_transaction(30)
    # Each partition: records 0-2, marker 3, records 4-6, marker 7. A range per partition, but
    # the last topic's: there the task reads 1..6 (the second transaction's records but its last).
    ranges = [
        TopicPartitionRange(topic, partition, 0, 8) for topic in topics[:-1] for partition in range(10)
    ] + [TopicPartitionRange(topics[-1], partition, 1, 6) for partition in range(9)]
    options = SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": ",".join(topics)})

    rows = pa.Table.from_batches(list(read_group(options, RangeGroup(tuple(ranges))))).to_pylist()

    read: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        read.setdefault((row["topic"], row["partition"]), []).append(row["offset"])
    expected = {
        (r.topic, r.partition): [o for o in (0, 1, 2, 4, 5, 6) if r.start <= o < r.end] for r in ranges
    }
    assert read == expected
    # A task of one range (the large batches' tasks take its messages without sorting them).
    alone = pa.Table.from_batches(list(read_group(options, RangeGroup((ranges[-1],)))))
    assert alone.column("offset").to_pylist() == [1, 2, 4, 5]
