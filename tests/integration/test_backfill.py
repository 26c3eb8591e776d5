"""Backfill (--backfill) against the real emulator, broker and Spark: snapshot rows as events,
a SIGKILL in the middle of a backfill, and a replica equal to Spanner at the end."""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime as dt
import decimal
import json
import math
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from google.cloud.spanner import KeySet
from google.cloud.spanner_v1.data_types import JsonObject

from spanner_cdc.consumer.readers import replica_rows
from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.schemas.events import READ_METHOD_BACKFILL
from spanner_cdc.schemas.identity import backfill_uuid
from spanner_cdc.schemas.timestamps import datetime_from_micros, micros_from_datetime
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from testkit.consumer_run import consumer_config, run_consumer, unique_prefix
from testkit.scrape import fetch
from testkit.spanner_db import create_database
from tests.support.churn import now_micros, produce_command, produce_since, produce_to_now, producer_config
from tests.support.kafka_read import Received, read_all, read_events, read_topic
from tests.support.kafka_write import produce
from tests.support.stopping import stop_with_sigterm
from tests.support.waiting import wait_for
from tests.support.workload import AccountWriter

pytestmark = pytest.mark.integration

TYPES_DDL = [
    "CREATE TABLE Things (Id INT64 NOT NULL, Tag STRING(20) NOT NULL, Flag BOOL, Score FLOAT64, "
    "Ratio FLOAT32, Amount NUMERIC, Raw BYTES(MAX), Day DATE, Seen TIMESTAMP, Doc JSON, "
    "Names ARRAY<STRING(MAX)>, Counts ARRAY<INT64>) PRIMARY KEY (Tag, Id)",
    "CREATE CHANGE STREAM ThingsStream FOR Things OPTIONS (value_capture_type = 'NEW_ROW')",
]
THING_COLUMNS = [
    "Id",
    "Tag",
    "Flag",
    "Score",
    "Ratio",
    "Amount",
    "Raw",
    "Day",
    "Seen",
    "Doc",
    "Names",
    "Counts",
]
DOC = JsonObject({"k": [1, None]})  # type: ignore[no-untyped-call]
EMPTY_DOC = JsonObject([])  # type: ignore[no-untyped-call]
THINGS = [
    [1, "a", True, 1.5, 0.25, decimal.Decimal("12345678901234567890.123456789"),
     base64.b64encode(b"\x00\xff"), "2024-02-29", "2024-05-01T10:11:12.123456Z",
     DOC, ["x", ""], [1, -(2**63)]],
    [2, "a", None, float("nan"), None, None, None, None, None, None, None, None],
    [2**62, "b", False, float("-inf"), -0.0, decimal.Decimal("-0.000000001"), base64.b64encode(b""),
     "0001-01-01", "9999-12-31T23:59:59.999999Z", EMPTY_DOC, [], []],
]  # fmt: skip


#: What the emulator's change records get wrong: TIMESTAMP values cut to the second, NaN and
#: infinities as null.
MISREPORTED_BY_EMULATOR_STREAMS: dict[tuple[str, int], dict[str, Any]] = {
    ("a", 1): {"Seen": dt.datetime(2024, 5, 1, 10, 11, 12, 123456, dt.UTC)},
    ("a", 2): {"Score": math.nan},
    ("b", 2**62): {"Score": -math.inf, "Seen": dt.datetime(9999, 12, 31, 23, 59, 59, 999999, dt.UTC)},
}


