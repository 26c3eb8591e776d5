"""Streams over the replica, through the broker, Spark and both replica databases.

Changes go through the producer's own sender to a real broker, the consumer runs on the test's
Spark session (each step waits until the replica's cut passed its commit: ``run_consumer``
drains Kafka), and streams are read from the replica database as a user's process would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from google.cloud.spanner_v1 import KeySet

from spanner_cdc.consumer.config import ConsumerConfig
from spanner_cdc.consumer.errors import ConsumerError
from spanner_cdc.consumer.main import ConsumerJob, drain
from spanner_cdc.consumer.readers import changelog_rows
from spanner_cdc.consumer.sinks.replica.backends import Selected, open_backend
from spanner_cdc.consumer.spark.graceful_stop import StopRequest
from spanner_cdc.consumer.streams.api import StreamReplica
from spanner_cdc.consumer.streams.catalog import StreamError
from spanner_cdc.schemas.timestamps import MICROS_PER_SECOND, micros_from_datetime
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import ConfigFactory, consume_command, consumer_config, run_consumer, unique_prefix
from testkit.spanner_db import create_database
from testkit.synthetic import ChangeFactory, publish, random_history
from tests.support.command_line import spanner_cdc
from tests.support.produce_process import run_producer_while

pytestmark = [pytest.mark.integration, pytest.mark.spark]
COLUMNS = (("id", "INT64", True), ("a", "INT64", False))
HOUR = 3600 * MICROS_PER_SECOND


def replica(config: ConsumerConfig) -> StreamReplica:
    return StreamReplica(open_backend(config.replica, config.duckdb_path, config.postgres_dsn))


def apply(spark: Any, config: ConsumerConfig, table: ChangeFactory, *records: dict[str, Any]) -> None:
    """``records`` as one transaction, in the replica once this returns."""
    publish(config.kafka_bootstrap, config.topic_prefix, table.events(*table.transaction(*records)))
    run_consumer(spark, config)


def values(selected: Selected, *columns: str) -> list[tuple[Any, ...]]:
    index = [selected.names.index(c) for c in columns]
    return [tuple(row[i] for i in index) for row in selected.rows]


def changes(selected: Selected) -> list[tuple[Any, ...]]:
    return values(selected, "a", "change$action", "change$is_update")


def row_ids(selected: Selected) -> list[str]:
    return [row_id for (row_id,) in values(selected, "change$row_id")]


def test_databend_s_documented_stream_session_step_by_step(spark: Any, configure: ConfigFactory) -> None:
    config, table = configure(), ChangeFactory("T", COLUMNS)
    streams = replica(config)
    try:
        streams.create("s_standard", on="T", mode="standard")
        streams.create("s_append_only", on="T", mode="append_only")

        apply(
            spark,
            config,
            table,
            table.record("INSERT", {"id": 1}, {"a": 2}),
            table.record("INSERT", {"id": 2}, {"a": 3}),
        )
        for name in ("s_standard", "s_append_only"):
            read = streams.read(name)
            assert changes(read) == [(2, "INSERT", False), (3, "INSERT", False)]
            assert len(set(row_ids(read))) == 2
        three = row_ids(streams.read("s_standard"))[1]

        apply(spark, config, table, table.record("UPDATE", {"id": 1}, {"a": 4}))
        for name in ("s_standard", "s_append_only"):
            assert changes(streams.read(name)) == [(4, "INSERT", False), (3, "INSERT", False)]

        apply(spark, config, table, table.record("DELETE", {"id": 1}))
        for name in ("s_standard", "s_append_only"):
            assert changes(streams.read(name)) == [(3, "INSERT", False)]
            assert row_ids(streams.read(name)) == [three]

        assert streams.consume("s_standard", into="t_consume_standard", columns=["a"]) == 1
        assert streams.consume("s_append_only", into="t_consume_append_only", columns=["a"]) == 1
        for target in ("t_consume_standard", "t_consume_append_only"):
            assert streams.backend.execute(f'SELECT "a" FROM {target}') == [(3,)]
        assert streams.read("s_standard").rows == streams.read("s_append_only").rows == []

        apply(spark, config, table, table.record("UPDATE", {"id": 2}, {"a": 4}))
        read = streams.read("s_standard")
        assert changes(read) == [(3, "DELETE", True), (4, "INSERT", True)]
        assert row_ids(read) == [three, three]
        assert streams.read("s_append_only").rows == []

        apply(spark, config, table, table.record("DELETE", {"id": 2}))
        assert changes(streams.read("s_standard")) == [(3, "DELETE", False)]
        assert streams.read("s_append_only").rows == []
    finally:
        streams.close()


def test_insert_only_keeps_inserts_of_rows_deleted_since(spark: Any, configure: ConfigFactory) -> None:
    """Snowflake's example: 10 rows inserted, 5 of them deleted before the stream is consumed."""
    config, table = configure(), ChangeFactory("T", COLUMNS)
    streams = replica(config)
    try:
        for mode in ("standard", "append_only", "insert_only"):
            streams.create(mode, on="T", mode=mode)
        apply(spark, config, table, *(table.record("INSERT", {"id": i}, {"a": i}) for i in range(10)))
        apply(spark, config, table, *(table.record("DELETE", {"id": i}) for i in range(5)))
        assert len(streams.read("insert_only").rows) == 10
        assert sorted(values(streams.read("append_only"), "a")) == [(i,) for i in range(5, 10)]
        assert sorted(values(streams.read("standard"), "a")) == [(i,) for i in range(5, 10)]
    finally:
        streams.close()


