"""Legal Spanner names and keys that PostgreSQL or DuckDB cannot hold as given, through
the real consumer against both replicas: 128-character table and column names (PostgreSQL keeps
63 bytes), two long tables that share their first 100 characters, a table without key
columns (``PRIMARY KEY ()``), a column named ``a?b%c`` (PostgreSQL-dialect quoted names;
the placeholders of the replica's SQL must not be found in it), U+0000 in STRING and JSON values
(PostgreSQL cannot store it), two tables whose names differ only in case (one name to
DuckDB, which stops the second) and NULL key values (a primary key forbids them)."""

from __future__ import annotations

from typing import Any

import pytest

from spanner_cdc.consumer.readers import changelog_rows, replica_rows
from spanner_cdc.consumer.sinks.replica.backends import open_backend
from spanner_cdc.consumer.sinks.replica.names import POSTGRES_IDENTIFIER_BYTES, ReplicaNames
from spanner_cdc.consumer.streams.api import StreamReplica
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import ConfigFactory, run_consumer
from testkit.synthetic import BASE_MICROS, ChangeFactory, publish

LONG_TABLE = "T" + "a" * 99 + "1" * 28  # 128 characters, Spanner's longest
TWIN_TABLE = "T" + "a" * 99 + "2" * 28
LONG_COLUMN = "C" + "b" * 127


@pytest.mark.unit
def test_names_that_do_not_fit_are_shortened_apart() -> None:
    postgres, duckdb = ReplicaNames.for_dialect("postgres"), ReplicaNames.for_dialect("duckdb")
    assert postgres.table("Accounts") == "Accounts" and postgres.tombstones("Accounts") == "Accounts$deleted"
    assert duckdb.table(LONG_TABLE) == LONG_TABLE
    shortened = {postgres.table(LONG_TABLE), postgres.table(TWIN_TABLE)}
    assert len(shortened) == 2 and all("~" in name for name in shortened)
    for name in (*shortened, postgres.tombstones(LONG_TABLE), "set$" + postgres.column(LONG_COLUMN)):
        assert len(name.encode()) <= POSTGRES_IDENTIFIER_BYTES
    assert len(postgres.column("Ä" * 60).encode()) <= POSTGRES_IDENTIFIER_BYTES - len("set$")


