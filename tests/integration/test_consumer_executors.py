"""The consumer's per-event work runs in Spark's executor tasks, not on the driver."""

from __future__ import annotations

import json
import re
import tracemalloc
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from spanner_cdc.consumer.batch import ContextBroadcast
from spanner_cdc.consumer.config import ConsumerConfig
from spanner_cdc.consumer.decode.gate import DecodeContext
from spanner_cdc.consumer.errors import ConsumerError
from spanner_cdc.consumer.readers import changelog_rows, replica_rows
from spanner_cdc.consumer.sinks.replica.cut import PENDING
from spanner_cdc.consumer.sinks.replica.stage.loaded import (
    APPLICATION_NAME,
    STAGED_TABLE_PREFIX,
    query_prefix,
)
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import (
    committed_batches,
    consumer_config,
    fresh_postgres_database,
    on_disk,
    run_consumer,
    unique_prefix,
)
from testkit.synthetic import ChangeFactory, final_rows, publish, random_history

pytestmark = [pytest.mark.integration, pytest.mark.spark]

#: 24,500 messages with the duplicates: one batch, read, decoded and written by one task per
#: Kafka partition (Spark's source; ``minPartitions``, the session's slots, splits them further
#: only where there are more slots than partitions).
CHANGES = 24_000
#: The event topics' partitions (testkit.synthetic.publish).
TOPIC_PARTITIONS = 3


