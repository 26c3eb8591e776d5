"""The source's options as Spark's kafka source names them, and their translation to librdkafka."""

from __future__ import annotations

import itertools
import random

import pytest

from spanner_cdc.consumer.kafka_ranges import (
    MAX_TASK_OFFSETS,
    TopicPartitionRange,
    input_partitions,
    offset_ranges,
    shares,
)
from spanner_cdc.consumer.kafka_source_options import (
    KafkaSourceError,
    SourceOptions,
    client_settings,
    resolve,
    times_for,
)

pytestmark = pytest.mark.unit


def test_java_client_names_are_translated_or_refused() -> None:
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p,w";'
    settings = client_settings(
        {
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.jaas.config": jaas,
            "kafka.security.protocol": "SASL_SSL",
        }
    )
    assert settings == {
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p,w",
        "security.protocol": "SASL_SSL",
    }
    with pytest.raises(KafkaSourceError, match=r"ssl\.certificate\.location"):
        client_settings({"kafka.ssl.keystore.location": "/k.jks"})


def test_exactly_one_way_to_choose_topics() -> None:
    base = {"kafka.bootstrap.servers": "h:1"}
    assert SourceOptions.parse({**base, "assign": '{"t": [0, 2]}'}).wanted_partition("t", 2)
    assert not SourceOptions.parse({**base, "assign": '{"t": [0, 2]}'}).wanted_partition("t", 1)
    for chosen in ({}, {"subscribe": "t", "assign": '{"t": [0]}'}):
        with pytest.raises(KafkaSourceError, match="exactly one of"):
            SourceOptions.parse({**base, **chosen})
    with pytest.raises(KafkaSourceError, match="assign must be JSON"):
        SourceOptions.parse({**base, "assign": "t:0"})


def test_times_to_start_and_end_at() -> None:
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}
    by_partition = '{"t": {"0": 5000, "1": 7000}}'
    assert SourceOptions.parse(base).starting_times is None
    assert SourceOptions.parse(base).starting_strategy == "error"
    both = SourceOptions.parse(
        {**base, "startingTimestamp": "1000", "startingOffsetsByTimestamp": by_partition}
    )
    assert both.starting_times == 1000  # startingTimestamp wins, as in Spark
    timed = SourceOptions.parse({**base, "endingOffsetsByTimestamp": by_partition})
    assert timed.ending_times == {"t": {"0": 5000, "1": 7000}} and timed.starting_times is None
    assert times_for(1000, [("t", 0), ("t", 1)], "x") == {("t", 0): 1000, ("t", 1): 1000}
    assert times_for({"t": {"0": 5, "1": 7}}, [("t", 1)], "x") == {("t", 1): 7}
    with pytest.raises(KafkaSourceError, match=r"x gives no time for t\[2\]"):
        times_for({"t": {"0": 5}}, [("t", 0), ("t", 2)], "x")
    for option, value, message in (
        ("startingTimestamp", "-5", "milliseconds since the epoch"),
        ("endingTimestamp", "2026-11-27", "milliseconds since the epoch"),
        ("startingOffsetsByTimestamp", '{"t": [5000]}', "must be JSON like"),
        ("startingOffsetsByTimestamp", '{"t": {"0": -1}}', "not negative"),
        ("startingOffsetsByTimestampStrategy", "earliest", "error or latest"),
    ):
        with pytest.raises(KafkaSourceError, match=message):
            SourceOptions.parse({**base, option: value})


def test_json_offsets_and_min_partitions() -> None:
    earliest, ends = {"t": {"0": 3, "1": 0}}, {"t": {"0": 10, "1": 90}}
    assert resolve('{"t": {"0": -1}}', earliest, ends, "x") == {"t": {"0": 10, "1": 0}}
    ranges = offset_ranges({"t": {"0": 0, "1": 0}}, {"t": {"0": 10, "1": 90}}, min_partitions=10)
    assert ranges[0] == TopicPartitionRange("t", 0, 0, 10) and len(ranges) == 10
    assert [(r.start, r.end) for r in ranges[1:3]] == [(0, 10), (10, 20)]
    assert sum(r.end - r.start for r in ranges) == 100


def test_min_offsets_per_trigger_and_max_trigger_delay_as_spark_writes_them() -> None:
    base = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t"}
    parsed = SourceOptions.parse({**base, "minOffsetsPerTrigger": "500", "maxTriggerDelay": "30s"})
    assert (parsed.min_rows, parsed.max_delay_seconds) == (500, 30.0)
    default = SourceOptions.parse(base)
    assert (default.min_rows, default.max_delay_seconds) == (None, 900.0)  # Spark's 15m
    for written, seconds in (("250ms", 0.25), ("2 min", 120.0), ("1h", 3600.0), ("1500", 1.5)):
        assert SourceOptions.parse({**base, "maxTriggerDelay": written}).max_delay_seconds == seconds
    with pytest.raises(KafkaSourceError, match="maxTriggerDelay must be a duration"):
        SourceOptions.parse({**base, "maxTriggerDelay": "soon"})
    with pytest.raises(KafkaSourceError, match="minOffsetsPerTrigger must be a positive whole number"):
        SourceOptions.parse({**base, "minOffsetsPerTrigger": "-1"})