def test_a_backfill_row_is_the_insert_event_the_change_stream_gives_for_the_same_row(
    stack: EmbeddedStack,
) -> None:
    """Every column type, nulls, NaN and infinities, a two-column key: the backfill event of a
    row carries the payload, key and schema of the change stream's INSERT of that row, with the
    contract's backfill uuid, sort keys [T, "", "", 0] and null transaction facts."""
    database = create_database(stack.endpoint("spanner"), TYPES_DDL)
    start = now_micros()
    with database.batch() as batch:
        batch.insert("Things", columns=THING_COLUMNS, values=THINGS)
    streamed = produce_since(stack, database, "ThingsStream", start)
    snapshot = now_micros()
    backfilled = produce_since(stack, database, "ThingsStream", snapshot, backfill=True)

    kafka = stack.endpoint("kafka")
    inserts = {(e.key["Tag"], e.key["Id"]): e for e in read_events(kafka, streamed.topic_prefix, "Things")}
    rows = {(e.key["Tag"], e.key["Id"]): e for e in read_events(kafka, backfilled.topic_prefix, "Things")}
    assert sorted(rows) == sorted(inserts) == [("a", 1), ("a", 2), ("b", 2**62)]
    for key, row in rows.items():
        insert = inserts[key].value
        value = row.value
        assert row.key == inserts[key].key
        # The emulator's change records get some values wrong (docs/facts.md); Spanner's read,
        # which the backfill publishes, has them right.
        truth = {**insert["payload"], **MISREPORTED_BY_EMULATOR_STREAMS.get(key, {})}
        assert _nan_equal(value["payload"], truth), (key, value["payload"], truth)
        assert value["schema_key"] == insert["schema_key"]
        assert value["read_method"] == READ_METHOD_BACKFILL
        assert value["sort_keys"] == [snapshot, "", "", 0]
        assert value["uuid"] == backfill_uuid(
            backfilled.stream_name, snapshot, "Things", {"Tag": key[0], "Id": str(key[1])}
        )
        metadata = value["source_metadata"]
        assert metadata["change_type"] == "INSERT" and metadata["tx_id"] is None
        assert metadata["number_of_records_in_transaction"] is None
        assert metadata["changed_columns"] == insert["source_metadata"]["changed_columns"]


def backfilled_bank(stack: EmbeddedStack) -> ProducerConfig:
    """A new bank database of 30 accounts (``a00`` to ``a29``) and 10 orders, backfilled by a
    producer run to now; the config that ran (its start is the backfill's snapshot)."""
    database = create_database(stack.endpoint("spanner"), BANK_DDL)
    with database.batch() as batch:
        batch.insert("Accounts", columns=["Id", "Balance"], values=[[f"a{n:02d}", n] for n in range(30)])
        batch.insert(
            "Orders",
            columns=["Region", "OrderId", "Amount", "Note"],
            values=[["eu", n, 1.0, ""] for n in range(10)],
        )
    # After the rows' commit by Spanner's clock, not only this machine's: the snapshot must hold them.
    inserted = micros_from_datetime(batch.committed)
    return produce_since(stack, database, "Bank", max(now_micros(), inserted + 1), backfill=True)


def test_a_table_is_backfilled_again_once_at_a_new_snapshot(stack: EmbeddedStack) -> None:
    """--backfill-snapshot S --backfill-tables Orders on a prefix where both tables were
    backfilled: Orders is read again at S (new uuids), Accounts is not; a restart with the same
    options publishes nothing again."""
    first = backfilled_bank(stack)
    kafka, prefix = stack.endpoint("kafka"), first.topic_prefix
    snapshot = now_micros()
    again = dataclasses.replace(
        first, backfill_tables=("Orders",), backfill_snapshot_micros=snapshot, end_timestamp_micros=None
    )
    produce_to_now(again)
    produce_to_now(again)  # the same options once more: nothing to do

    def backfilled(table: str) -> collections.Counter[int]:
        """Backfill rows per snapshot."""
        return collections.Counter(
            e.value["sort_keys"][0]
            for e in read_events(kafka, prefix, table)
            if e.value["read_method"] == READ_METHOD_BACKFILL
        )

    accounts = read_events(kafka, prefix, "Accounts")
    assert backfilled("Accounts") == {first.start_timestamp_micros: 30}, (
        f"first run from {first.start_timestamp_micros}: Accounts events "
        f"{collections.Counter(e.value['read_method'] for e in accounts)}, Orders {backfilled('Orders')}"
    )
    assert backfilled("Orders") == {first.start_timestamp_micros: 10, snapshot: 10}
    recorded = plans(kafka, prefix)
    assert recorded["Orders"]["snapshot_micros"] == snapshot and recorded["Orders"]["finished"]
    assert recorded["Accounts"]["snapshot_micros"] == first.start_timestamp_micros


