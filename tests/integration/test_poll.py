"""``spanner-cdc poll`` against the real emulator, broker and Spark: a table without a change
stream, published from its commit-timestamp column — a commit timestamp shared by two
transactions, a restart, a SIGKILL in the middle of a poll, and the replica at the end."""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from google.cloud import spanner

from spanner_cdc.consumer.readers import replica_rows
from spanner_cdc.errors import EXIT_USAGE
from spanner_cdc.schemas.events import READ_METHOD_POLL
from spanner_cdc.schemas.identity import polled_uuid
from spanner_cdc.schemas.timestamps import datetime_from_micros, micros_from_datetime, now_micros
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from spanner_cdc.stack.services import EMULATOR_PROJECT
from testkit.consumer_run import consumer_config, run_consumer, unique_prefix
from testkit.scrape import scrape, total
from testkit.spanner_db import INSTANCE, create_database
from tests.support.churn import produce_command
from tests.support.hang_report import HANG_REPORT
from tests.support.kafka_read import Received, read_all, read_topic
from tests.support.stopping import stop_with_sigterm
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TABLES = [
    "CREATE TABLE Docs (Id INT64 NOT NULL, Body STRING(MAX), "
    "Stamp TIMESTAMP OPTIONS (allow_commit_timestamp=true)) PRIMARY KEY (Id)",
    "CREATE TABLE Plain (Id INT64 NOT NULL, Stamp TIMESTAMP) PRIMARY KEY (Id)",
]
DDL = [*TABLES, "CREATE CHANGE STREAM Everything FOR ALL"]


def poll_command(spanner_host: str, kafka: str, database: Any, prefix: str, *extra: str) -> list[str]:
    return [
        sys.executable, *HANG_REPORT, "spanner_cdc.cli", "poll",
        "--project", EMULATOR_PROJECT, "--instance", INSTANCE, "--database", database.database_id,
        "--emulator-host", spanner_host, "--kafka-bootstrap", kafka, "--topic-prefix", prefix,
        "--table", "Docs", "--commit-timestamp-column", "Stamp", "--interval", "0.2",
        "--watermark-interval", "0.2", "--progress", "false", *extra,
    ]  # fmt: skip


def write_docs(database: Any, rows: list[tuple[int, str]], stamp: Any = spanner.COMMIT_TIMESTAMP) -> None:
    with database.batch() as batch:
        batch.insert_or_update(
            "Docs", columns=["Id", "Body", "Stamp"], values=[[key, body, stamp] for key, body in rows]
        )


def stamps(database: Any) -> dict[int, int]:
    """Each row's commit-timestamp column, in microseconds."""
    with database.snapshot() as snapshot:
        return {
            row[0]: micros_from_datetime(row[1]) for row in snapshot.execute_sql("SELECT Id, Stamp FROM Docs")
        }


def versions(kafka: str, prefix: str) -> list[Received]:
    return read_topic(kafka, prefix, "Docs")[0]


def newest_watermark(kafka: str, prefix: str) -> int:
    watermarks = read_topic(kafka, prefix, "Docs")[1]
    return max((w.watermark_micros for _, _, w in watermarks), default=0)


def position(kafka: str, prefix: str) -> dict[str, Any]:
    """The newest poll position of Docs ({} before the first)."""
    newest: dict[str, Any] = {}
    for _, _, key, value in read_all(kafka, Topics(prefix).polls):
        if key == b"table/Docs" and value is not None:
            newest = json.loads(value)
    return newest


