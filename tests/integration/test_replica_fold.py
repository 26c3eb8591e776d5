"""The replica's fold (sinks.replica.merge): many changes of one key in one batch — partial
updates of a wide table, values set to NULL, deletes and inserts again — land as applying them
one by one would, in DuckDB and PostgreSQL. No Spark: events are decoded from the bytes the
producer would write, staged as the tasks stage them, and merged by ``ReplicaMerge``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from spanner_cdc.consumer.decode.driver import BatchDecoder, BrokerPartitions
from spanner_cdc.consumer.decode.schema_topic import SchemaTopic
from spanner_cdc.consumer.sinks.replica.backends import DuckDbBackend, PostgresBackend, SqlBackend
from spanner_cdc.consumer.sinks.replica.merge import ReplicaMerge
from spanner_cdc.consumer.sinks.replica.names import quote
from spanner_cdc.consumer.sinks.replica.stage.rows import combined, staged_parts
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import fresh_postgres_database
from testkit.decoding import decoded_events
from testkit.synthetic import ChangeFactory, wide_table

pytestmark = pytest.mark.integration

TOPIC = "P.Wide"
TABLE = wide_table(10)
VALUES = [name for name, _, is_key in TABLE.columns if not is_key]
Row = dict[str, int | None]


def history(
    factory: ChangeFactory, seed: int, changes: int, keys: int
) -> tuple[list[dict[str, Any]], dict[str, Row]]:
    """Random changes of ``keys`` rows — inserts setting some columns, updates setting a few
    (NULL among the values), deletes — and the rows applying them one by one leaves."""
    chance = random.Random(seed)
    records: list[dict[str, Any]] = []
    rows: dict[str, Row] = {}
    for _ in range(changes):
        key = f"k{chance.randrange(keys)}"
        named = chance.sample(VALUES, chance.randint(1, 3))
        values = {name: chance.choice([None, chance.randrange(-50, 50)]) for name in named}
        if key not in rows:
            records.append(factory.record("INSERT", {"Id": key}, _spanner_json(values)))
            rows[key] = {name: values.get(name) for name in VALUES}
        elif chance.random() < 0.15:
            records.append(factory.record("DELETE", {"Id": key}, old_values=_spanner_json(rows.pop(key))))
        else:
            records.append(factory.record("UPDATE", {"Id": key}, _spanner_json(values)))
            rows[key].update(values)
    return records, rows


def _spanner_json(values: Row) -> dict[str, str | None]:
    return {name: None if value is None else str(value) for name, value in values.items()}


@pytest.fixture(params=["duckdb", "postgres"])
def backend(request: pytest.FixtureRequest, stack: EmbeddedStack, tmp_path: Path) -> SqlBackend:
    if request.param == "duckdb":
        return DuckDbBackend(tmp_path / "replica.duckdb")
    return PostgresBackend(fresh_postgres_database(stack.endpoint("postgres")))


@pytest.mark.parametrize("seed", [1, 2])
def test_many_changes_of_a_key_in_one_batch_fold_as_applied_one_by_one(
    backend: SqlBackend, seed: int
) -> None:
    """Three batches of 400 changes over 30 keys: each key changes about 13 times a batch, each
    change names 1-3 of ten value columns, so a column's last setting change is seldom the key's
    last change."""
    records, expected = history(TABLE, seed, changes=1200, keys=30)
    decoder = BatchDecoder(SchemaTopic({}, "P"), Topics("P"), BrokerPartitions(lambda: {TOPIC: 1}))
    events = decoded_events(decoder, records, TOPIC)
    merge = ReplicaMerge(backend)
    try:
        for batch_id, start in enumerate(range(0, len(events), 400)):
            with merge.batch("fold-test", batch_id):
                merge.write(combined(staged_parts(events[start : start + 400])))
        stored = backend.execute(
            f"SELECT {', '.join(quote(c) for c in ['Id', *VALUES])} FROM {quote('Wide')}"
        )
    finally:
        backend.close()

    assert {row[0]: dict(zip(VALUES, row[1:], strict=True)) for row in stored} == expected