def test_a_backfill_goes_on_after_the_key_of_its_checkpoint(stack: EmbeddedStack) -> None:
    """Accounts' record set back to mid-table, as a run killed after a checkpoint leaves it: the
    next run reads, at the record's snapshot, only the rows after its key — with the uuids they
    had — and marks the table finished; Orders, finished, is not read again."""
    first = backfilled_bank(stack)
    kafka, prefix = stack.endpoint("kafka"), first.topic_prefix
    checkpoint = plans(kafka, prefix)["Accounts"] | {"after_key": ["a19"], "finished": False}
    produce(kafka, Topics(prefix).backfills, [(b"table/Accounts", json.dumps(checkpoint).encode())])
    produce_to_now(dataclasses.replace(first, end_timestamp_micros=None))

    def backfilled(table: str) -> collections.Counter[tuple[str, str]]:
        """(key, uuid) of the table's backfill events, and how often each was published."""
        return collections.Counter(
            (json.dumps(e.key), e.value["uuid"])
            for e in read_events(kafka, prefix, table)
            if e.value["read_method"] == READ_METHOD_BACKFILL
        )

    accounts = backfilled("Accounts")
    assert {key: count for (key, _), count in accounts.items()} == {
        json.dumps({"Id": f"a{n:02d}"}): 2 if n > 19 else 1 for n in range(30)
    }, "not exactly the rows after the checkpoint's key were read again, with their uuids"
    assert sum(backfilled("Orders").values()) == 10
    recorded = plans(kafka, prefix)["Accounts"]
    assert recorded["finished"] and recorded["snapshot_micros"] == checkpoint["snapshot_micros"]


def _nan_equal(left: dict[str, Any], right: dict[str, Any]) -> bool:
    """Payloads equal, NaN counting as equal to NaN."""
    return left.keys() == right.keys() and all(
        a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
        for a, b in zip(left.values(), right.values(), strict=True)
    )


BANK_TABLES = [
    "CREATE TABLE Accounts (Id STRING(36) NOT NULL, Balance INT64, "
    "LastUpdate TIMESTAMP OPTIONS (allow_commit_timestamp=true)) PRIMARY KEY (Id)",
    "CREATE TABLE Orders (Region STRING(8) NOT NULL, OrderId INT64 NOT NULL, Amount FLOAT64, "
    "Note STRING(MAX)) PRIMARY KEY (Region, OrderId)",
]
# The default capture type: an update carries only the changed columns, so a replica that
# applied a change before the row's backfill would lack the rest.
BANK_STREAM = "CREATE CHANGE STREAM Bank FOR ALL"
BANK_DDL = [*BANK_TABLES, BANK_STREAM]
ACCOUNTS, ORDERS = 40_000, 10_000
ROWS_PER_COMMIT = 5_000


def bank_with_accounts_and_orders(spanner_host: str) -> Any:
    """A new bank database of ``ACCOUNTS`` accounts and ``ORDERS`` orders, its change stream
    created after them, as a database that gets its first stream and a backfill: the emulator
    writes rows a stream records many times slower (docs/facts.md)."""
    database = create_database(spanner_host, BANK_TABLES)
    for first in range(0, ACCOUNTS, ROWS_PER_COMMIT):
        with database.batch() as batch:
            batch.insert(
                "Accounts",
                columns=["Id", "Balance"],
                values=[[f"acct-{n:03d}", n] for n in range(first, first + ROWS_PER_COMMIT)],
            )
    for first in range(0, ORDERS, ROWS_PER_COMMIT):
        with database.batch() as batch:
            batch.insert(
                "Orders",
                columns=["Region", "OrderId", "Amount", "Note"],
                values=[
                    [("eu", "us")[n % 2], n, n / 8, f"order {n}"]
                    for n in range(first, first + ROWS_PER_COMMIT)
                ],
            )
    database.update_ddl([BANK_STREAM]).result(120)
    return database