def test_decoding_and_the_changelog_run_in_one_task_per_kafka_partition_of_the_batch(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    config = consumer_config(
        stack.endpoint("kafka"), unique_prefix("X"), tmp_path / "out", sinks=["changelog"]
    )
    events = random_history(ChangeFactory(), CHANGES, keys=600)
    publish(config.kafka_bootstrap, config.topic_prefix, events + events[:500])  # and duplicates

    metrics = run_consumer(spark, config)

    files = sorted((on_disk(config).changelog / "object=Accounts").glob("*/*.parquet"))
    parts = {re.fullmatch(r"batch-(\d+)-part-(\d+)\.parquet", f.name) for f in files}
    assert None not in parts, [f.name for f in files]
    batch_parts = {(m.group(1), m.group(2)) for m in parts if m}
    tasks = max(TOPIC_PARTITIONS, spark.sparkContext.defaultParallelism)
    assert len({part for _, part in batch_parts}) == tasks, f"written by the tasks {sorted(batch_parts)}"
    uuids = [row[0] for row in changelog_rows(config, "Accounts", '"envelope$uuid"')]
    assert uuids == [e.value["uuid"] for e in events]
    assert metrics.registry.get_sample_value("spanner_cdc_consumer_duplicates_total") == 500
    with duckdb.connect() as files_db:
        for file in files:  # each task's file in sort_keys order
            rows = files_db.execute(f"SELECT \"envelope$sort_keys\" FROM read_parquet('{file}')").fetchall()
            keys = [tuple(sort_keys.values()) for (sort_keys,) in rows]
            assert keys == sorted(keys)


def test_a_small_batch_is_read_in_as_many_tasks_as_the_session_has_slots(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """Batches of 300 offsets over 3 Kafka partitions: each read by at most the session's 2 task
    slots (its changelog files, one per task, say so) — all but the first, whose planned range
    the offsets log cannot tell (no batch before it), read one task per partition."""
    config = consumer_config(
        stack.endpoint("kafka"),
        unique_prefix("S"),
        tmp_path / "out",
        sinks=["changelog"],
        max_events_per_batch=300,
    )
    events = random_history(ChangeFactory(), 1_200, keys=300)
    publish(config.kafka_bootstrap, config.topic_prefix, events)

    run_consumer(spark, config)

    tasks: dict[int, set[str]] = {}
    for file in (on_disk(config).changelog / "object=Accounts").glob("*/*.parquet"):
        found = re.fullmatch(r"batch-(\d+)-part-(\d+)\.parquet", file.name)
        assert found, file.name
        tasks.setdefault(int(found.group(1)), set()).add(found.group(2))
    slots = spark.sparkContext.defaultParallelism
    assert slots < TOPIC_PARTITIONS
    assert len(tasks.pop(0)) == TOPIC_PARTITIONS
    assert len(tasks) >= 3, tasks
    assert all(len(parts) <= slots for parts in tasks.values()), tasks
    uuids = [row[0] for row in changelog_rows(config, "Accounts", '"envelope$uuid"')]
    assert uuids == [e.value["uuid"] for e in events]


#: One batch of this many changes: about 60,000 events of 300-400 bytes. Decoded on the driver,
#: as before the move to the executors, they were Python dicts of roughly 2 KB each — well over
#: 100 MB of the driver's heap for one batch.
LARGE_BATCH = 60_000
#: What the driver's Python heap may grow by while it runs that batch: its outline is Arrow
#: (outside the Python heap), the replica's stage rows are Arrow files the tasks wrote, and
#: nothing per event is held as Python objects but the commit times of the replica's observers.
DRIVER_HEAP_BOUND = 24 * 2**20


def test_a_large_batch_passes_the_driver_by(spark: Any, stack: EmbeddedStack, tmp_path: Path) -> None:
    """One 60,000-change batch into the changelog and the DuckDB replica (whole transactions):
    every change written, by several tasks, while the driver's Python heap (tracemalloc: every
    allocation of the driver process's interpreter) grows by less than 24 MiB. Measured on the
    2-core machine: changelog alone 7.8 MiB; with the replica fed by the driver, as before its
    stage rows came from the tasks, 239.6 MiB."""
    config = consumer_config(
        stack.endpoint("kafka"),
        unique_prefix("L"),
        tmp_path / "out",
        sinks=["changelog", "replica"],
        max_events_per_batch=LARGE_BATCH + 1000,
    )
    factory, warm_up = warmed_up(spark, config)
    events = random_history(factory, LARGE_BATCH, keys=5000, seed=2)
    publish(config.kafka_bootstrap, config.topic_prefix, events)
    committed = committed_batches(config)

    peak = driver_heap_growth(spark, config)

    assert committed_batches(config) == committed + 1, "not one batch"
    uuids = {row[0] for row in changelog_rows(config, "Accounts", '"envelope$uuid"')}
    assert {e.value["uuid"] for e in events} <= uuids and len(uuids) == LARGE_BATCH + 300
    assert sorted(replica_rows(config, "Accounts", '"Id", "Balance", "Note"')) == final_rows(warm_up + events)
    assert not any(on_disk(config).replica_staging.iterdir()), "the batch's staged rows were left behind"
    assert peak < DRIVER_HEAP_BOUND, f"the driver's heap grew by {peak / 2**20:.1f} MiB"


def warmed_up(spark: Any, config: ConsumerConfig) -> tuple[ChangeFactory, list[Any]]:
    """300 changes consumed first: the session's workers and the query's first batch, warm."""
    factory = ChangeFactory()
    warm_up = random_history(factory, 300, seed=1)
    publish(config.kafka_bootstrap, config.topic_prefix, warm_up)
    run_consumer(spark, config)
    return factory, warm_up


def driver_heap_growth(spark: Any, config: ConsumerConfig) -> int:
    """One consumer run; how far the driver's Python heap grew meanwhile (tracemalloc's peak:
    every allocation of the driver process's interpreter)."""
    tracemalloc.start()
    try:
        run_consumer(spark, config)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_batch_context_reaches_the_executors_once_until_the_driver_learns_something(spark: Any) -> None:
    """The writer schemas' texts travel as one broadcast, reused by every batch until a new
    one is learnt."""
    sharing = ContextBroadcast()
    key = {"name": "Id", "type": {"code": "INT64"}, "is_primary_key": True, "ordinal_position": 1}
    version = TableSchema.from_column_types("T", [key])  # its converters need cloudpickle
    known = DecodeContext(Topics("P"), 1, {1: "schema one"}, json_versions={("T", "k"): version})
    sent = sharing.share(spark.sparkContext, known)
    assert sharing.share(spark.sparkContext, replace(known, now_micros=2)) is sent  # the next batch
    learnt = replace(known, now_micros=3, schemas={1: "schema one", 2: "schema two"})
    resent = sharing.share(spark.sparkContext, learnt)
    assert resent is not sent

    def read(_: int) -> tuple[list[str], int | None]:
        version = resent.value.json_versions[("T", "k")]
        return sorted(resent.value.schemas.values()), version.converters["Id"]("42")

    read_by_tasks = spark.range(4, numPartitions=4).rdd.map(read).collect()
    assert read_by_tasks == [(["schema one", "schema two"], 42)] * 4  # from the broadcast, not the closure
    assert resent.value.now_micros == 0  # each task is given its batch's time apart


#: Held events released by one batch: far more than the driver reads again itself
#: (consumer.batch.DRIVER_READS_HELD).
HELD = 20_000
#: What the driver's Python heap may grow by while that batch runs: the held messages come from
#: the replica as Arrow, the tasks stage their rows.
HELD_HEAP_BOUND = 12 * 2**20


def test_held_events_are_read_again_by_tasks_when_the_cut_passes_them(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """20,000 events arrive before any watermark lets them through (as in a steady stream, where
    most events arrive before their watermark): all are held. The batch that brings the watermark
    applies them from their held messages, read again by Spark tasks: the replica is right, and the
    driver's Python heap grows by less than the bound above. Measured: 4.8 MiB; 68.4 MiB with the
    held messages read again on the driver, as before; 81.2 MiB when, also as before, they came
    from the replica as Python rows."""
    config = consumer_config(stack.endpoint("kafka"), unique_prefix("W"), tmp_path / "out", sinks=["replica"])
    factory, warm_up = warmed_up(spark, config)
    events = random_history(factory, HELD, keys=2000, seed=3)
    publish(config.kafka_bootstrap, config.topic_prefix, events, watermark=False)
    run_consumer(spark, config)
    assert replica_rows(config, PENDING, "count(*)") == [(HELD,)]
    newest = max(e.value["source_metadata"]["commit_timestamp"] for e in events)
    publish(config.kafka_bootstrap, config.topic_prefix, [], watermark=newest)

    peak = driver_heap_growth(spark, config)

    assert replica_rows(config, PENDING, "count(*)") == [(0,)]
    assert sorted(replica_rows(config, "Accounts", '"Id", "Balance", "Note"')) == final_rows(warm_up + events)
    assert not any(on_disk(config).replica_staging.iterdir()), "the batch's staged rows were left behind"
    assert peak < HELD_HEAP_BOUND, f"the driver's heap grew by {peak / 2**20:.1f} MiB"


#: Events held by the first run and applied by the second: more than the driver reads itself
#: (batch.DRIVER_READS_HELD), so Spark tasks read them again.
HELD_IN_POSTGRES = 12_000
#: Logs every table created in the test's database, and by whose connection.
CREATED_TABLES_LOG = """
CREATE TABLE created_tables (name TEXT NOT NULL, application TEXT NOT NULL);
CREATE FUNCTION log_created() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE created record;
BEGIN
  FOR created IN SELECT object_identity FROM pg_event_trigger_ddl_commands()
                 WHERE command_tag = 'CREATE TABLE' LOOP
    INSERT INTO created_tables VALUES (created.object_identity, current_setting('application_name'));
  END LOOP;
END $$;
CREATE EVENT TRIGGER log_created ON ddl_command_end EXECUTE FUNCTION log_created();
"""


def test_the_postgresql_replica_is_loaded_by_the_tasks(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """With a PostgreSQL replica the tasks that built the stage rows load them, each on its
    own connection (an event trigger logs every table created, and by which connection): the
    batch's own rows and held rows read again by tasks. The replica is right, and no staged
    table outlives its batch."""
    dsn = fresh_postgres_database(stack.endpoint("postgres"))
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(CREATED_TABLES_LOG)
    config = consumer_config(
        stack.endpoint("kafka"), unique_prefix("G"), tmp_path / "out", "postgres", dsn, sinks=["replica"]
    )
    factory, warm_up = warmed_up(spark, config)
    held = random_history(factory, HELD_IN_POSTGRES, keys=2000, seed=4)
    publish(config.kafka_bootstrap, config.topic_prefix, held, watermark=False)
    run_consumer(spark, config)
    assert replica_rows(config, PENDING, "count(*)") == [(HELD_IN_POSTGRES,)]
    fresh = random_history(factory, 10_000, keys=2000, seed=5)  # each task's part over TASKS_LOAD_FROM_ROWS
    publish(config.kafka_bootstrap, config.topic_prefix, fresh + held[:300])  # and duplicates

    run_consumer(spark, config)

    assert sorted(replica_rows(config, "Accounts", '"Id", "Balance", "Note"')) == final_rows(
        warm_up + held + fresh
    )
    assert replica_rows(config, PENDING, "count(*)") == [(0,)]
    with psycopg.connect(dsn) as db:
        created = db.execute(
            "SELECT name, application FROM created_tables WHERE name LIKE %s", [f"%{STAGED_TABLE_PREFIX}%"]
        ).fetchall()
        left = db.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'cdc$staged$%'").fetchall()
    loaders = {application for _, application in created}
    assert {f"{APPLICATION_NAME} {task}" for task in range(2)} <= loaders, loaders
    jobs = {name.rsplit("$", 3)[1] for name, _ in created}
    assert {"b", "h0"} <= jobs, "the batch's rows and the held ones re-read, both loaded by tasks"
    assert left == [(0,)], "a staged table outlived its batch"


def test_tasks_that_cannot_reach_the_postgresql_replica_fail_the_batch_in_one_line(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """The replica's role takes one connection, the driver's: the tasks cannot connect. The
    query stops with one line saying so and commits nothing of the batch; the same consumer with
    ``--postgres-staging driver`` then writes it."""
    dsn = fresh_postgres_database(stack.endpoint("postgres"))
    role = f"one_connection_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{role}' CONNECTION LIMIT 1")
        db.execute(f"ALTER DATABASE {conninfo_to_dict(dsn)['dbname']} OWNER TO {role}")
    limited = make_conninfo(dsn, user=role, password=role)
    config = consumer_config(
        stack.endpoint("kafka"), unique_prefix("C"), tmp_path / "out", "postgres", limited, sinks=["replica"]
    )
    # Each task's part (one of the topic's three partitions) over TASKS_LOAD_FROM_ROWS.
    events = random_history(ChangeFactory(), 15_000, keys=500)
    publish(config.kafka_bootstrap, config.topic_prefix, events)

    with pytest.raises(ConsumerError) as failed:
        run_consumer(spark, config)

    assert "a task could not load its stage rows into the PostgreSQL replica" in str(failed.value)
    assert "too many connections" in str(failed.value)
    assert len(str(failed.value).splitlines()) == 1
    with psycopg.connect(dsn) as db:
        assert db.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'Accounts'").fetchall() == [(0,)]
    run_consumer(spark, replace(config, postgres_staging="driver"))
    assert sorted(replica_rows(config, "Accounts", '"Id", "Balance", "Note"')) == final_rows(events)


def test_tables_the_tasks_loaded_for_a_failed_batch_go_at_the_next_start(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """The replica's transaction fails after the tasks loaded the batch's stage rows (a view
    stands where the replica's table goes): the tables stay, as after a crash; so does one of a
    batch that will not be replayed (as a late speculative task attempt would leave). The next
    start drops every table of the query, the replay loads its batch again, and the replica is
    right."""
    dsn = fresh_postgres_database(stack.endpoint("postgres"))
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute('CREATE VIEW "Accounts" AS SELECT 1 AS x')
    config = consumer_config(
        stack.endpoint("kafka"), unique_prefix("F"), tmp_path / "out", "postgres", dsn, sinks=["replica"]
    )
    # Each task's part (one of the topic's three partitions) over TASKS_LOAD_FROM_ROWS.
    events = random_history(ChangeFactory(), 15_000, keys=500)
    publish(config.kafka_bootstrap, config.topic_prefix, events)

    with pytest.raises(ConsumerError):
        run_consumer(spark, config)

    staged = "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'cdc$staged$%'"
    query_id = json.loads((on_disk(config).spark_checkpoint / "metadata").read_text())["id"]
    with psycopg.connect(dsn, autocommit=True) as db:
        assert db.execute(staged).fetchall() != [(0,)], "the tasks loaded nothing"
        db.execute('DROP VIEW "Accounts"')
        db.execute(f'CREATE TABLE "{query_prefix(query_id)}999$b$0$0" (x INTEGER)')
    run_consumer(spark, config)
    assert sorted(replica_rows(config, "Accounts", '"Id", "Balance", "Note"')) == final_rows(events)
    with psycopg.connect(dsn) as db:
        assert db.execute(staged).fetchall() == [(0,)]