@pytest.mark.integration
@pytest.mark.spark
def test_long_names_and_keyless_tables_replicate(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    config = configure()
    names = ReplicaNames.for_dialect(config.replica)
    long = ChangeFactory(table=LONG_TABLE, columns=(("Id", "STRING", True), (LONG_COLUMN, "INT64", False)))
    twin = ChangeFactory(table=TWIN_TABLE, columns=(("Id", "STRING", True), (LONG_COLUMN, "INT64", False)))
    single = ChangeFactory(table="Singleton", columns=(("Value", "INT64", False),))
    odd = ChangeFactory(table="Odd", columns=(("Id", "STRING", True), ("a?b%c", "INT64", False)))
    first = [
        *long.events(long.record("INSERT", {"Id": "a"}, {LONG_COLUMN: "1"})),
        *long.events(long.record("INSERT", {"Id": "b"}, {LONG_COLUMN: "2"})),
        *twin.events(twin.record("INSERT", {"Id": "a"}, {LONG_COLUMN: "3"})),
        *single.events(single.record("INSERT", {}, {"Value": "1"})),
        *odd.events(odd.record("INSERT", {"Id": "o"}, {"a?b%c": "7"})),
    ]
    publish(config.kafka_bootstrap, config.topic_prefix, first)
    run_consumer(spark, config)
    stale = long.record("INSERT", {"Id": "b"}, {LONG_COLUMN: "9"}, commit_micros=BASE_MICROS - 5)
    later = [
        *long.events(long.record("UPDATE", {"Id": "a"}, {LONG_COLUMN: "10"})),
        *long.events(long.record("DELETE", {"Id": "b"}, {}, {LONG_COLUMN: "2"})),
        *long.events(stale),  # older than the delete: must not bring b back
        *single.events(single.record("UPDATE", {}, {"Value": "2"})),
        *odd.events(odd.record("UPDATE", {"Id": "o"}, {"a?b%c": "8"})),
    ]
    publish(config.kafka_bootstrap, config.topic_prefix, later)
    run_consumer(spark, config)  # a second run: the first one's tables are found again, not re-created

    column = f'"Id", "{names.column(LONG_COLUMN)}"'
    assert replica_rows(config, LONG_TABLE, column) == [("a", 10)]
    assert replica_rows(config, TWIN_TABLE, column) == [("a", 3)]
    assert replica_rows(config, "Singleton", '"Value"') == [(2,)]
    assert replica_rows(config, "Odd", '"Id", "a?b%c"') == [("o", 8)]
    # replica status names each table by its Spanner name beside the replica's, with renamed columns
    shown = _status(config)
    assert set(shown) == {LONG_TABLE, TWIN_TABLE, "Singleton", "Odd"}
    assert shown[LONG_TABLE].replica_table == names.table(LONG_TABLE)
    assert (shown[LONG_TABLE].rows, shown[TWIN_TABLE].rows) == (1, 1)
    renamed = {LONG_COLUMN: names.column(LONG_COLUMN)} if config.replica == "postgres" else {}
    assert shown[LONG_TABLE].renamed_columns == shown[TWIN_TABLE].renamed_columns == renamed
    assert shown["Odd"].renamed_columns == {} and shown["Odd"].replica_table == "Odd"


@pytest.mark.integration
@pytest.mark.spark
def test_nul_characters_and_names_differing_in_case(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    config = configure()
    upper = ChangeFactory(
        table="Mixed", columns=(("Id", "STRING", True), ("Note", "STRING", False), ("Doc", "JSON", False))
    )
    lower = ChangeFactory(table="mixed", columns=(("Id", "STRING", True), ("note", "STRING", False)))
    nul_json = '{"k":"\\u0000","t":"\\\\u0000"}'  # an escaped U+0000, then the text \u0000
    first = [
        *upper.events(upper.record("INSERT", {"Id": "a\x00"}, {"Note": "x\x00y", "Doc": nul_json})),
        *lower.events(lower.record("INSERT", {"Id": "b"}, {"note": "z"})),
    ]
    publish(config.kafka_bootstrap, config.topic_prefix, first)
    run_consumer(spark, config)
    later = [
        *upper.events(upper.record("UPDATE", {"Id": "a\x00"}, {"Note": "w\x00"})),
        *lower.events(lower.record("UPDATE", {"Id": "b"}, {"note": "zz"})),
    ]
    publish(config.kafka_bootstrap, config.topic_prefix, later)
    run_consumer(spark, config)  # the tables are found again (by DuckDB's comparison of names)

    assert [row[0] for row in changelog_rows(config, "Mixed", '"Note"')] == ["x\x00y", "w\x00"]
    if config.replica == "duckdb":
        # DuckDB takes the names for one, and the topics (and their ACLs) are two: the second
        # table in the batch's order (by name) is stopped, never written into the first.
        assert replica_rows(config, "Mixed", '"Id", "Note", "Doc"') == [("a\x00", "w\x00", nul_json)]
        stopped = _status(config)["mixed"]
        assert (stopped.replica_table, stopped.rows) == (None, None)
        assert stopped.stopped is not None
        assert (
            "2 change(s) not applied: the replica holds table Mixed, and DuckDB takes mixed"
            in stopped.stopped
        )
        assert _status(config)["Mixed"].stopped is None
    else:
        assert replica_rows(config, "Mixed", '"Id", "Note", "Doc"::text') == [
            ("a\ufffd", "w\ufffd", '{"k": "\ufffd", "t": "\\\\u0000"}')
        ]
        assert replica_rows(config, "mixed", '"Id", "note"') == [("b", "zz")]


@pytest.mark.integration
@pytest.mark.spark
def test_null_key_values_are_keys(spark: Any, stack: EmbeddedStack, configure: ConfigFactory) -> None:
    """Spanner takes NULL as a key value like any other (one row per key, NULL equal to NULL). The
    table is created before the first NULL key arrives, as an existing replica's: its key columns
    NOT NULL — a primary key in PostgreSQL, none in DuckDB, whose key index made every commit
    slow."""
    config = configure()
    table = ChangeFactory(
        table="Nullable", columns=(("Id", "STRING", True), ("At", "INT64", True), ("V", "INT64", False))
    )
    runs = [
        [table.record("INSERT", {"Id": "x", "At": "1"}, {"V": "1"})],
        [
            table.record("INSERT", {"Id": None, "At": "1"}, {"V": "2"}),
            table.record("INSERT", {"Id": None, "At": None}, {"V": "3"}),
            table.record("UPDATE", {"Id": None, "At": "1"}, {"V": "4"}),
            table.record("UPDATE", {"Id": "x", "At": "1"}, {"V": "10"}),
        ],
    ]
    deleted = table.record("DELETE", {"Id": None, "At": None}, {})
    stale = table.record(
        "INSERT", {"Id": None, "At": None}, {"V": "9"}, commit_micros=deleted["commit_timestamp"] - 1
    )
    runs.append([deleted, stale, table.record("UPDATE", {"Id": None, "At": "1"}, {"V": "5"})])
    for records in runs:
        publish(config.kafka_bootstrap, config.topic_prefix, table.events(*records))
        run_consumer(spark, config)
        if records is runs[0]:
            assert _key_declaration(config, "Nullable") == (config.replica == "postgres", ["NO", "NO", "YES"])

    rows = replica_rows(config, "Nullable", '"Id", "At", "V"')
    assert sorted(rows, key=repr) == sorted([("x", 1, 10), (None, 1, 5)], key=repr)


def _status(config: Any) -> dict[str, Any]:
    """``replica status``'s tables by Spanner name."""
    replica = StreamReplica(open_backend(config.replica, config.duckdb_path, config.postgres_dsn))
    try:
        return {t.source: t for t in replica.status().tables}
    finally:
        replica.close()


def _key_declaration(config: Any, table: str) -> tuple[bool, list[str]]:
    """(whether ``table`` has a PRIMARY KEY, whether each of its payload columns takes NULL)."""
    backend = open_backend(config.replica, config.duckdb_path, config.postgres_dsn)
    try:
        declared = backend.execute(
            "SELECT count(*) FROM information_schema.table_constraints "
            "WHERE table_name = ? AND constraint_type = 'PRIMARY KEY'",
            [table],
        )
        nullable = backend.execute(
            "SELECT is_nullable FROM information_schema.columns WHERE table_name = ? "
            "AND column_name IN ('Id', 'At', 'V') ORDER BY ordinal_position",
            [table],
        )
    finally:
        backend.close()
    return declared[0][0] == 1, [row[0] for row in nullable]
