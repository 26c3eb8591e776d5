"""``spanner-cdc consume`` with bad options or unreachable services: one line, a non-zero exit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from tests.support.command_line import spanner_cdc

pytestmark = pytest.mark.integration
EXIT_USAGE, EXIT_FAILURE = 2, 1


def consume(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return spanner_cdc("consume", "--output-dir", str(tmp_path), *args, timeout=120)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topic-prefix", "P"], "--kafka-bootstrap is required"),
        (["--kafka-bootstrap", "h:1"], "--topic-prefix is required"),
        (
            ["--kafka-bootstrap", "h:1", "--topic-prefix", "P", "--replica", "postgres"],
            "needs --postgres-dsn",
        ),
        (["--kafka-bootstrap", "h:1", "--topic-prefix", "P", "--sinks", "replica,console"], "--sinks"),
        (["--kafka-bootstrap", "h:1", "--topic-prefix", "P", "--tables", "x';drop"], "--tables"),
        (["--kafka-bootstrap", "h:1", "--topic-prefix", "P", "--max-events-per-batch", "0"], "between 1"),
        (["--kafka-bootstrap", "h:1", "--topic-prefix", "P", "--on-bad-message", "drop"], "quarantine, fail"),
        (
            ["--kafka-bootstrap", "h:1", "--topic-prefix", "P", "--schema-registry-url", "ftp://r"],
            "is not an http(s) URL",
        ),
    ],
)
def test_bad_options_fail_fast_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = consume(tmp_path, *args)
    assert result.returncode == EXIT_USAGE
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_unreachable_kafka_is_one_line(tmp_path: Path) -> None:
    unreachable = f"127.0.0.1:{free_port()}"
    result = consume(
        tmp_path, "--kafka-bootstrap", unreachable, "--topic-prefix", "P", "--connect-timeout-seconds", "3"
    )
    assert result.returncode == EXIT_FAILURE
    assert "unreachable" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_postgres_replica_is_one_line(tmp_path: Path, stack: EmbeddedStack) -> None:
    dsn = f"postgresql://nobody@127.0.0.1:{free_port()}/db"
    args = ["--kafka-bootstrap", stack.endpoint("kafka"), "--topic-prefix", "P", "--replica", "postgres"]
    result = consume(tmp_path, *args, "--postgres-dsn", dsn)
    assert result.returncode == EXIT_FAILURE
    assert "cannot connect to the PostgreSQL replica" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        ("postgresql://nobody:hunter2@127.0.0.1:{port}/db", "cannot connect to the PostgreSQL replica"),
        ("host=127.0.0.1 password=hunter2 oops", "does not parse"),
        ("postgresql://nobody:hun ter2@127.0.0.1:{port}/db", "does not parse"),
    ],
)
def test_a_replica_password_never_reaches_the_screen(
    tmp_path: Path, stack: EmbeddedStack, dsn: str, message: str
) -> None:
    """libpq's own errors quote a connection string that does not parse, password and all."""
    args = ["--kafka-bootstrap", stack.endpoint("kafka"), "--topic-prefix", "P", "--replica", "postgres"]
    result = consume(tmp_path, *args, "--postgres-dsn", dsn.format(port=free_port()))
    assert result.returncode == EXIT_FAILURE, result.stderr
    assert message in result.stderr
    assert "hunter2" not in result.stderr + result.stdout and "ter2" not in result.stderr


def test_an_unreachable_schema_registry_is_one_line(tmp_path: Path, stack: EmbeddedStack) -> None:
    url = f"http://reader:hunter2@127.0.0.1:{free_port()}"
    args = ["--kafka-bootstrap", stack.endpoint("kafka"), "--topic-prefix", "P"]
    result = consume(tmp_path, *args, "--schema-registry-url", url)
    assert result.returncode == EXIT_FAILURE
    assert "schema registry at http://reader:<hidden>@127.0.0.1" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
