"""Credentials reach no screen, log, state file or metrics page.

The two long-running commands run for real against the embedded stack with a password in the
PostgreSQL connection string (the server's real one, so the consumer connects with it) and a
SASL password in ``--kafka-config``: the producer until it has published a change, the consumer
until it has written that change to the PostgreSQL replica. Afterwards neither secret may appear
in what they printed, in any file under their working and output directories (logs, Spark's
checkpoint and logs, the dedupe and schema stores) or on their ``/metrics`` and status pages. The other
paths are tested where they live: ``stack up``/``status`` and ``state.json`` in
``test_embedded_stack.py``, connection strings that do not parse or servers that do not answer
in ``test_consumer_errors.py``, refused ``--kafka-config`` entries in ``test_producer_config.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from testkit.consumer_run import fresh_postgres_database
from testkit.scrape import fetch, scrape
from testkit.spanner_db import create_database
from tests.support.churn import ACCOUNTS_DDL, produce_command

pytestmark = [pytest.mark.integration, pytest.mark.spark]

KAFKA_SECRET = f"kafka-pw-{uuid.uuid4().hex}"
KAFKA_CONFIG = ["--kafka-config", "sasl.username=cdc", "--kafka-config", f"sasl.password={KAFKA_SECRET}"]


def dsn_with_password(stack: EmbeddedStack) -> tuple[str, str]:
    """A fresh replica database's connection string with the password in it, and the password."""
    dsn = fresh_postgres_database(stack.endpoint("postgres"))
    passfile = Path(str(conninfo_to_dict(dsn)["passfile"]))
    password = passfile.read_text().strip().split(":", 4)[4]
    return make_conninfo(dsn, passfile="", password=password), password


def command_env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPANNER_CDC_")}
    return {**clean, **extra}


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Commands started by the test; stopped (SIGTERM, then SIGKILL) also when it fails."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def run_until(
    command: list[str], cwd: Path, metrics_port: int, wanted: str, processes: list[subprocess.Popen[str]]
) -> tuple[str, str]:
    """Run ``command`` until its /metrics page shows ``wanted``; stop it; its output and page."""
    process = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=command_env()
    )
    processes.append(process)
    page = scrape(metrics_port, wanted, timeout=180)
    page += fetch(metrics_port) + fetch(metrics_port, "/status.json")
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert wanted in page, f"{command[3]} never showed {wanted}: {stderr[-2000:]}"
    return stdout + stderr, page


def files_holding(root: Path, secret: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_no_command_shows_a_secret(
    stack: EmbeddedStack, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    dsn, pg_secret = dsn_with_password(stack)
    secrets = (KAFKA_SECRET, pg_secret)
    prefix = f"sec{uuid.uuid4().hex[:6]}"
    database = create_database(stack.endpoint("spanner"), ACCOUNTS_DDL)

    producer_port = free_port()
    produce = produce_command(
        stack.endpoint("spanner"), stack.endpoint("kafka"), database, "Bank", prefix,
        *KAFKA_CONFIG, "--metrics-port", str(producer_port),
    )  # fmt: skip
    producer = subprocess.Popen(
        produce, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=command_env()
    )
    started.append(producer)
    scrape(producer_port, "spanner_cdc", timeout=120)
    database.run_in_transaction(
        lambda tx: tx.execute_update("INSERT INTO Accounts (Id, Balance) VALUES ('a', 1)")
    )
    producer_page = scrape(producer_port, 'table="Accounts"', timeout=120)
    producer.send_signal(signal.SIGTERM)
    producer_output = "".join(producer.communicate(timeout=120))
    assert 'table="Accounts"' in producer_page, producer_output[-2000:]

    consumer_port = free_port()
    output = tmp_path / "consumer"
    consume = [
        sys.executable, "-m", "spanner_cdc.cli", "consume", "--kafka-bootstrap", stack.endpoint("kafka"),
        "--topic-prefix", prefix, "--output-dir", str(output), "--replica", "postgres",
        "--postgres-dsn", dsn, "--trigger-seconds", "1", "--metrics-port", str(consumer_port),
        *KAFKA_CONFIG,
    ]  # fmt: skip
    consumer_output, consumer_page = run_until(
        consume, tmp_path, consumer_port, "spanner_cdc_consumer_events_total{", started
    )

    shown = {
        "produce output": producer_output,
        "produce /metrics": producer_page,
        "consume output": consumer_output,
        "consume /metrics": consumer_page,
    }
    for secret in secrets:
        assert [where for where, text in shown.items() if secret in text] == []
        assert files_holding(tmp_path, secret) == []