def test_a_failed_consume_leaves_the_stream_and_of_two_racing_one_wins(
    spark: Any, configure: ConfigFactory
) -> None:
    config, table = configure(), ChangeFactory("T", COLUMNS)
    streams, other = replica(config), replica(config)
    try:
        streams.create("s", on="T")
        apply(spark, config, table, table.record("INSERT", {"id": 1}, {"a": 1}))
        streams.backend.execute("CREATE TABLE target (a BIGINT PRIMARY KEY)")
        streams.backend.execute("INSERT INTO target VALUES (1)")
        with pytest.raises(ConsumerError):
            streams.consume("s", into="target", columns=["a"])
        assert changes(streams.read("s")) == [(1, "INSERT", False)], "the failed consume moved the offset"

        with pytest.raises(StreamError, match="another transaction"), streams.consuming("s") as first:
            assert len(first.rows.rows) == 1
            assert other.consume("s", into="winner", columns=["a"]) == 1
        assert streams.backend.execute("SELECT a FROM winner") == [(1,)]
        assert streams.read("s").rows == []
    finally:
        streams.close()
        other.close()


def test_a_consume_reads_one_cut_while_the_replica_advances(spark: Any, configure: ConfigFactory) -> None:
    config, table = configure(), ChangeFactory("T", COLUMNS)
    streams = replica(config)
    try:
        streams.create("s", on="T")
        apply(spark, config, table, table.record("INSERT", {"id": 1}, {"a": 1}))
        with streams.consuming("s") as consumption:
            apply(spark, config, table, table.record("INSERT", {"id": 2}, {"a": 2}))
            again = consumption.execute(f"SELECT a FROM {consumption.table}")
            assert again == [(1,)] and len(consumption.rows.rows) == 1
        assert changes(streams.read("s")) == [(2, "INSERT", False)], (
            "the consume skipped or repeated a change"
        )
    finally:
        streams.close()


def test_changes_between_two_points_equal_a_stream_between_them(spark: Any, configure: ConfigFactory) -> None:
    config, table = configure(), ChangeFactory("T", COLUMNS)
    streams = replica(config)
    try:
        apply(
            spark,
            config,
            table,
            table.record("INSERT", {"id": 1}, {"a": 1}),
            table.record("INSERT", {"id": 2}, {"a": 2}),
        )
        start = streams.status().cut
        assert start is not None
        streams.create("s", on="T")
        apply(
            spark,
            config,
            table,
            table.record("UPDATE", {"id": 1}, {"a": 10}),
            table.record("DELETE", {"id": 2}),
        )
        apply(spark, config, table, table.record("INSERT", {"id": 3}, {"a": 3}))
        middle = streams.status().cut
        assert middle is not None
        read = streams.read("s")
        from_start = streams.changes("T", micros_from_datetime(start))
        assert from_start.rows == read.rows and len(read.rows) == 4
        apply(spark, config, table, table.record("DELETE", {"id": 3}))
        assert (
            streams.changes("T", micros_from_datetime(start), micros_from_datetime(middle)).rows == read.rows
        )
        assert changes(streams.changes("T", micros_from_datetime(middle))) == [(3, "DELETE", False)]
    finally:
        streams.close()