class Writes:
    """Updates and inserts (AccountWriter's) and deletes of accounts that existed at the
    snapshot, on one thread: the emulator runs one read-write transaction at a time."""

    def __init__(self, database: Any) -> None:
        self.database = database
        self.updates = AccountWriter(database, accounts=ACCOUNTS + 200)  # keys past ACCOUNTS are new
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Writes:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self.updates.stop()
        self._thread.join()

    def _run(self) -> None:
        closing = iter(range(ACCOUNTS - 400, ACCOUNTS, 20))
        while not self._stop.is_set():
            self.updates.run(0.3)
            first = next(closing, None)
            if first is not None:
                keys = [[f"acct-{n:03d}"] for n in range(first, first + 20)]
                with self.database.batch() as batch:
                    batch.delete("Accounts", keyset=KeySet(keys=keys))  # type: ignore[no-untyped-call]


def backfill_records(kafka: str, prefix: str) -> dict[str, bytes | None]:
    """The newest record of every key on the backfills topic."""
    return {
        key.decode(): value
        for _, _, key, value in read_all(kafka, Topics(prefix).backfills)
        if key is not None
    }


def plans(kafka: str, prefix: str) -> dict[str, dict[str, Any]]:
    """Each table's newest backfill record."""
    return {
        key.removeprefix("table/"): json.loads(value)
        for key, value in backfill_records(kafka, prefix).items()
        if key.startswith("table/") and value is not None
    }


def finished_tables(kafka: str, prefix: str) -> set[str]:
    return {table for table, plan in plans(kafka, prefix).items() if plan["finished"]}


def backfilled_accounts(kafka: str, prefix: str) -> list[tuple[str, str]]:
    """(Id, uuid) of every backfill event on the Accounts topic."""
    return [
        (event.key["Id"], event.value["uuid"])
        for event in read_events(kafka, prefix, "Accounts")
        if event.value["read_method"] == READ_METHOD_BACKFILL
    ]


def assert_no_watermark_passes_the_snapshot_before_its_rows(
    kafka: str, prefix: str, table: str, snapshot: int
) -> None:
    """On every Kafka partition of ``table``'s topic, each backfill row is first published
    before the first watermark at or past the snapshot (what a consumer's cut relies on)."""
    events, watermarks = read_topic(kafka, prefix, table)
    passed_at: dict[int, int] = {}
    for partition, offset, watermark in watermarks:
        if watermark.watermark_micros >= snapshot:
            passed_at[partition] = min(passed_at.get(partition, offset), offset)
    assert passed_at, "no watermark passed the snapshot"
    first: dict[str, Received] = {}
    for event in events:
        if event.value["read_method"] == READ_METHOD_BACKFILL:
            first.setdefault(event.value["uuid"], event)
    late = [e for e in first.values() if e.offset > passed_at.get(e.partition, e.offset)]
    assert not late, f"{len(late)} backfill rows first published after a watermark past the snapshot"


def backfill_on_status_page(port: int) -> set[str]:
    """The tables the producer's status page lists as finished in its backfill table."""
    document = json.loads(fetch(port, "/status.json") or "{}")
    for table in document.get("tables", []):
        if table["title"].startswith("Backfill"):
            return {row[0] for row in table["rows"] if row[3] == "finished"}
    return set()


