"""The source's options as Spark's kafka source names them, and their translation to librdkafka."""

from __future__ import annotations

import pytest

from spanner_cdc.consumer.kafka_source import SMALL_RANGE_OFFSETS, TopicPartitionRange, grouped, offset_ranges
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


def test_small_ranges_are_read_several_to_a_task_and_large_ones_alone() -> None:
    start = {"t": {str(p): 0 for p in range(12)}}
    small = offset_ranges(start, {"t": {str(p): 6 for p in range(12)}}, None)
    assert [len(group.ranges) for group in grouped(small, None)] == [12]  # a demo-sized batch: one task

    sizes = {"0": 4_000, "1": 900, "2": 9_000, "3": 100, "4": 50}
    mixed = grouped(offset_ranges({"t": dict.fromkeys(sizes, 0)}, {"t": sizes}, None), None)
    assert [[r.partition for r in group.ranges] for group in mixed] == [[0, 1], [2], [3, 4]]
    assert all(
        sum(r.end - r.start for r in g.ranges) <= SMALL_RANGE_OFFSETS or len(g.ranges) == 1 for g in mixed
    )

    asked = grouped(offset_ranges(start, {"t": {str(p): 6 for p in range(12)}}, 12), 12)
    assert len(asked) == 12  # minPartitions: the parallelism asked for


def test_ranges_over_the_large_size_are_read_by_several_tasks() -> None:
    large = grouped(offset_ranges({"t": {"0": 5, "1": 0}}, {"t": {"0": 25_005, "1": 10_000}}, None), None)
    assert [[(r.partition, r.start, r.end) for r in group.ranges] for group in large] == [
        [(0, 5, 8_338)],
        [(0, 8_338, 16_671)],
        [(0, 16_671, 25_005)],
        [(1, 0, 10_000)],
    ]
