"""One table's decoded events → the sinks' rows: the row ids (no Spark, no database)."""

from __future__ import annotations

import pytest

from spanner_cdc.consumer.change_rows import TableChanges
from spanner_cdc.schemas.identity import row_id
from testkit.synthetic import ChangeFactory
from tests.unit.test_replica_staging import decoded

pytestmark = pytest.mark.unit


def test_a_row_id_is_one_per_key_even_where_python_calls_two_keys_equal() -> None:
    """0.0 and -0.0 are equal in Python, and different keys in Spanner (and in the row id's
    JSON): each key gets its own id, the id ``row_id`` gives it, computed once per key and handed
    to every event of it."""
    floats = ChangeFactory(columns=[("K", "FLOAT64", True), ("V", "STRING", False)])
    numbers = ChangeFactory(columns=[("K", "NUMERIC", True), ("V", "STRING", False)])
    events = decoded(
        [floats.record("INSERT", {"K": k}, {"V": "x"}) for k in (0.0, -0.0, 0.0, 2.5)]
        + [numbers.record("INSERT", {"K": k}, {"V": "x"}) for k in ("1.5", "1.50", "2")]
    )
    changes = TableChanges("Accounts", events)

    keys = [event.record["payload"]["K"] for event in changes.events]
    assert [repr(k) for k in keys] == [
        "0.0",
        "-0.0",
        "0.0",
        "2.5",
        "Decimal('1.500000000')",
        "Decimal('1.500000000')",
        "Decimal('2.000000000')",
    ]
    assert changes.row_ids == [row_id("Accounts", {"K": key}) for key in keys]
    assert len(set(changes.row_ids)) == 5


def test_a_table_created_again_with_another_key_has_the_row_ids_of_each_key() -> None:
    first = ChangeFactory(columns=[("Id", "STRING", True), ("N", "INT64", False)])
    again = ChangeFactory(columns=[("Id", "STRING", False), ("N", "INT64", True)])
    events = decoded(
        [first.record("INSERT", {"Id": "1"}, {"N": 7}), again.record("INSERT", {"N": 1}, {"Id": "1"})]
    )

    assert TableChanges("Accounts", events).row_ids == [
        row_id("Accounts", {"Id": "1"}),
        row_id("Accounts", {"N": 1}),
    ]
