"""Stage rows the tasks loaded into the PostgreSQL replica (sinks.replica.stage.loaded): the
merge takes exactly the rows the driver kept of them, by their numbers, beside rows only a file
holds, across two table versions. No Spark: the tasks' loading runs in this process."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from spanner_cdc.consumer.sinks.replica.backends import PostgresBackend
from spanner_cdc.consumer.sinks.replica.merge import ReplicaMerge
from spanner_cdc.consumer.sinks.replica.stage.loaded import StagedTables
from spanner_cdc.consumer.sinks.replica.stage.rows import StagedPart, combined, staged_parts
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import fresh_postgres_database
from testkit.decoding import decoded_events
from testkit.synthetic import ACCOUNT_COLUMNS, ChangeFactory
from tests.unit.consumer.sinks.replica.test_replica_staging import TOPIC, new_decoder

pytestmark = pytest.mark.integration
#: Rows of each task's part: enough for a task to load them (stage.loaded.TASKS_LOAD_FROM_ROWS).
KEYS = 5000


def inserts(factory: ChangeFactory, keys: range, first_offset: int, **values: str) -> list[StagedPart]:
    records = [factory.record("INSERT", {"Id": f"k{k:05d}"}, {"Balance": str(k), **values}) for k in keys]
    return staged_parts(decoded_events(new_decoder(), records, TOPIC, first_offset=first_offset))


def kept(part: StagedPart, mask: list[bool]) -> StagedPart:
    return part.with_rows(part.rows.filter(pa.array(mask)))


def test_the_merge_takes_the_kept_rows_a_task_loaded(stack: EmbeddedStack) -> None:
    """Task 0 loaded 5,000 inserts of the old table version, of which the driver kept every
    other one (2,500 runs of numbers: selected as an array); task 1 loaded 5,000 of the new
    version (a column added), of which it kept the middle 2,500 (one range); 50 more rows only a
    file holds (held events kept from an earlier batch). The replica has exactly the kept rows, the
    added column NULL in the old version's."""
    dsn = fresh_postgres_database(stack.endpoint("postgres"))
    old, new = ChangeFactory(), ChangeFactory(columns=[*ACCOUNT_COLUMNS, ("Added", "STRING", False)])
    tables = StagedTables(dsn, "query", 7)
    [first] = tables.load(0, inserts(old, range(0, KEYS), 0, Note="old"))
    [second] = tables.load(1, inserts(new, range(KEYS, 2 * KEYS), KEYS, Note="new", Added="yes"))
    [only_in_file] = inserts(old, range(2 * KEYS, 2 * KEYS + 50), 2 * KEYS, Note="file")
    parts = [
        kept(first, [k % 2 == 0 for k in range(KEYS)]),
        kept(second, [KEYS // 4 <= k < 3 * KEYS // 4 for k in range(KEYS)]),
        only_in_file,
    ]
    backend = PostgresBackend(dsn)
    merge = ReplicaMerge(backend)

    with merge.batch("query", 7):
        merge.write(combined(parts))

    rows = backend.execute('SELECT "Id", "Balance", "Note", "Added" FROM "Accounts" ORDER BY 1')
    expected: list[tuple[Any, ...]] = [
        *((f"k{k:05d}", k, "old", None) for k in range(0, KEYS, 2)),
        *((f"k{k:05d}", k, "new", "yes") for k in range(KEYS + KEYS // 4, KEYS + 3 * KEYS // 4)),
        *((f"k{k:05d}", k, "file", None) for k in range(2 * KEYS, 2 * KEYS + 50)),
    ]
    assert rows == expected
    backend.close()