def test_a_stream_past_the_retention_is_stale(spark: Any, configure: ConfigFactory) -> None:
    config, table = configure(history_retention_hours=1), ChangeFactory("T", COLUMNS)
    streams = replica(config)
    try:
        first = table.record("INSERT", {"id": 1}, {"a": 1})
        apply(spark, config, table, first)
        streams.create("s", on="T")
        apply(spark, config, table, table.record("UPDATE", {"id": 1}, {"a": 2}))
        assert changes(streams.read("s")) == [(1, "DELETE", True), (2, "INSERT", True)]
        later = int(first["commit_timestamp"]) + 2 * HOUR
        apply(spark, config, table, table.record("UPDATE", {"id": 1}, {"a": 3}, commit_micros=later))
        (state,) = streams.show()
        assert state.stale and state.stale_after is not None
        with pytest.raises(StreamError, match="stale"):
            streams.read("s")
        streams.drop("s")
        streams.create("s", on="T")
        assert streams.read("s").rows == [] and not streams.show()[0].stale
    finally:
        streams.close()


def test_a_table_created_again_with_another_key_starts_over(spark: Any, configure: ConfigFactory) -> None:
    """Spanner table T dropped and created again with another primary key (id → code): the old
    generation's last change still lands in the old table, then the table starts over with the
    new generation's rows only; a late event of the old generation is skipped; a stream created
    before is invalid, one created after works; CHANGES from before the re-creation is refused."""
    config, old = configure(), ChangeFactory("T", COLUMNS)
    new = ChangeFactory("T", (("code", "STRING", True), ("a", "INT64", False)))
    streams = replica(config)
    try:
        apply(
            spark,
            config,
            old,
            old.record("INSERT", {"id": 1}, {"a": 1}),
            old.record("INSERT", {"id": 2}, {"a": 2}),
        )
        streams.create("before", on="T")
        cut = streams.status().cut
        assert cut is not None
        before_micros = micros_from_datetime(cut)
        last_old = old.record("UPDATE", {"id": 1}, {"a": 10})
        first_new = new.record("INSERT", {"code": "x"}, {"a": 5})
        publish(config.kafka_bootstrap, config.topic_prefix, [*old.events(last_old), *new.events(first_new)])
        run_consumer(spark, config)
        late = old.record("INSERT", {"id": 3}, {"a": 3}, commit_micros=int(last_old["commit_timestamp"]) + 1)
        publish(config.kafka_bootstrap, config.topic_prefix, old.events(late))
        run_consumer(spark, config)

        with streams.backend.snapshot_transaction():
            assert streams.backend.execute('SELECT "code", "a" FROM "T"') == [("x", 5)]
        assert {t.source: t.rows for t in streams.status().tables} == {"T": 1}
        (state,) = streams.show()
        assert "dropped and created again" in state.invalid_reason and "(code)" in state.invalid_reason
        for attempt in (lambda: streams.read("before"), lambda: streams.has_data("before")):
            with pytest.raises(StreamError, match="drop the stream and create it again"):
                attempt()
        with pytest.raises(StreamError, match="start after that time"):
            streams.changes("T", before_micros)
        streams.create("after", on="T")
        apply(spark, config, new, new.record("INSERT", {"code": "y"}, {"a": 6}))
        assert values(streams.read("after"), "code", "a", "change$action") == [("y", 6, "INSERT")]
        # the changelog is the arrival log: every event of both generations, the late one included
        assert changelog_rows(config, "T", '"a"') == [(1,), (2,), (10,), (3,), (5,), (6,)]
    finally:
        streams.close()


