"""What ``--fail-on-data-loss false`` counts as skipped: planned offsets Kafka no longer had."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spanner_cdc.consumer.spark.data_loss import first_offsets, lost_offsets

pytestmark = pytest.mark.unit
A0, A1 = ("P.A", 0), ("P.A", 1)


def test_offsets_below_kafka_s_earliest_and_the_first_read_are_lost() -> None:
    start, end = {A0: 10, A1: 10}, {A0: 30, A1: 30}
    assert lost_offsets(start, end, earliest={A0: 25, A1: 4}, first_read={A0: 25, A1: 11}) == {A0: 15}


def test_records_removed_after_the_batch_read_them_are_not_lost() -> None:
    """Retention racing the batch: Kafka's earliest moved on, but the batch read from its start."""
    assert lost_offsets({A0: 10}, {A0: 30}, earliest={A0: 28}, first_read={A0: 10}) == {}


def test_a_partition_the_batch_read_nothing_of_counts_up_to_its_planned_end() -> None:
    assert lost_offsets({A0: 10}, {A0: 30}, earliest={A0: 40}, first_read={}) == {A0: 20}


def test_the_first_offset_read_of_each_partition() -> None:
    outline = pa.table({"topic": ["P.A", "P.A", "P.A"], "partition": [0, 0, 1], "offset": [7, 5, 9]})
    assert first_offsets(outline) == {A0: 5, A1: 9}
