"""The demo's bank: its schema, a transfer workload, and the invariant a replica must keep.

Accounts (with a commit-timestamp column) and Transfers, one change stream with
NEW_ROW_AND_OLD_VALUES over both. Each transfer is one read-write transaction that moves money
between two accounts and records it — the AccountBalance example of Spanner's change-stream
documentation — so a replica that shows a transfer half applied breaks the invariant: the sum
of balances never changes.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from google.cloud.spanner import COMMIT_TIMESTAMP, KeySet

from spanner_cdc.common.spanner_client import create_emulator_database, emulator_client
from spanner_cdc.consumer.sinks.replica.sink import ReplicaCommit

STREAM = "BankStream"
ACCOUNTS = 20
INITIAL_BALANCE = 1_000
TOTAL = ACCOUNTS * INITIAL_BALANCE
DDL = [
    "CREATE TABLE Accounts (Id STRING(36) NOT NULL, Balance INT64 NOT NULL, "
    "LastUpdate TIMESTAMP OPTIONS (allow_commit_timestamp=true)) PRIMARY KEY (Id)",
    "CREATE TABLE Transfers (Id INT64 NOT NULL, FromId STRING(36), ToId STRING(36), Amount INT64) "
    "PRIMARY KEY (Id)",
    f"CREATE CHANGE STREAM {STREAM} FOR ALL OPTIONS (value_capture_type='NEW_ROW_AND_OLD_VALUES')",
]
#: The schema change the demo makes while changes flow.
ADD_MEMO = "ALTER TABLE Transfers ADD COLUMN Memo STRING(MAX)"
#: What the report compares, per table (Memo exists only after ADD_MEMO).
TABLE_COLUMNS = {"Accounts": ("Id", "Balance"), "Transfers": ("Id", "FromId", "ToId", "Amount")}


def ensure_demo_database(host: str, project: str, instance: str, database: str) -> bool:
    """The bank database on the emulator at ``host``, created unless it exists; True if created."""
    if emulator_client(host, project).instance(instance).database(database).exists():
        return False
    create_emulator_database(host, project, instance, database, DDL)
    return True


@dataclass
class BankWorkload:
    """Transfers between random accounts; every change it commits is counted."""

    database: Any
    changes: int = 0
    transfers: int = 0
    #: Set once ADD_MEMO ran: transfers then fill the new column.
    with_memo: bool = False
    stop: threading.Event = field(default_factory=threading.Event)

    def open_accounts(self) -> None:
        with self.database.batch() as batch:
            batch.insert(
                "Accounts",
                columns=["Id", "Balance", "LastUpdate"],
                values=[[f"acct-{n:03d}", INITIAL_BALANCE, COMMIT_TIMESTAMP] for n in range(ACCOUNTS)],
            )
        self.changes += ACCOUNTS

    def add_memo_column(self) -> None:
        self.database.update_ddl([ADD_MEMO]).result(120)
        self.with_memo = True

    def run(self, seconds: float, rate: float) -> None:
        rng = random.Random(self.transfers + 1)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.stop.is_set():
            source, target = rng.sample(range(ACCOUNTS), 2)
            transfer_id = self.transfers + 1
            # Counted after the commit: Spanner may run the function again when it aborts.
            self.changes += self.database.run_in_transaction(
                self._transfer, transfer_id, f"acct-{source:03d}", f"acct-{target:03d}", rng.randint(1, 100)
            )
            self.transfers = transfer_id
            time.sleep(1 / rate)

    def _transfer(self, transaction: Any, transfer_id: int, source: str, target: str, wanted: int) -> int:
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
        columns, values = ["Id", "FromId", "ToId", "Amount"], [transfer_id, source, target, amount]
        if self.with_memo:
            columns, values = [*columns, "Memo"], [*values, f"transfer {transfer_id}"]
        transaction.insert("Transfers", columns=columns, values=[values])
        if transfer_id % 5 == 0:  # keep the Transfers table short: delete an old one now and then
            transaction.delete("Transfers", _keys(transfer_id - 4))
            return 4
        return 3


def _keys(*ids: str | int) -> Any:
    return KeySet(keys=[[i] for i in ids])  # type: ignore[no-untyped-call]


@dataclass
class BalanceWatch:
    """After every committed replica batch: the sum of balances (the bank invariant)."""

    sums: list[int] = field(default_factory=list)

    def __call__(self, commit: ReplicaCommit) -> None:
        if not commit.has_table("Accounts"):
            return  # the cut has not reached the accounts' opening yet
        total = commit.query('SELECT count(*), coalesce(sum("Balance"), 0) FROM "Accounts"')
        if total[0][0]:
            self.sums.append(int(total[0][1]))

    @property
    def held(self) -> bool:
        """Was the sum the opening total at every commit that had accounts (and was there one)?"""
        return bool(self.sums) and set(self.sums) == {TOTAL}
