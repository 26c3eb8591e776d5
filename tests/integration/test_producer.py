"""The producer against the real emulator and broker: lineage under churn, restarts, dialects,
value capture types, commit timestamps and bad input."""

from __future__ import annotations

import asyncio
import base64
import decimal
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from google.cloud.spanner import COMMIT_TIMESTAMP, KeySet
from google.cloud.spanner_v1.data_types import JsonObject

from spanner_cdc.producer.main import build_service
from spanner_cdc.producer.service import ProducerService
from spanner_cdc.schemas.timestamps import datetime_from_micros, format_timestamp_micros, timestamp_micros
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from testkit.producer_run import running, wait_until
from testkit.spanner_db import create_database
from tests.support.churn import (
    ACCOUNTS_DDL,
    RERUN_ON_EMULATOR_SKIP,
    SourceLog,
    bank_source_log,
    lineage_depth,
    merges,
    now_micros,
    produce_command,
    produce_since,
    produce_until_end,
    producer_config,
    run_churn,
    wait_past,
)
from tests.support.event_checks import (
    assert_a_change_sent_again_keeps_its_uuid,
    assert_exactly_the_committed_changes,
    assert_no_change_twice,
    assert_per_key_commit_order,
    assert_watermarks_cover_what_precedes_them,
)
from tests.support.freezing import frozen
from tests.support.kafka_read import Received, read_all, read_events, read_topic
from tests.support.workload import AccountWriter

pytestmark = pytest.mark.integration


def check_churn_run(service: ProducerService, events: list[Received], writer: AccountWriter) -> None:
    assert len(writer.committed) > 100
    assert_exactly_the_committed_changes(events, writer.committed)
    assert len({e.value["uuid"] for e in events}) == len(events), "a change was published twice"
    assert_per_key_commit_order(events)
    partitions = service.scheduler.partitions.values()
    assert max(p.starts for p in partitions) == 1, "a partition token was queried twice"
    assert not any(p.retries for p in partitions)
    depth = lineage_depth(service.scheduler)
    assert merges(service.scheduler), (
        f"no merge was observed ({len(partitions)} partitions, lineage depth {depth})"
    )
    assert depth >= 3
    config = service.config
    last_commit = max(c.commit_micros for c in writer.committed)
    assert_watermarks_cover_what_precedes_them(
        config.kafka_bootstrap, config.topic_prefix, config.topic_partitions, last_commit
    )


@RERUN_ON_EMULATOR_SKIP
def test_churn_fast_every_change_once_in_order(churn_spanner: str, stack: EmbeddedStack) -> None:
    """Writes while tokens live 2-4 s, until a merge and lineage depth 4 were seen (run_churn):
    the emulator chooses splits and merges at random: five runs here took 17-70 s in all, and a
    clean-clone run of the suite went 60 s (the old bound) without a merge, hence up to 120 s."""
    service, events, writer, _, source_log = asyncio.run(
        run_churn(churn_spanner, stack.endpoint("kafka"), 10, 120)
    )
    source_log.check_heard(events)
    with source_log.diagnosing():
        check_churn_run(service, events, writer)


@RERUN_ON_EMULATOR_SKIP
def test_one_query_slot_with_several_live_partitions_delivers_everything(
    churn_spanner: str, stack: EmbeddedStack
) -> None:
    """``--max-queries 1`` while the churning emulator keeps several partitions live. A partition
    whose query ended waits for its records' release, which needs the others to read: it used to
    keep its query slot meanwhile, and with fewer slots than live partitions nothing was ever
    published and no stall was detected."""
    service, events, writer, _, source_log = asyncio.run(
        run_churn(churn_spanner, stack.endpoint("kafka"), 3, 8, max_queries=1)
    )
    assert sum(1 for p in service.scheduler.partitions.values() if p.starts) > 2, "too few partitions"
    with source_log.diagnosing():
        assert_exactly_the_committed_changes(events, writer.committed)
        assert_per_key_commit_order(events)


