"""What Spark's offsets log says a batch planned to read."""

from __future__ import annotations

from pathlib import Path

import pytest

from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.spark.offsets_log import OffsetsLog, planned_offsets

pytestmark = pytest.mark.unit
A0, A1 = ("P.A", 0), ("P.A", 1)


def logged(tmp_path: Path, batches: dict[int, str]) -> Location:
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    for batch, source in batches.items():
        (offsets / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{source}\n')
    return Location.local(tmp_path)


def test_the_offsets_log_gives_a_batch_s_planned_end(tmp_path: Path) -> None:
    checkpoint = logged(tmp_path, {3: '{"P.A":{"1":30,"0":12}}'})
    assert planned_offsets(checkpoint, 3) == {A0: 12, A1: 30}
    assert planned_offsets(checkpoint, 2) is None
    assert planned_offsets(checkpoint, -1) is None


def test_a_batch_s_span_counts_every_partition_from_the_previous_batch_s_end(tmp_path: Path) -> None:
    checkpoint = logged(
        tmp_path,
        {
            4: '{"P.A":{"0":12,"1":30}}',
            5: '{"P.A":{"0":15,"1":30},"P.B":{"0":7}}',  # P.B is new: from offset 0
        },
    )
    assert OffsetsLog(checkpoint).planned_span(5) == 3 + 0 + 7
    assert OffsetsLog(checkpoint).planned_span(4) is None  # no batch 3: not known
    assert OffsetsLog(checkpoint).planned_span(6) is None  # not planned yet


def test_a_batch_s_end_is_read_once_and_is_the_next_batch_s_start(tmp_path: Path) -> None:
    checkpoint = logged(tmp_path, {4: '{"P.A":{"0":12}}', 5: '{"P.A":{"0":15}}', 6: '{"P.A":{"0":20}}'})
    log = OffsetsLog(checkpoint)
    assert log.planned_span(5) == 3
    (tmp_path / "offsets" / "5").unlink()  # read already: batch 6 starts where it ended
    assert log.planned(6) == ({A0: 15}, {A0: 20})
