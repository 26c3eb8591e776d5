"""``spanner-cdc produce`` as a process: run it while a test changes Spanner, until Kafka shows
what the test waits for, then stop it the way an operator does (SIGTERM)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

from google.cloud.spanner_v1 import KeySet

from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from testkit.scrape import scrape
from tests.support.churn import produce_command
from tests.support.kafka_read import read_events
from tests.support.stopping import stop_with_sigterm


def upsert_account(database: Any, key: str) -> None:
    with database.batch() as batch:
        batch.insert_or_update("Accounts", columns=["Id", "Balance"], values=[[key, 1]])


def delete_account(database: Any, key: str) -> None:
    with database.batch() as batch:
        batch.delete("Accounts", KeySet(keys=[[key]]))  # type: ignore[no-untyped-call]


def published_ids(stack: EmbeddedStack, prefix: str) -> set[str]:
    return {e.value["payload"]["Id"] for e in read_events(stack.endpoint("kafka"), prefix, "Accounts")}


def run_producer_while(
    stack: EmbeddedStack,
    database: Any,
    prefix: str,
    act: Callable[[], None],
    done: Callable[[], bool],
    *extra: str,
    timeout: float = 90,
) -> None:
    """Start the producer (with ``extra`` options), ``act`` once it runs, stop it once ``done``
    (or after ``timeout`` seconds); it must exit 0."""
    port = free_port()
    command = produce_command(stack.endpoint("spanner"), stack.endpoint("kafka"), database, "Bank", prefix,
                              "--metrics-port", str(port), *extra)  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        scrape(port, "queries_started_total")
        act()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.poll() is None and not done():
            time.sleep(1)
    finally:
        stderr = stop_with_sigterm(process, 60)
    assert process.returncode == 0, stderr


def run_until_published(stack: EmbeddedStack, database: Any, prefix: str, key: str, *extra: str) -> None:
    """Run the producer until the upsert of ``key`` is on Kafka."""
    run_producer_while(
        stack,
        database,
        prefix,
        lambda: upsert_account(database, key),
        lambda: key in published_ids(stack, prefix),
        *extra,
    )
