"""The backfill's pure parts: wire values → change-record JSON, its options, its records."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from google.protobuf import struct_pb2  # type: ignore[import-untyped]

from spanner_cdc.common.config import ConfigError
from spanner_cdc.producer.backfill.store import TablePlan
from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.producer.spanner.snapshot_read import json_value
from tests.unit.producer.test_config import REQUIRED, parse

pytestmark = pytest.mark.unit


def wire(value: object) -> struct_pb2.Value:
    message = struct_pb2.Value()
    if value is None:
        message.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        message.bool_value = value
    elif isinstance(value, float):
        message.number_value = value
    elif isinstance(value, str):
        message.string_value = value
    else:
        assert isinstance(value, list)
        message.list_value.values.extend(wire(item) for item in value)
    return message


@pytest.mark.parametrize(
    "value",
    [None, True, False, 1.5, -0.0, "123", "NaN", "-Infinity", "AP8=", "2024-05-01T10:11:12.123456Z",
     ["1", None, "2"], [], [["nested"]]],
)  # fmt: skip
def test_wire_values_are_the_change_record_json_form(value: object) -> None:
    """Spanner sends INT64/NUMERIC/TIMESTAMP/BYTES as text and NaN as a string, exactly as
    change records carry them: the backfill passes them on unchanged."""
    assert json_value(wire(value)) == value


def test_backfill_tables_need_backfill() -> None:
    with pytest.raises(ConfigError, match="give --backfill too"):
        ProducerConfig.from_options(parse([*REQUIRED, "--backfill-tables", "Accounts"]))
    config = ProducerConfig.from_options(parse([*REQUIRED, "--backfill", "--backfill-tables", "A,B*"]))
    assert config.backfill and config.backfill_tables == ("A", "B*")


def test_a_plan_survives_its_record() -> None:
    plan = TablePlan("Orders", 1_700_000_000_000_000, ["Region", "OrderId"], ["eu", "42"], finished=False)
    assert TablePlan.from_json(asdict(plan)) == plan


def test_a_plan_whose_key_is_not_a_list_is_refused() -> None:
    record = asdict(TablePlan("T", 1, ["K"])) | {"after_key": "42"}
    with pytest.raises(ValueError, match="after_key"):
        TablePlan.from_json(record)
