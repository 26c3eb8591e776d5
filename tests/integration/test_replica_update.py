"""A join's update of replica rows (``SqlBackend.update_joined``): DuckDB writes the matched rows
anew (delete and insert; its UPDATE of rows spread over a table is slow) and PostgreSQL updates
them; both must leave the same rows — columns not assigned kept, NULL keys matched as the merge
matches them, odd names quoted, placeholders filled, unmatched rows untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spanner_cdc.consumer.sinks.replica.backends import DuckDbBackend, PostgresBackend, SqlBackend
from spanner_cdc.consumer.sinks.replica.names import quote
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import fresh_postgres_database

pytestmark = pytest.mark.integration

ODD = 'odd "name"?'
TABLE = "Rows"
SOURCE = "cdc$changes"
STORED: list[tuple[Any, ...]] = [
    ("a", "old a", 1, "keep a"),
    ("b", "old b", 2, "keep b"),
    (None, "old null", 3, "keep null"),
]
#: (key, new value, whether the change sets it, version)
CHANGES: list[tuple[Any, ...]] = [
    ("a", "new a", True, 10),
    ("b", "ignored", False, 20),
    (None, "new null", True, 30),
    ("z", "x", True, 40),
]


def _backend(kind: str, tmp_path: Path, stack: EmbeddedStack) -> SqlBackend:
    if kind == "duckdb":
        return DuckDbBackend(tmp_path / "replica.duckdb")
    return PostgresBackend(fresh_postgres_database(stack.endpoint("postgres")))


@pytest.mark.parametrize("kind", ["duckdb", "postgres"])
def test_an_update_through_a_join_keeps_what_it_does_not_assign(
    kind: str, tmp_path: Path, stack: EmbeddedStack
) -> None:
    backend = _backend(kind, tmp_path, stack)
    try:
        with backend.transaction():
            backend.execute(
                f"CREATE TABLE {quote(TABLE)} (k VARCHAR, {quote(ODD)} VARCHAR, version BIGINT, kept VARCHAR)"
            )
            backend.execute(
                f"CREATE TEMP TABLE {quote(SOURCE)} (k VARCHAR, value VARCHAR, sets BOOLEAN, version BIGINT)"
            )
            for table, filled in ((TABLE, STORED), (SOURCE, CHANGES)):
                for row in filled:
                    backend.execute(f"INSERT INTO {quote(table)} VALUES (?, ?, ?, ?)", list(row))
            assignments = [
                (ODD, f"CASE WHEN f.sets THEN f.value ELSE t.{quote(ODD)} END"),
                ("version", "f.version + ?"),
            ]
            backend.update_joined(TABLE, assignments, SOURCE, backend.null_safe_equal("t.k", "f.k"), [1000])
        rows: list[tuple[Any, ...]] = backend.execute(f"SELECT * FROM {quote(TABLE)}")
    finally:
        backend.close()
    assert sorted(rows, key=lambda row: row[2]) == [
        ("a", "new a", 1010, "keep a"),
        ("b", "old b", 1020, "keep b"),
        (None, "new null", 1030, "keep null"),
    ]