def test_poll_publishes_each_version_once_a_shared_commit_timestamp_included(
    stack: EmbeddedStack, tmp_path: Path
) -> None:
    """Three rows in one transaction, then a fourth written by another transaction with the
    same commit timestamp (a past value: commit timestamps are not unique), then an update:
    every version once, INSERT or UPDATE by whether the row existed at the previous poll, the
    contract's poll uuid, sort keys [stamp, "", "", 0], watermarks past the last version; a
    restart publishes nothing again."""
    spanner_host, kafka = stack.endpoint("spanner"), stack.endpoint("kafka")
    database = create_database(spanner_host, DDL)
    write_docs(database, [(1, "one"), (2, "two"), (3, "three")])
    shared = stamps(database)[1]
    prefix = unique_prefix("poll")
    log = (tmp_path / "poll.log").open("w")
    port = free_port()
    command = poll_command(spanner_host, kafka, database, prefix, "--metrics-port", str(port))
    poller = subprocess.Popen(command, stderr=log)
    try:
        wait_for(lambda: len(versions(kafka, prefix)) == 3, 60, "the first three rows")
        wait_for(lambda: position(kafka, prefix).get("boundary_micros") == shared, 30, "the boundary")
        write_docs(
            database, [(4, "four")], stamp=datetime_from_micros(shared)
        )  # a second transaction at the same stamp
        wait_for(lambda: len(versions(kafka, prefix)) == 4, 30, "the row of the shared stamp")
        write_docs(database, [(1, "one again")])
        updated = stamps(database)[1]
        wait_for(lambda: newest_watermark(kafka, prefix) >= updated, 30, "a watermark past the update")
        metrics = scrape(port, "spanner_cdc_producer_events_total")
        assert total(metrics, "spanner_cdc_producer_events_total") == 5
        assert 0 <= total(metrics, "spanner_cdc_producer_low_watermark_lag_seconds") < 30
    finally:
        stop_with_sigterm(poller, 60, tmp_path / "poll.log")
    assert poller.returncode == 0, (tmp_path / "poll.log").read_text()[-3000:]

    published = versions(kafka, prefix)
    found = sorted(
        (e.key["Id"], e.value["payload"]["Body"], e.value["source_metadata"]["change_type"])
        for e in published
    )
    assert found == [
        (1, "one", "INSERT"),
        (1, "one again", "UPDATE"),
        (2, "two", "INSERT"),
        (3, "three", "INSERT"),
        (4, "four", "INSERT"),
    ]
    stream_name = (
        f"projects/{EMULATOR_PROJECT}/instances/{INSTANCE}/databases/{database.database_id}/tables/Docs"
    )
    for event in published:
        stamp = micros_from_datetime(event.value["payload"]["Stamp"])
        assert stamp == (updated if event.value["payload"]["Body"] == "one again" else shared)
        assert event.value["read_method"] == READ_METHOD_POLL
        assert event.value["sort_keys"] == [stamp, "", "", 0]
        assert event.value["uuid"] == polled_uuid(stream_name, stamp, "Docs", {"Id": str(event.key["Id"])})
        assert event.value["source_metadata"]["changed_columns"] == ["Body", "Stamp"]
    text = (tmp_path / "poll.log").read_text()
    assert "Traceback" not in text, text[-3000:]

    # A restart polls from the boundary and finds nothing new.
    restarted_at = now_micros()
    again = subprocess.Popen(poll_command(spanner_host, kafka, database, prefix), stderr=subprocess.PIPE)
    try:
        wait_for(lambda: newest_watermark(kafka, prefix) > restarted_at, 60, "a poll after the restart")
    finally:
        stop_with_sigterm(again, 60)
    assert again.returncode == 0
    assert len(versions(kafka, prefix)) == len(published)


#: Enough rows that the poll outlasts its first saved position (a save falls due about once a
#: second) by seconds, also under the suite's load, so the kill lands midway; fewer let the
#: poll end before the kill ("the poll ended before the kill").
ROWS, ROWS_PER_COMMIT = 120_000, 5_000


