"""Recorded change records (JSON form) for tests and benchmarks that need no emulator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
STREAM_NAME = "projects/demo/instances/demo/databases/bank/changeStreams/BankStream"


def account_transfer_records() -> list[dict[str, Any]]:
    """The change-stream documentation's transfer between two accounts: two records of one transaction."""
    records: list[dict[str, Any]] = json.loads((DATA / "account_transfer.json").read_text())["records"]
    return records