@pytest.mark.parametrize(
    ("dropped", "running"),
    [
        (("T", "T$deleted"), False),
        (("T", "T$deleted", "T$history", "T$inserts"), False),
        (("T", "T$deleted"), True),
    ],
    ids=["table", "all-four", "table-while-running"],
)
def test_a_table_whose_replica_tables_were_dropped_by_hand_starts_over(
    spark: Any, configure: ConfigFactory, dropped: tuple[str, ...], running: bool
) -> None:
    """The way docs/consumer.md gives to start a table over (its replica tables dropped, the
    consumer stopped): the next batch creates them again with its rows only — the history and
    inserts left of the tables before dropped too, when they were not —, a stream created before
    is invalid (it would read the new rows against the old tables' history), one created after
    works. Before, that stream stayed valid and read the new rows as inserts, with no delete of the
    rows there at its offset (its state there came from tables that no longer held it).
    ``running``: dropped between two batches of one consumer, which knew the tables (before, its
    next batch failed on a table it thought it had, and only a restart started the table over)."""
    config, table = configure(), ChangeFactory("T", COLUMNS)
    streams = replica(config)
    job = ConsumerJob.open(config) if running else None

    def step(*records: dict[str, Any]) -> None:
        if job is None:
            apply(spark, config, table, *records)
            return
        publish(config.kafka_bootstrap, config.topic_prefix, table.events(*table.transaction(*records)))
        drain(job, spark, StopRequest())

    try:
        step(*(table.record("INSERT", {"id": i}, {"a": i}) for i in (1, 2)))
        step(table.record("UPDATE", {"id": 1}, {"a": 10}))
        streams.create("before", on="T")
        with streams.backend.transaction():
            for name in dropped:
                streams.backend.execute(f'DROP TABLE "{name}"')

        step(table.record("INSERT", {"id": 3}, {"a": 3}))

        with streams.backend.snapshot_transaction():
            for name in ("T", "T$inserts"):
                assert streams.backend.execute(f'SELECT "id", "a" FROM "{name}"') == [(3, 3)], name
            assert streams.backend.execute('SELECT count(*) FROM "T$history"') == [(0,)]
        (state,) = streams.show()
        assert "started over in the replica" in state.invalid_reason
        with pytest.raises(StreamError, match="drop the stream and create it again"):
            streams.read("before")
        streams.create("after", on="T")
        step(table.record("UPDATE", {"id": 3}, {"a": 4}))
        assert changes(streams.read("after")) == [(3, "DELETE", True), (4, "INSERT", True)]
    finally:
        if job is not None:
            job.close()
        streams.close()


def test_a_consume_killed_midway_writes_nothing_and_the_next_writes_once(
    spark: Any, configure: ConfigFactory
) -> None:
    config, table = configure(), ChangeFactory("T", COLUMNS)
    with contextlib.closing(replica(config)) as streams:
        streams.create("s", on="T")
    apply(spark, config, table, *(table.record("INSERT", {"id": i}, {"a": i}) for i in range(3)))
    where = (config.replica, str(config.duckdb_path), config.postgres_dsn)
    script = f"""
import time
from pathlib import Path
from spanner_cdc.consumer.sinks.replica.backends import open_backend
from spanner_cdc.consumer.streams.api import StreamReplica
replica, path, dsn = {where!r}
streams = StreamReplica(open_backend(replica, Path(path), dsn))
with streams.consuming("s") as delta:
    delta.execute(f"CREATE TABLE target AS SELECT a FROM {{delta.table}}")
    print("inside", flush=True)
    time.sleep(600)
"""
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "inside"
    finally:
        process.kill()
        process.wait(timeout=60)
    with contextlib.closing(replica(config)) as streams:
        assert len(streams.read("s").rows) == 3, "the killed consume moved the offset"
        assert streams.consume("s", into="target", columns=["a"]) == 3
        assert sorted(streams.backend.execute("SELECT a FROM target")) == [(0,), (1,), (2,)]
        assert streams.read("s").rows == []


