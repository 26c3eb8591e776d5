"""``make demo``: the whole pipeline on the embedded stack, then a verification report.

Creates a bank database (Accounts with a commit-timestamp column, Transfers, one change stream
with NEW_ROW_AND_OLD_VALUES), moves money between accounts in read-write transactions while
recording each transfer and deleting some old ones, then runs the producer over that time
window and the consumer over the topics, and compares the replica with Spanner.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.cloud.spanner import COMMIT_TIMESTAMP, KeySet

from consumer.batch import ReplicaCommit
from consumer.config import ConsumerConfig
from consumer.main import consume
from consumer.readers import changelog_rows, replica_rows
from producer.config import ProducerConfig
from producer.main import produce
from producer.records import timestamp_micros
from spanner_cdc.spanner_client import create_emulator_database
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.services import EMULATOR_PROJECT

STREAM = "BankStream"
ACCOUNTS = 20
INITIAL_BALANCE = 1_000
DDL = [
    "CREATE TABLE Accounts (Id STRING(36) NOT NULL, Balance INT64 NOT NULL, "
    "LastUpdate TIMESTAMP OPTIONS (allow_commit_timestamp=true)) PRIMARY KEY (Id)",
    "CREATE TABLE Transfers (Id INT64 NOT NULL, FromId STRING(36), ToId STRING(36), Amount INT64) "
    "PRIMARY KEY (Id)",
    f"CREATE CHANGE STREAM {STREAM} FOR ALL OPTIONS (value_capture_type='NEW_ROW_AND_OLD_VALUES')",
]


@dataclass
class BankWorkload:
    """Transfers between random accounts; every change it commits is counted."""

    database: Any
    changes: int = 0
    transfers: int = 0

    def open_accounts(self) -> None:
        with self.database.batch() as batch:
            batch.insert(
                "Accounts",
                columns=["Id", "Balance", "LastUpdate"],
                values=[[f"acct-{n:03d}", INITIAL_BALANCE, COMMIT_TIMESTAMP] for n in range(ACCOUNTS)],
            )
        self.changes += ACCOUNTS

    def run(self, seconds: float, rate: float) -> None:
        rng = random.Random(1)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            source, target = rng.sample(range(ACCOUNTS), 2)
            amount = rng.randint(1, 100)
            transfer_id = self.transfers + 1
            # Counted after the commit: Spanner may run the function again when it aborts.
            self.changes += self.database.run_in_transaction(
                self._transfer, transfer_id, f"acct-{source:03d}", f"acct-{target:03d}", amount
            )
            self.transfers = transfer_id
            time.sleep(1 / rate)

    @staticmethod
    def _transfer(transaction: Any, transfer_id: int, source: str, target: str, wanted: int) -> int:
        """Move up to ``wanted`` from source to target and record it; returns the changes made."""
        rows = transaction.read("Accounts", ["Id", "Balance"], keyset=_keys(source, target))
        balances = dict(rows)
        amount = min(balances[source], wanted)
        transaction.update(
            "Accounts",
            columns=["Id", "Balance", "LastUpdate"],
            values=[
                [source, balances[source] - amount, COMMIT_TIMESTAMP],
                [target, balances[target] + amount, COMMIT_TIMESTAMP],
            ],
        )
        transaction.insert(
            "Transfers",
            columns=["Id", "FromId", "ToId", "Amount"],
            values=[[transfer_id, source, target, amount]],
        )
        if transfer_id % 5 == 0:  # keep the Transfers table short: delete an old one now and then
            transaction.delete("Transfers", KeySet(keys=[[transfer_id - 4]]))  # type: ignore[no-untyped-call]
            return 4
        return 3


@dataclass
class BalanceWatch:
    """After every committed replica batch: the sum of balances (the bank invariant)."""

    sums: list[int] = field(default_factory=list)

    def __call__(self, commit: ReplicaCommit) -> None:
        exists = commit.query("SELECT count(*) FROM information_schema.tables WHERE table_name = 'Accounts'")
        if not exists[0][0]:
            return  # the cut has not reached the accounts' opening yet
        total = commit.query('SELECT count(*), coalesce(sum("Balance"), 0) FROM "Accounts"')
        if total[0][0]:
            self.sums.append(int(total[0][1]))


def _keys(*ids: str) -> Any:
    return KeySet(keys=[[i] for i in ids])  # type: ignore[no-untyped-call]


def run_demo(seconds: float, rate: float, replica: str) -> int:
    """Returns the exit code: 0 when every check holds."""
    workdir = Path(tempfile.mkdtemp(prefix="spanner-cdc-demo-"))
    stack = EmbeddedStack.start()
    try:
        spanner, kafka = stack.endpoint("spanner"), stack.endpoint("kafka")
        database_id = f"bank-{dt.datetime.now(dt.UTC):%H%M%S}"
        database = create_emulator_database(spanner, EMULATOR_PROJECT, "demo", database_id, DDL)
        print(f"[1/4] database {database_id}: Accounts, Transfers, change stream {STREAM}")
        start = timestamp_micros(dt.datetime.now(dt.UTC))
        workload = BankWorkload(database)
        workload.open_accounts()
        workload.run(seconds, rate)
        end = timestamp_micros(dt.datetime.now(dt.UTC))  # every commit of the workload is at or before it
        print(
            f"[2/4] committed {workload.changes} changes ({workload.transfers} transfers) in {seconds:.0f} s"
        )
        producer = ProducerConfig(
            project=EMULATOR_PROJECT,
            instance="demo",
            database=database_id,
            change_stream=STREAM,
            kafka_bootstrap=kafka,
            emulator_host=spanner,
            start_timestamp_micros=start,
            end_timestamp_micros=end,
            heartbeat_ms=1000,
        )
        started = time.monotonic()
        asyncio.run(produce(producer))
        print(
            f"[3/4] producer: every partition read to the end timestamp in {time.monotonic() - started:.1f} s"
        )
        consumer = ConsumerConfig(
            kafka_bootstrap=kafka,
            topic_prefix=STREAM,
            output_dir=workdir,
            checkpoint_dir=workdir / "checkpoint",
            available_now=True,
            replica=replica,
            postgres_dsn=stack.endpoint("postgres") if replica == "postgres" else None,
        )
        started = time.monotonic()
        watch = BalanceWatch()
        consume(consumer, watch)
        print(
            f"[4/4] consumer: changelog and {replica} replica written in {time.monotonic() - started:.1f} s"
        )
        return report(database, consumer, workload, watch)
    finally:
        stack.stop()


TABLE_COLUMNS = {"Accounts": ("Id", "Balance"), "Transfers": ("Id", "FromId", "ToId", "Amount")}


def report(database: Any, config: ConsumerConfig, workload: BankWorkload, watch: BalanceWatch) -> int:
    """Print each check; 0 when all hold."""
    expected = ACCOUNTS * INITIAL_BALANCE
    checks: list[tuple[str, bool]] = [
        (
            f"sum of balances {expected} at every one of {len(watch.sums)} replica commits with accounts",
            bool(watch.sums) and set(watch.sums) == {expected},
        )
    ]
    changelog = 0
    for table, columns in TABLE_COLUMNS.items():
        names = ", ".join(columns)
        with database.snapshot() as snapshot:
            source = sorted(tuple(row) for row in snapshot.execute_sql(f"SELECT {names} FROM {table}"))
        replica = replica_rows(config, table, ", ".join(f'"{c}"' for c in columns))
        checks.append(
            (
                f"{table}: Spanner {len(source)} rows = replica {len(replica)} rows, row for row",
                source == replica,
            )
        )
        changelog += len(changelog_rows(config, table, '"envelope$uuid"'))
    checks.append(
        (f"changelog rows {changelog} = changes committed {workload.changes}", changelog == workload.changes)
    )
    total = sum(int(row[1]) for row in replica_rows(config, "Accounts", '"Id", "Balance"'))
    checks.append(
        (
            f"sum of balances in the replica {total} = {ACCOUNTS * INITIAL_BALANCE}",
            total == ACCOUNTS * INITIAL_BALANCE,
        )
    )
    for text, held in checks:
        print(f"  {'ok  ' if held else 'FAIL'} {text}")
    print(f"  outputs: {config.output_dir} (changelog/, replica, quarantine/)")
    return 0 if all(held for _, held in checks) else 1