@pytest.mark.spark
def test_a_poller_killed_midway_resumes_and_the_replica_equals_spanner(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """120,000 rows in 24 transactions; the poller SIGKILLed after its first position and before
    the last row; updates while it is down; restarted: every version it can see is published,
    a version published twice keeps its uuid, the restart goes on from its position, and the
    replica — through the broker, Spark and DuckDB — equals the table."""
    spanner_host, kafka = stack.endpoint("spanner"), stack.endpoint("kafka")
    # No change stream, as a polled table has none: the emulator writes rows a stream records
    # many times slower (docs/facts.md).
    database = create_database(spanner_host, TABLES)
    for first in range(0, ROWS, ROWS_PER_COMMIT):
        write_docs(database, [(n, f"doc {n}") for n in range(first, first + ROWS_PER_COMMIT)])
    last_stamp = max(stamps(database).values())
    prefix = unique_prefix("poll-kill")
    command = poll_command(spanner_host, kafka, database, prefix)
    log = (tmp_path / "poll.log").open("w")
    killed = subprocess.Popen(command, stderr=log)
    try:
        wait_for(lambda: position(kafka, prefix).get("boundary_keys"), 120, "a first position")
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    assert position(kafka, prefix)["boundary_micros"] < last_stamp, "the poll ended before the kill"
    before_kill = len(versions(kafka, prefix))
    write_docs(database, [(n, f"doc {n} edited") for n in range(0, ROWS, 97)])
    edited = max(stamps(database).values())
    resumed = subprocess.Popen(command, stderr=log)
    try:
        wait_for(lambda: newest_watermark(kafka, prefix) >= edited, 180, "a watermark past the edits")
    finally:
        log.close()
        stop_with_sigterm(resumed, 60, tmp_path / "poll.log")
    assert resumed.returncode == 0, (tmp_path / "poll.log").read_text()[-3000:]

    published = versions(kafka, prefix)
    uuids = collections.defaultdict(set)
    for event in published:
        uuids[(event.key["Id"], event.value["payload"]["Stamp"])].add(event.value["uuid"])
    assert all(len(found) == 1 for found in uuids.values()), "a version published again got a new uuid"
    current = stamps(database)
    assert {(key, micros_from_datetime(stamp)) for key, stamp in uuids} >= set(current.items())
    assert len(published) - len(uuids) < before_kill, "the restart polled everything again"

    config = consumer_config(kafka, prefix, tmp_path / "consumer", max_events_per_batch=20_000)
    run_consumer(spark, config)
    with database.snapshot() as snapshot:
        table = sorted(tuple(row) for row in snapshot.execute_sql("SELECT Id, Body FROM Docs"))
    assert sorted(replica_rows(config, "Docs", '"Id", "Body"')) == table


def test_poll_reads_a_postgresql_dialect_table(stack: EmbeddedStack) -> None:
    """The same query in the PostgreSQL dialect ($1, double-quoted names, a
    spanner.commit_timestamp column): two rows, then an update of one — three versions."""
    spanner_host, kafka = stack.endpoint("spanner"), stack.endpoint("kafka")
    ddl = ["CREATE TABLE docs (id bigint NOT NULL PRIMARY KEY, body varchar, stamp spanner.commit_timestamp)"]
    database = create_database(spanner_host, ddl, dialect="POSTGRESQL")

    def write(rows: list[tuple[int, str]]) -> None:
        with database.batch() as batch:
            batch.insert_or_update(
                "docs",
                columns=["id", "body", "stamp"],
                values=[[k, b, spanner.COMMIT_TIMESTAMP] for k, b in rows],
            )

    write([(1, "one"), (2, "two")])
    prefix = unique_prefix("poll-pg")
    command = poll_command(spanner_host, kafka, database, prefix)
    command[command.index("Docs")], command[command.index("Stamp")] = "docs", "stamp"
    poller = subprocess.Popen(command, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: len(read_topic(kafka, prefix, "docs")[0]) == 2, 60, "the two rows")
        write([(1, "one again")])
        wait_for(lambda: len(read_topic(kafka, prefix, "docs")[0]) == 3, 30, "the update")
    finally:
        stop_with_sigterm(poller, 60)
    assert poller.returncode == 0
    found = sorted(
        (e.key["id"], e.value["payload"]["body"], e.value["source_metadata"]["change_type"])
        for e in read_topic(kafka, prefix, "docs")[0]
    )
    assert found == [(1, "one", "INSERT"), (1, "one again", "UPDATE"), (2, "two", "INSERT")]


def test_poll_refuses_a_column_without_commit_timestamps_and_a_shared_prefix(stack: EmbeddedStack) -> None:
    """One line each, exit 2: a column without allow_commit_timestamp; a prefix a change-stream
    producer writes to; and the producer refuses a prefix the poller writes to."""
    spanner_host, kafka = stack.endpoint("spanner"), stack.endpoint("kafka")
    database = create_database(spanner_host, DDL)

    def refused(command: list[str]) -> str:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == EXIT_USAGE, done.stderr[-2000:]
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr[-2000:]
        return lines[0]

    plain = poll_command(spanner_host, kafka, database, unique_prefix("plain"))
    plain[plain.index("Docs")] = "Plain"
    assert "allow_commit_timestamp" in refused(plain)

    produced = unique_prefix("produced")
    admin = AdminClient({"bootstrap.servers": kafka})
    for future in admin.create_topics([NewTopic(Topics(produced).checkpoints, 1, -1)]).values():
        future.result(30)
    assert "belongs to a change-stream producer" in refused(
        poll_command(spanner_host, kafka, database, produced)
    )

    polled = unique_prefix("polled")
    write_docs(database, [(1, "one")])
    poller = subprocess.Popen(poll_command(spanner_host, kafka, database, polled), stderr=subprocess.PIPE)
    try:
        wait_for(lambda: position(kafka, polled), 60, "the poller's position")
    finally:
        stop_with_sigterm(poller, 60)
    assert poller.returncode == 0
    assert "belongs to spanner-cdc poll" in refused(
        produce_command(spanner_host, kafka, database, "Everything", polled)
    )