def _tasks(
    sizes: dict[str, int],
    parallelism: int | None,
    min_partitions: int | None = None,
    max_records: int | None = None,
) -> list[list[tuple[int, int, int]]]:
    """Each task's (partition, start, end) ranges for a batch of ``sizes`` offsets per partition."""
    groups = input_partitions(
        {"t": dict.fromkeys(sizes, 0)}, {"t": sizes}, min_partitions, parallelism, max_records
    )
    return [[(r.partition, r.start, r.end) for r in group.ranges] for group in groups]


def test_a_batch_is_one_wave_of_equal_tasks_over_the_slots() -> None:
    third = {"0": 16_667, "1": 16_667, "2": 16_666}  # the bench's 50,000-event batch
    assert _tasks(third, 2) == [
        [(0, 0, 16_667), (1, 0, 8_333)],
        [(1, 8_333, 16_667), (2, 0, 16_666)],
    ]
    assert _tasks({"0": 8_000, "1": 8_000, "2": 4_000}, 1) == [[(0, 0, 8_000), (1, 0, 8_000), (2, 0, 4_000)]]
    assert len(_tasks(third, 1)) == 50_000 // MAX_TASK_OFFSETS  # one slot: tasks in turn
    assert len(_tasks(third, 16)) == 10  # no task under MIN_TASK_OFFSETS
    large = _tasks({str(p): 50_000 for p in range(4)}, 2)  # 200,000: waves of two, full tasks
    assert len(large) == 200_000 // MAX_TASK_OFFSETS and len(large) % 2 == 0
    assert all(sum(e - s for _, s, e in task) == MAX_TASK_OFFSETS for task in large)
    demo = _tasks({str(p): 6 for p in range(12)}, 2)  # a demo-sized batch: one task reads all
    assert demo == [[(p, 0, 6) for p in range(12)]]


def test_without_parallelism_tasks_read_at_most_task_offsets() -> None:
    assert [sum(e - s for _, s, e in task) for task in _tasks({"0": 25_000, "1": 10_000}, None)] == [
        8_750
    ] * 4
    assert len(_tasks({str(p): 6 for p in range(12)}, None)) == 1


def test_min_partitions_plans_as_sparks_source_does() -> None:
    assert len(_tasks({str(p): 6 for p in range(12)}, 2, min_partitions=12)) == 12
    assert _tasks({"0": 10, "1": 90}, 2, min_partitions=10)[:2] == [[(0, 0, 10)], [(1, 0, 10)]]


@pytest.mark.parametrize("seed", range(20))
def test_shares_read_every_offset_once_in_order(seed: int) -> None:
    rng = random.Random(seed)
    ranges = [
        TopicPartitionRange("t", p, first, first + rng.randint(1, 30_000))
        for p, first in enumerate(rng.choices([0, 7, 1_000], k=rng.randint(1, 6)))
    ]
    count = rng.randint(1, 9)
    read = [r for group in shares(ranges, count) for r in group.ranges]
    sizes = [sum(r.end - r.start for r in group.ranges) for group in shares(ranges, count)]
    assert len(sizes) == count and max(sizes) - min(sizes) <= 1
    for whole in ranges:
        own = [r for r in read if r.partition == whole.partition]
        assert own[0].start == whole.start and own[-1].end == whole.end
        assert all(a.end == b.start for a, b in itertools.pairwise(own))


def test_max_records_per_partition_caps_every_task_as_sparks_source() -> None:
    """Spark 4's ``maxRecordsPerPartition``: a range over the cap split in equal parts; with
    this source's shares, more of them, none over the cap; every offset still read once."""
    assert _tasks({"0": 10, "1": 25}, None, min_partitions=2, max_records=10) == [
        [(0, 0, 10)], [(1, 0, 8)], [(1, 8, 16)], [(1, 16, 25)],
    ]  # fmt: skip
    for parallelism in (None, 2, 3):
        tasks = _tasks({"0": 40_000, "1": 7, "2": 12_345}, parallelism, max_records=3_000)
        assert max(sum(end - start for _, start, end in task) for task in tasks) <= 3_000
        read = sorted(r for task in tasks for r in task)
        assert sum(end - start for _, start, end in read) == 52_352
    assert (
        SourceOptions.parse(
            {"kafka.bootstrap.servers": "b", "subscribe": "t", "maxRecordsPerPartition": "7"}
        ).max_records
        == 7
    )


def test_which_starts_may_be_at_a_partitions_end() -> None:
    """Those a new streaming query pins with an empty first batch (kafka_source.latestOffset)."""
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}
    at_an_end = [
        {},
        {"startingOffsets": "latest"},
        {"startingOffsets": '{"t": {"0": 5, "1": -1}}'},
        {"startingTimestamp": "1000", "startingOffsetsByTimestampStrategy": "latest"},
    ]
    elsewhere = [
        {"startingOffsets": "earliest"},
        {"startingOffsets": '{"t": {"0": 5, "1": -2}}'},
        {"startingTimestamp": "1000"},
        {"startingTimestamp": "1000", "startingOffsets": "latest"},  # the time wins, as in Spark
    ]
    assert [SourceOptions.parse({**base, **given}).may_start_at_an_end for given in at_an_end] == [True] * 4
    assert [SourceOptions.parse({**base, **given}).may_start_at_an_end for given in elsewhere] == [False] * 4
