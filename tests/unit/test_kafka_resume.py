"""Where the Kafka source's next batch begins, and the four kinds of data loss it reports."""

from __future__ import annotations

from spanner_cdc.consumer.kafka_resume import resume


def test_nothing_lost_begins_where_the_last_batch_ended() -> None:
    resumed = resume({"t": {"0": 5, "1": 0}}, {"t": {"0": 0, "1": 0}}, {"t": {"0": 9, "1": 0}})
    assert resumed.lost == []
    assert resumed.begin == {"t": {"0": 5, "1": 0}}


def test_a_new_partition_begins_at_its_earliest_and_loses_nothing_from_zero() -> None:
    resumed = resume(
        {"t": {"0": 5}}, {"t": {"0": 0, "1": 0}, "u": {"0": 0}}, {"t": {"0": 5, "1": 3}, "u": {"0": 2}}
    )
    assert resumed.lost == []
    assert resumed.begin == {"t": {"0": 5, "1": 0}, "u": {"0": 0}}


def test_each_kind_of_loss_is_named_and_reading_goes_on_from_the_earliest() -> None:
    start = {"kept": {"0": 4}, "trimmed": {"0": 3}, "again": {"0": 90}, "gone": {"0": 7, "1": 2}}
    earliest = {"kept": {"0": 0}, "trimmed": {"0": 10}, "again": {"0": 0}, "late": {"0": 6}}
    ends = {"kept": {"0": 8}, "trimmed": {"0": 12}, "again": {"0": 30}, "late": {"0": 9}}
    resumed = resume(start, earliest, ends)
    assert resumed.lost == [
        "again[0]: offsets went back from 90 to 30 (the topic deleted and created again?)",
        "late[0]: a new partition starts at 6, not 0 (offsets 0..5 are gone)",
        "trimmed[0]: offsets 3..9 are gone (retention or compaction)",
        "gone[0]: the partition is gone (its topic deleted?)",
        "gone[1]: the partition is gone (its topic deleted?)",
    ]
    assert resumed.begin == {"kept": {"0": 4}, "trimmed": {"0": 10}, "again": {"0": 0}, "late": {"0": 6}}


def test_a_start_at_the_end_or_the_earliest_is_no_loss() -> None:
    resumed = resume({"t": {"0": 10, "1": 3}}, {"t": {"0": 2, "1": 3}}, {"t": {"0": 10, "1": 8}})
    assert resumed.lost == []
    assert resumed.begin == {"t": {"0": 10, "1": 3}}