@pytest.mark.slow
@RERUN_ON_EMULATOR_SKIP
def test_churn_default_speed(stack: EmbeddedStack) -> None:
    """At the emulator's own pace (tokens live 20-40 s), for at least 45 s and until a merge
    and lineage depth 4 were seen (run_churn), however long that takes up to 150 s."""
    service, events, writer, _, source_log = asyncio.run(
        run_churn(stack.endpoint("spanner"), stack.endpoint("kafka"), 45, 150)
    )
    with source_log.diagnosing():
        check_churn_run(service, events, writer)


def rfc3339(micros: int) -> str:
    from spanner_cdc.schemas.timestamps import format_timestamp_micros

    return format_timestamp_micros(micros)


@RERUN_ON_EMULATOR_SKIP
def test_sigkill_mid_churn_then_restart_loses_nothing(
    churn_spanner: str, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """Two SIGKILLs while writes and churn go on; the third run finishes at the end timestamp."""
    kafka = stack.endpoint("kafka")
    database = create_database(churn_spanner, ACCOUNTS_DDL)
    prefix = f"restart-{uuid.uuid4().hex[:8]}"
    start, end = now_micros(), now_micros() + 24_000_000
    command = produce_command(
        churn_spanner, kafka, database, "Bank", prefix,
        "--start-timestamp", rfc3339(start), "--end-timestamp", rfc3339(end), "--log-level", "debug",
    )  # fmt: skip
    source_log = bank_source_log(churn_spanner, kafka, database, prefix, start)
    writer = AccountWriter(database)
    writing = threading.Thread(target=writer.run, args=(21,))
    writing.start()
    try:
        for run_seconds in (6, 6):
            with (tmp_path / "killed.log").open("a") as log:
                killed = subprocess.Popen(command, stderr=log)
                time.sleep(run_seconds)
                assert killed.poll() is None, "the producer ended before it could be killed"
                os.kill(killed.pid, signal.SIGKILL)
                killed.wait()
        final = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    finally:
        writer.stop()
        writing.join()
    assert final.returncode == 0, final.stderr[-3000:]
    source_log.add((tmp_path / "killed.log").read_text() + final.stderr)
    events = read_events(kafka, prefix, "Accounts")
    source_log.check_heard(events)
    with source_log.diagnosing():
        assert_exactly_the_committed_changes(events, writer.committed)
    assert_no_change_twice(events)
    assert_a_change_sent_again_keeps_its_uuid(events)
    assert_per_key_commit_order(events, replays=True)
    assert_watermarks_cover_what_precedes_them(kafka, prefix, 6, end)


CAPTURE_TYPES = ("NEW_ROW", "NEW_ROW_AND_OLD_VALUES", "OLD_AND_NEW_VALUES", "NEW_VALUES")


def write_insert_update_delete(spanner: str, streams: dict[str, str]) -> tuple[Any, int, int]:
    """One row inserted, one column of it updated, then deleted; returns (database, start, end)."""
    database = create_database(
        spanner,
        [
            "CREATE TABLE Items (Id INT64 NOT NULL, Name STRING(MAX), Qty INT64, Price NUMERIC) "
            "PRIMARY KEY (Id)"
        ]
        + [
            f"CREATE CHANGE STREAM {stream} FOR Items OPTIONS (value_capture_type='{capture}')"
            for capture, stream in streams.items()
        ],
    )
    start = now_micros()
    with database.batch() as batch:
        batch.insert(
            "Items", columns=["Id", "Name", "Qty", "Price"], values=[[1, "pen", 1, decimal.Decimal("1.50")]]
        )
    with database.batch() as batch:
        batch.update("Items", columns=["Id", "Qty"], values=[[1, 2]])
    with database.batch() as batch:
        batch.delete("Items", keyset=KeySet(keys=[[1]]))  # type: ignore[no-untyped-call]
    end = now_micros() + 500_000
    wait_past(end)
    return database, start, end


@pytest.fixture(scope="module")
def capture_events(stack: EmbeddedStack) -> dict[str, list[Received]]:
    """The events of each value capture type (two databases: Spanner allows 3 streams a table)."""
    out = {}
    for pair in (CAPTURE_TYPES[:2], CAPTURE_TYPES[2:]):
        streams = {capture: f"Items_{capture}" for capture in pair}
        database, start, end = write_insert_update_delete(stack.endpoint("spanner"), streams)
        for capture, stream in streams.items():
            config = producer_config(
                stack.endpoint("spanner"), stack.endpoint("kafka"), database, stream,
                start_timestamp_micros=start, end_timestamp_micros=end,
            )  # fmt: skip
            asyncio.run(produce_until_end(config))
            out[capture] = read_events(stack.endpoint("kafka"), config.topic_prefix, "Items")
    return out


PEN = {"Id": 1, "Name": "pen", "Qty": 1, "Price": decimal.Decimal("1.5")}
NOTHING = {"Id": 1, "Name": None, "Qty": None, "Price": None}
ALL = ["Name", "Price", "Qty"]
Expectation = tuple[dict[str, Any], list[str], dict[str, Any] | None, dict[str, Any], list[str]]
# capture type → (UPDATE payload, UPDATE changed_columns, UPDATE old_values, DELETE payload, DELETE changed)
EXPECTED_BY_CAPTURE: dict[str, Expectation] = {
    "NEW_ROW": ({**PEN, "Qty": 2}, ALL, None, NOTHING, []),
    "NEW_ROW_AND_OLD_VALUES": ({**PEN, "Qty": 2}, ALL, {**NOTHING, "Qty": 1}, {**PEN, "Qty": 2}, ALL),
    "OLD_AND_NEW_VALUES": ({**NOTHING, "Qty": 2}, ["Qty"], {**NOTHING, "Qty": 1}, {**PEN, "Qty": 2}, ALL),
    "NEW_VALUES": ({**NOTHING, "Qty": 2}, ["Qty"], None, NOTHING, []),
}  # fmt: skip


@pytest.mark.parametrize("capture", CAPTURE_TYPES)
def test_value_capture_types_give_the_contract_payloads(
    capture_events: dict[str, list[Received]], capture: str
) -> None:
    events = capture_events[capture]
    assert [e.value["source_metadata"]["change_type"] for e in events] == ["INSERT", "UPDATE", "DELETE"]
    insert, update, delete = (e.value for e in events)
    update_payload, update_changed, update_old, delete_payload, delete_changed = EXPECTED_BY_CAPTURE[capture]
    assert insert["payload"] == PEN and insert["source_metadata"]["changed_columns"] == [
        "Name",
        "Price",
        "Qty",
    ]
    assert update["payload"] == update_payload
    assert update["source_metadata"]["changed_columns"] == update_changed
    assert update["source_metadata"]["old_values"] == update_old
    assert delete["payload"] == delete_payload and delete["source_metadata"]["is_deleted"] is True
    assert delete["source_metadata"]["changed_columns"] == delete_changed
    assert all(e["source_metadata"]["value_capture_type"] == capture for e in (insert, update, delete))
    assert len({e["schema_key"] for e in (insert, update, delete)}) == 1, "one schema per table version"


DOC = JsonObject({"k": [1]})  # type: ignore[no-untyped-call]


def test_postgresql_dialect_end_to_end(stack: EmbeddedStack) -> None:
    database = create_database(
        stack.endpoint("spanner"),
        [
            "CREATE TABLE accounts (id varchar(36) PRIMARY KEY, balance bigint, rate numeric, doc jsonb, "
            "tags text[], updated spanner.commit_timestamp)",
            "CREATE CHANGE STREAM bank FOR accounts WITH (value_capture_type = 'NEW_ROW')",
        ],
        dialect="POSTGRESQL",
    )
    start = now_micros()
    with database.batch() as batch:
        batch.insert(
            "accounts",
            columns=["id", "balance", "rate", "doc", "tags", "updated"],
            values=[["a", 10, decimal.Decimal("12345678901234567890.000000005"), DOC, ["x", "y"],
                     COMMIT_TIMESTAMP]],
        )  # fmt: skip
    commit = timestamp_micros(batch.committed)
    with database.batch() as batch:
        batch.delete("accounts", keyset=KeySet(keys=[["a"]]))  # type: ignore[no-untyped-call]
    config = produce_since(stack, database, "bank", start)
    insert, delete = (e.value for e in read_events(stack.endpoint("kafka"), config.topic_prefix, "accounts"))
    assert insert["payload"] == {
        "id": "a",
        "balance": 10,
        "rate": "12345678901234567890.000000005",
        "doc": '{"k": [1]}',
        "tags": ["x", "y"],
        "updated": datetime_from_micros(commit),
    }
    assert insert["source_metadata"]["schema"] == "public" and insert["object"] == "accounts"
    assert insert["stream_name"].endswith(f"/databases/{database.database_id}/changeStreams/bank")
    assert delete["source_metadata"]["is_deleted"] is True and delete["payload"]["id"] == "a"


def test_commit_timestamp_columns_carry_the_commit_timestamp(stack: EmbeddedStack) -> None:
    """PENDING_COMMIT_TIMESTAMP() columns : the emulator reports 9999-12-31; events don't."""
    database = create_database(stack.endpoint("spanner"), ACCOUNTS_DDL)
    start = now_micros()
    commits = []
    for balance in (1, 2):
        with database.batch() as batch:
            batch.insert_or_update(
                "Accounts", columns=["Id", "Balance", "LastUpdate"], values=[["x", balance, COMMIT_TIMESTAMP]]
            )
        commits.append(timestamp_micros(batch.committed))
    config = produce_since(stack, database, "Bank", start)
    events = read_events(stack.endpoint("kafka"), config.topic_prefix, "Accounts")
    assert [e.value["payload"]["LastUpdate"] for e in events] == [datetime_from_micros(c) for c in commits]
    # The emulator reports the *old* value of a commit-timestamp column truncated to the second
    # (real Spanner: exact), so only its second is checked.
    old = events[1].value["source_metadata"]["old_values"]["LastUpdate"]
    assert old == datetime_from_micros(commits[0] // 1_000_000 * 1_000_000)


NOTES_DDL = [
    "CREATE TABLE Notes (Id INT64 NOT NULL, Body STRING(MAX)) PRIMARY KEY (Id)",
    "CREATE CHANGE STREAM NotesStream FOR Notes",
]
#: A client-side message.max.bytes the 30 KB note exceeds and the others do not.
SMALL_MESSAGES = {"message.max.bytes": "10000"}


def write_notes(database: Any) -> int:
    start = now_micros()
    for note_id, size in ((1, 10), (2, 30_000), (3, 10)):
        with database.batch() as batch:
            batch.insert("Notes", columns=["Id", "Body"], values=[[note_id, "x" * size]])
    return start


def test_an_event_larger_than_kafka_accepts_goes_to_the_dead_letter_topic(stack: EmbeddedStack) -> None:
    database = create_database(stack.endpoint("spanner"), NOTES_DDL)
    start = write_notes(database)
    config = produce_since(stack, database, "NotesStream", start, kafka_config=SMALL_MESSAGES)
    events = read_events(stack.endpoint("kafka"), config.topic_prefix, "Notes")
    assert [e.value["payload"]["Id"] for e in events] == [1, 3]
    [(_, _, key, value)] = read_all(stack.endpoint("kafka"), Topics(config.topic_prefix).dead_letters)
    assert value is not None and key is not None
    letter = json.loads(value)
    assert letter["object"] == "Notes" and letter["topic"] == f"{config.topic_prefix}.Notes"
    assert letter["size_bytes"] > 30_000 and "too large" in letter["reason"].lower()
    assert uuid.UUID(letter["uuid"]) and len(letter["sort_keys"]) == 4


def test_an_event_larger_than_its_topic_accepts_goes_to_the_dead_letter_topic(stack: EmbeddedStack) -> None:
    """The broker's limit lower than the client's: a topic made before the producer's first run
    with a smaller ``max.message.bytes``. Refused by the broker, the event would abort its
    transaction — and stop the producer at every restart; the producer reads the topic's limit
    as it starts and refuses the event itself. The body is random (lz4 cannot shrink it below
    the limit, as it would shrink repeated text)."""
    database = create_database(stack.endpoint("spanner"), NOTES_DDL)
    prefix = f"limit-{uuid.uuid4().hex[:6]}"
    topic = NewTopic(f"{prefix}.Notes", 1, 1, config={"max.message.bytes": "20000"})
    admin = AdminClient({"bootstrap.servers": stack.endpoint("kafka")})
    admin.create_topics([topic])[topic.topic].result(30)  # the client must outlive the answer
    start = now_micros()
    for note_id, body in ((1, "small"), (2, base64.b64encode(os.urandom(30_000)).decode()), (3, "small")):
        with database.batch() as batch:
            batch.insert("Notes", columns=["Id", "Body"], values=[[note_id, body]])
    config = produce_since(stack, database, "NotesStream", start, topic_prefix=prefix)
    events = read_events(stack.endpoint("kafka"), config.topic_prefix, "Notes")
    assert [e.value["payload"]["Id"] for e in events] == [1, 3]
    [(_, _, _, value)] = read_all(stack.endpoint("kafka"), Topics(config.topic_prefix).dead_letters)
    assert value is not None
    letter = json.loads(value)
    assert letter["object"] == "Notes" and letter["size_bytes"] > 20_000


def test_an_event_larger_than_kafka_accepts_stops_the_producer_when_asked(stack: EmbeddedStack) -> None:
    database = create_database(stack.endpoint("spanner"), NOTES_DDL)
    start = write_notes(database)
    prefix = f"big-{uuid.uuid4().hex[:6]}"
    command = produce_command(
        stack.endpoint("spanner"), stack.endpoint("kafka"), database, "NotesStream", prefix,
        "--start-timestamp", format_timestamp_micros(start), "--kafka-config", "message.max.bytes=10000",
        "--on-oversize-event", "fail",
    )  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "of table Notes" in result.stderr.strip().splitlines()[-1]
    assert "is larger than Kafka accepts" in result.stderr.strip().splitlines()[-1]


def test_table_filters(stack: EmbeddedStack) -> None:
    database = create_database(
        stack.endpoint("spanner"),
        [
            "CREATE TABLE Accounts (Id STRING(36) NOT NULL, Balance INT64) PRIMARY KEY (Id)",
            "CREATE TABLE AuditLog (Id INT64 NOT NULL, Note STRING(MAX)) PRIMARY KEY (Id)",
            "CREATE TABLE AuditArchive (Id INT64 NOT NULL) PRIMARY KEY (Id)",
            "CREATE CHANGE STREAM Everything FOR ALL",
        ],
    )
    start = now_micros()
    with database.batch() as batch:
        batch.insert("Accounts", columns=["Id", "Balance"], values=[["a", 1]])
        batch.insert("AuditLog", columns=["Id", "Note"], values=[[1, "x"]])
        batch.insert("AuditArchive", columns=["Id"], values=[[1]])
    config = produce_since(
        stack,
        database,
        "Everything",
        start,
        include_tables=("Accounts", "Audit*"),
        exclude_tables=("AuditArchive",),
    )
    topics = AdminClient({"bootstrap.servers": stack.endpoint("kafka")}).list_topics(timeout=10).topics
    control = Topics(config.topic_prefix)
    assert {t for t in topics if t.startswith(config.topic_prefix + ".")} == {
        f"{config.topic_prefix}.Accounts",
        f"{config.topic_prefix}.AuditLog",
    }  # a {prefix}.* pattern selects events only
    assert {control.schemas, control.checkpoints, control.dead_letters} <= set(topics)
    assert len(read_events(stack.endpoint("kafka"), config.topic_prefix, "AuditLog")) == 1


@pytest.mark.parametrize("dialect", ["GOOGLE_STANDARD_SQL", "POSTGRESQL"])
def test_watched_tables_have_topics_and_watermarks_before_their_first_change(
    stack: EmbeddedStack, dialect: str
) -> None:
    """A table's first change waits for no topic creation, and a consumer's cut can pass commit
    timestamps before it: the topics of the tables the stream watches (less the filtered ones)
    are there at start-up, with watermark records; a table the stream does not watch gets none."""
    if dialect == "POSTGRESQL":
        ddl = [
            "CREATE TABLE watched (id bigint PRIMARY KEY, a bigint)",
            "CREATE TABLE filtered (id bigint PRIMARY KEY)",
            "CREATE TABLE unwatched (id bigint PRIMARY KEY)",
            "CREATE CHANGE STREAM subset FOR watched, filtered",
        ]
    else:
        ddl = [
            "CREATE TABLE watched (id INT64 NOT NULL, a INT64) PRIMARY KEY (id)",
            "CREATE TABLE filtered (id INT64 NOT NULL) PRIMARY KEY (id)",
            "CREATE TABLE unwatched (id INT64 NOT NULL) PRIMARY KEY (id)",
            "CREATE CHANGE STREAM subset FOR watched, filtered",
        ]
    database = create_database(stack.endpoint("spanner"), ddl, dialect=dialect)
    kafka = stack.endpoint("kafka")
    config = producer_config(
        stack.endpoint("spanner"),
        kafka,
        database,
        "subset",
        exclude_tables=("filtered",),
        watermark_interval=0.2,
    )

    async def started() -> None:
        service = await build_service(config)
        async with running(service):
            emitter = service.watermarks
            assert emitter is not None
            await wait_until(service, lambda: emitter.published_micros is not None, 60)

    asyncio.run(started())
    topics = AdminClient({"bootstrap.servers": kafka}).list_topics(timeout=10).topics
    event_topics = {t for t in topics if t.startswith(config.topic_prefix + ".")}
    assert event_topics == {f"{config.topic_prefix}.watched"}
    events, watermarks = read_topic(kafka, config.topic_prefix, "watched")
    assert not events
    assert {partition for partition, _, _ in watermarks} == set(range(config.topic_partitions))


@RERUN_ON_EMULATOR_SKIP
def test_stalled_spanner_restarts_partitions_from_their_checkpoints(stack: EmbeddedStack) -> None:
    """SIGSTOP the emulator longer than the stall limit: queries restart, nothing is lost."""
    own = EmbeddedStack.start(names=("spanner",))
    try:
        spanner, pgid = own.endpoint("spanner"), own.services["spanner"].pgid
        assert pgid is not None
        database = create_database(spanner, ACCOUNTS_DDL)
        config = producer_config(spanner, stack.endpoint("kafka"), database, "Bank", stall_heartbeats=3)
        writer = AccountWriter(database)

        async def scenario() -> ProducerService:
            service = await build_service(config)
            async with running(service):
                await asyncio.to_thread(writer.run, 3)
                with frozen(pgid):
                    await asyncio.sleep(8)  # > 3 heartbeat intervals: every query is declared stalled
                await asyncio.to_thread(writer.run, 3)
                last = max(c.commit_micros for c in writer.committed)
                await wait_until(service, lambda: (service.scheduler.low_watermark_micros() or 0) > last, 120)
            return service

        source_log = SourceLog(config)
        with source_log.recording():
            service = asyncio.run(scenario())
        assert any(p.retries for p in service.scheduler.partitions.values()), "the stall was never detected"
        events = read_events(stack.endpoint("kafka"), config.topic_prefix, "Accounts")
        with source_log.diagnosing():  # needs the emulator up
            assert_exactly_the_committed_changes(events, writer.committed)
    finally:
        own.stop()
    assert_per_key_commit_order(events, replays=True)
