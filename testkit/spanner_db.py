"""Creating emulator databases for tests, and reading a change stream the plain way."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

from google.cloud import spanner

from spanner_cdc.common.spanner_client import create_emulator_database
from spanner_cdc.schemas.timestamps import datetime_from_micros, timestamp_micros
from spanner_cdc.stack.services import EMULATOR_PROJECT

INSTANCE = "test-instance"
_database_numbers = itertools.count()


def create_database(emulator_host: str, ddl: list[str], dialect: str = "GOOGLE_STANDARD_SQL") -> Any:
    """A fresh database on the emulator (one instance per emulator, created on first use)."""
    name = f"db-{next(_database_numbers)}-{dt.datetime.now(dt.UTC):%H%M%S%f}"[:30]
    return create_emulator_database(emulator_host, EMULATOR_PROJECT, INSTANCE, name, ddl, dialect=dialect)


def read_pg_change_stream(
    database: Any, stream: str, start: dt.datetime, end: dt.datetime
) -> list[dict[str, Any]]:
    """Every data change record of a PostgreSQL-dialect stream in [start, end], JSON form.

    Deliberately the simplest correct walk (sequential, children after the query that reported
    them); the producer is the real reader.
    """
    types = spanner.param_types
    query = f"SELECT * FROM spanner.read_json_{stream}($1, $2, $3, $4, null)"
    pending: list[tuple[str | None, dt.datetime]] = [(None, start)]
    seen: set[str] = set()
    records: list[dict[str, Any]] = []
    while pending:
        token, token_start = pending.pop()
        with database.snapshot() as snapshot:
            rows = snapshot.execute_sql(
                query,
                params={"p1": token_start, "p2": end, "p3": token, "p4": 1000},
                param_types={
                    "p1": types.TIMESTAMP,
                    "p2": types.TIMESTAMP,
                    "p3": types.STRING,
                    "p4": types.INT64,
                },
            )
            for (change_record,) in rows:
                if "data_change_record" in change_record:
                    records.append(change_record["data_change_record"])
                for child in change_record.get("child_partitions_record", {}).get("child_partitions", []):
                    if child["token"] not in seen:
                        seen.add(child["token"])
                        child_start = change_record["child_partitions_record"]["start_timestamp"]
                        pending.append((child["token"], datetime_from_micros(timestamp_micros(child_start))))
    return records
