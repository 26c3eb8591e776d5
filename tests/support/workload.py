"""Writers that commit changes to Spanner and remember exactly what they committed."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from spanner_cdc.schemas.timestamps import timestamp_micros


@dataclass(frozen=True)
class Committed:
    key: str
    balance: int
    commit_micros: int


@dataclass
class AccountWriter:
    """Updates random accounts, one or two per transaction, until stopped or ``max_seconds``.

    Every account's Balance is set to a value never used before, so each committed change is
    identifiable in the events by (key, balance).
    """

    database: Any
    table: str = "Accounts"
    accounts: int = 40
    committed: list[Committed] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self, max_seconds: float) -> None:
        rng = random.Random(7)
        counter = 0
        deadline = time.monotonic() + max_seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            keys = rng.sample(range(self.accounts), rng.choice((1, 2)))
            rows: list[tuple[str, int]] = []
            for key in keys:
                counter += 1
                rows.append((f"acct-{key:03d}", counter))
            with self.database.batch() as batch:
                batch.insert_or_update(
                    self.table, columns=["Id", "Balance"], values=[list(row) for row in rows]
                )
            commit = timestamp_micros(batch.committed)
            self.committed.extend(Committed(key, balance, commit) for key, balance in rows)

    def stop(self) -> None:
        self._stop.set()