@pytest.mark.spark
def test_a_backfill_killed_midway_resumes_and_the_replica_equals_spanner(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """50,000 rows in two tables; updates, inserts and deletes while the backfill runs; the
    producer SIGKILLed in the middle of it and started again without --backfill (a started
    backfill finishes). Every row of the snapshot is published, from that one snapshot, the
    resumed run going on from its checkpoint; no watermark passes the snapshot before its rows;
    the replica — through the broker, Spark and DuckDB — equals Spanner row for row."""
    spanner, kafka = stack.endpoint("spanner"), stack.endpoint("kafka")
    database = bank_with_accounts_and_orders(spanner)
    prefix = unique_prefix("backfill")
    command = produce_command(spanner, kafka, database, "Bank", prefix, "--backfill-parallelism", "1")
    log = (tmp_path / "producer.log").open("w")
    with Writes(database) as writes:
        killed = subprocess.Popen([*command, "--backfill"], stderr=log)
        try:
            wait_for(
                lambda: plans(kafka, prefix).get("Accounts", {}).get("after_key") is not None,
                120,
                "a first backfill checkpoint",
            )
        finally:
            killed.send_signal(signal.SIGKILL)
            killed.wait()
        finished_before = finished_tables(kafka, prefix)
        assert finished_before != {"Accounts", "Orders"}, "the backfill ended before the kill"
        before_kill = len(backfilled_accounts(kafka, prefix))
        port = free_port()
        resumed = subprocess.Popen([*command, "--metrics-port", str(port)], stderr=log)
        try:
            wait_for(lambda: finished_tables(kafka, prefix) == {"Accounts", "Orders"}, 180, "the backfill")
            # The resumed run lists the tables it backfills: Accounts may have finished before the kill.
            wait_for(
                lambda: backfill_on_status_page(port) == {"Accounts", "Orders"} - finished_before,
                30,
                "the status page",
            )
        finally:
            log.close()
            stop_with_sigterm(resumed, 60, tmp_path / "producer.log")
    assert resumed.returncode == 0, (tmp_path / "producer.log").read_text()[-3000:]
    # Everything committed up to now, then the consumer.
    produce_to_now(producer_config(spanner, kafka, database, "Bank", topic_prefix=prefix))
    snapshots = {plan["snapshot_micros"] for plan in plans(kafka, prefix).values()}
    assert len(snapshots) == 1, "a table was read again at another snapshot instead of going on"
    snapshot_micros = snapshots.pop()
    with database.snapshot(read_timestamp=datetime_from_micros(snapshot_micros)) as snapshot:
        at_snapshot = {row[0] for row in snapshot.execute_sql("SELECT Id FROM Accounts")}
    published = backfilled_accounts(kafka, prefix)
    backfilled = collections.defaultdict(set)
    for key, uuid_ in published:
        backfilled[key].add(uuid_)
    assert set(backfilled) == at_snapshot, "the backfill is not the table at its snapshot"
    assert all(len(uuids) == 1 for uuids in backfilled.values()), "a row published again got a new uuid"
    assert len(published) - len(at_snapshot) < before_kill, "the resumed backfill started over"
    # Orders is read after Accounts (one table at a time): by then the change stream's own
    # watermark is well past the snapshot, and only the backfill's hold keeps it back.
    for table in ("Accounts", "Orders"):
        assert_no_watermark_passes_the_snapshot_before_its_rows(kafka, prefix, table, snapshot_micros)
    assert len(writes.updates.committed) > 20

    config = consumer_config(kafka, prefix, tmp_path / "consumer", max_events_per_batch=20_000)
    run_consumer(spark, config)
    with database.snapshot(multi_use=True) as snapshot:
        accounts = sorted(tuple(r) for r in snapshot.execute_sql("SELECT Id, Balance FROM Accounts"))
        orders = sorted(
            tuple(r) for r in snapshot.execute_sql("SELECT Region, OrderId, Amount, Note FROM Orders")
        )
    assert len(accounts) > ACCOUNTS - 400 and len(orders) == ORDERS
    assert sorted(replica_rows(config, "Accounts", '"Id", "Balance"')) == accounts
    assert sorted(replica_rows(config, "Orders", '"Region", "OrderId", "Amount", "Note"')) == orders