@pytest.mark.parametrize("configure", ["duckdb"], indirect=True)
def test_the_command_line_works_while_the_consumer_runs_on_the_duckdb_file(
    configure: ConfigFactory, tmp_path: Path
) -> None:
    config, table = configure(), ChangeFactory("T", COLUMNS)
    where = ["--replica", "duckdb", "--output-dir", str(config.output_dir)]

    def cli(*args: str) -> str:
        done = spanner_cdc(*args, *where)
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        return done.stdout

    cli("stream", "create", "s", "--on", "T", "--mode", "standard")
    # A running `spanner-cdc consume` busy with 1,000 changes of another table after T's, in
    # batches of 150: the commands take turns with its batches for the DuckDB file. T's row is in
    # the replica once the consumer read the watermark after the last of them.
    kafka, prefix = config.kafka_bootstrap, config.topic_prefix
    publish(
        kafka,
        prefix,
        [*table.events(table.record("INSERT", {"id": 1}, {"a": 1})), *random_history(ChangeFactory(), 1000)],
    )
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    log = tmp_path / "consumer.log"
    with log.open("w") as output:
        consumer = subprocess.Popen(consume_command(config), env=env, stdout=output, stderr=output)
    try:
        deadline = time.monotonic() + 300
        while "T" not in cli("replica", "status", "--format", "csv"):
            assert consumer.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
        rows = [json.loads(line) for line in cli("stream", "read", "s", "--format", "json").splitlines()]
        assert [(r["a"], r["change$action"]) for r in rows] == [(1, "INSERT")]
        assert cli("stream", "has-data", "s").strip() == "true"
        assert consumer.poll() is None, "the consumer stopped while the commands ran"
    finally:
        consumer.send_signal(signal.SIGTERM)
        consumer.wait(120)
    assert consumer.returncode == 0, log.read_text()[-2000:]
    held = duckdb.connect(str(config.duckdb_path))  # another process holds it, for 2 s
    threading.Timer(2.0, held.close).start()
    assert "consumed 1 row" in cli("stream", "consume", "s", "--into", "copied")
    assert cli("stream", "has-data", "s").strip() == "false"
    status_lines = cli("replica", "status", "--format", "json").splitlines()
    assert json.loads(status_lines[0])["consistent_cut"]
    assert {r["table"]: r["rows"] for r in map(json.loads, status_lines)}["T"] == 1
    shown = cli("stream", "show", "--format", "csv").splitlines()
    assert shown[0].startswith("created_on,name,table_on") and ",s,T," in shown[1]
    refused = spanner_cdc("stream", "consume", "s", "--into", "T$deleted", *where)
    assert (
        refused.returncode == 1
        and refused.stderr.count("\n") == 1
        and "not one the replica" in refused.stderr
    )
    cli("stream", "drop", "s")


def test_databend_s_documented_stream_session_from_spanner(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """Databend's documented standard-stream steps as a user runs them: SQL-ish writes to Spanner, the
    producer running, each step waiting until the replica's cut passes the write's commit."""
    database = create_database(
        stack.endpoint("spanner"),
        [
            "CREATE TABLE T (id INT64 NOT NULL, a INT64) PRIMARY KEY (id)",
            "CREATE CHANGE STREAM Bank FOR T",  # the name the producer process helper reads
        ],
    )
    prefix = unique_prefix("Bank")
    config = consumer_config(stack.endpoint("kafka"), prefix, tmp_path / "out")
    seen: list[list[tuple[Any, ...]]] = []

    def write(mutate: Callable[[Any], None]) -> None:
        with database.batch() as batch:
            mutate(batch)
        commit = micros_from_datetime(batch.committed)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            run_consumer(spark, config)
            with contextlib.closing(replica(config)) as streams:
                cut = streams.status().cut
                if cut is not None and micros_from_datetime(cut) >= commit:
                    seen.append(changes(streams.read("s")))
                    return
            time.sleep(0.5)
        raise AssertionError("the replica's cut did not pass the write within 120 s")

    def session() -> None:
        with contextlib.closing(replica(config)) as streams:
            streams.create("s", on="T", mode="standard")
        write(lambda b: b.insert("T", columns=["id", "a"], values=[[1, 2], [2, 3]]))
        write(lambda b: b.update("T", columns=["id", "a"], values=[[1, 4]]))
        write(lambda b: b.delete("T", KeySet(keys=[[1]])))  # type: ignore[no-untyped-call]
        with contextlib.closing(replica(config)) as streams:
            assert streams.consume("s", into="t_consume_standard", columns=["a"]) == 1
        write(lambda b: b.update("T", columns=["id", "a"], values=[[2, 4]]))
        write(lambda b: b.delete("T", KeySet(keys=[[2]])))  # type: ignore[no-untyped-call]

    run_producer_while(stack, database, prefix, session, lambda: True, timeout=600)
    assert seen == [
        [(2, "INSERT", False), (3, "INSERT", False)],
        [(4, "INSERT", False), (3, "INSERT", False)],
        [(3, "INSERT", False)],
        [(3, "DELETE", True), (4, "INSERT", True)],
        [(3, "DELETE", False)],
    ]
