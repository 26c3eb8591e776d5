"""Bad input and unreachable services: one clear line, a non-zero exit, no traceback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from spanner_cdc.producer.publish.kafka import KafkaClient
from spanner_cdc.schemas.timestamps import format_timestamp_micros, now_micros
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from testkit.scrape import scrape
from testkit.spanner_db import create_database
from tests.support.churn import ACCOUNTS_DDL, produce_command
from tests.support.kafka_read import read_all, read_events
from tests.support.produce_process import published_ids, run_until_published, upsert_account

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bank(stack: EmbeddedStack) -> Any:
    return create_database(stack.endpoint("spanner"), ACCOUNTS_DDL)


def run_produce(
    stack: EmbeddedStack, database: Any, *extra: str, stream: str = "Bank", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = produce_command(
        stack.endpoint("spanner"),
        stack.endpoint("kafka"),
        database,
        stream,
        f"err-{uuid.uuid4().hex[:6]}",
        *extra,
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPANNER_CDC_")}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env={**clean, **(env or {})},
                          check=False)  # fmt: skip


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *phrases: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    for phrase in phrases:
        assert phrase in last, last


@pytest.mark.parametrize(
    ("extra", "stream", "phrases"),
    [
        ((), "Bank; DROP TABLE Accounts", ("not a valid identifier",)),
        ((), "Bank'--", ("not a valid identifier",)),
        ((), "my stream", ("not a valid identifier",)),
        (("--heartbeat-ms", "99"), "Bank", ("--heartbeat-ms", "between 100 and 300000")),
        (("--heartbeat-ms", "soon"), "Bank", ("--heartbeat-ms", "'soon'")),
        (("--start-timestamp", "2999-01-01T00:00:00Z"), "Bank", ("in the future",)),
        (("--start-timestamp", "yesterday"), "Bank", ("--start-timestamp", "RFC 3339")),
        (("--end-timestamp", "2000-01-01T00:00:00Z"), "Bank", ("before --start-timestamp",)),
        (("--include-tables", "Accounts'; --"), "Bank", ("--include-tables",)),
        (("--kafka-config", "acks"), "Bank", ("KEY=VALUE",)),
        (("--topic-partitions", "0"), "Bank", ("--topic-partitions",)),
        (("--schema-registry-url", "registry:8081"), "Bank", ("--schema-registry-url", "not an http(s) URL")),
        (("--group", "g", "--backfill"), "Bank", ("--backfill runs in one process",)),
        (("--group", "g", "--group-session-timeout", "2"), "Bank", ("--group-session-timeout", "6-300")),
        (("--group", "G!"), "Bank", ("--group",)),
        (("--group", "g", "--group-shards", "1"), "Bank", ("--group-shards",)),
    ],
)
def test_invalid_options_exit_2(stack: EmbeddedStack, bank: Any, extra: tuple[str, ...], stream: str,
                                phrases: tuple[str, ...]) -> None:  # fmt: skip
    assert_one_line_error(run_produce(stack, bank, *extra, stream=stream), 2, *phrases)


def test_invalid_environment_value_names_the_variable(stack: EmbeddedStack, bank: Any) -> None:
    result = run_produce(stack, bank, env={"SPANNER_CDC_MAX_QUERIES": "many"})
    assert_one_line_error(result, 2, "SPANNER_CDC_MAX_QUERIES", "'many'")


def test_config_file_values_and_mistakes(stack: EmbeddedStack, bank: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[produce]\nmax_queries = 0\n")
    assert_one_line_error(run_produce(stack, bank, "--config", str(bad)), 2, "max_queries", "'0'")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[produce]\nheartbeat = 1000\n")
    assert_one_line_error(
        run_produce(stack, bank, "--config", str(unknown)), 2, "unknown option", "heartbeat"
    )
    broken = tmp_path / "broken.toml"
    broken.write_text("[produce\n")
    assert_one_line_error(run_produce(stack, bank, "--config", str(broken)), 2, "not valid TOML")


def test_missing_required_option(stack: EmbeddedStack) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPANNER_CDC_")}
    result = subprocess.run([sys.executable, "-m", "spanner_cdc.cli", "produce", "--project", "p"],
                            capture_output=True, text=True, env=clean, check=False)  # fmt: skip
    assert_one_line_error(result, 2, "--instance is required")


def test_missing_change_stream(stack: EmbeddedStack, bank: Any) -> None:
    assert_one_line_error(run_produce(stack, bank, stream="NoSuchStream"), 1, "'NoSuchStream' does not exist")


def test_an_unreachable_schema_registry_is_one_line(stack: EmbeddedStack, bank: Any) -> None:
    url = f"http://writer:hunter2@127.0.0.1:{free_port()}"
    result = run_produce(stack, bank, "--schema-registry-url", url)
    assert_one_line_error(result, 1, "schema registry at http://writer:<hidden>@127.0.0.1", "does not answer")
    assert "hunter2" not in result.stderr + result.stdout


def test_missing_database(stack: EmbeddedStack) -> None:
    class Missing:
        database_id = "no-such-db"

    assert_one_line_error(run_produce(stack, Missing()), 1, "no-such-db does not exist")


def test_start_outside_retention(stack: EmbeddedStack, bank: Any) -> None:
    result = run_produce(stack, bank, "--start-timestamp", "2020-01-01T00:00:00Z")
    assert_one_line_error(result, 1, "too far in the past")


@pytest.mark.parametrize(
    ("key", "value", "phrase"),
    [
        (b"t1", b"\x00\xffnot json", "is not a checkpoint record"),
        (b"t1", b"[1, 2]", "not a JSON object"),
        (b"t1", b'{"token": 5}', "'token' is not a non-empty string"),
        (
            b"t1",
            b'{"token": "t1", "parents": ["<root>"], "start_micros": 1, "state": "DONE", '
            b'"checkpoint_micros": 1}',
            "'state' is not one of",
        ),
        (
            b"other",
            b'{"token": "t1", "parents": [], "start_micros": 1, "state": "RUNNING", "checkpoint_micros": 1}',
            "key is not its token",
        ),
    ],
)
def test_a_damaged_checkpoint_topic_is_one_line_not_a_traceback(
    stack: EmbeddedStack, bank: Any, key: bytes, value: bytes, phrase: str
) -> None:
    prefix = f"ckpt-{uuid.uuid4().hex[:6]}"

    async def write_garbage() -> None:
        kafka = KafkaClient(stack.endpoint("kafka"), prefix, {}, 1, -1)
        async with kafka.serving():
            await kafka.ensure_topic(kafka.topics.checkpoints, compacted=True)
            await kafka.produce_acknowledged(kafka.topics.checkpoints, key, value)

    asyncio.run(write_garbage())
    command = produce_command(stack.endpoint("spanner"), stack.endpoint("kafka"), bank, "Bank", prefix)
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert_one_line_error(result, 1, f"{Topics(prefix).checkpoints} offset 0", phrase)


@pytest.mark.parametrize(
    ("shards", "extra", "phrase"),
    [(1, ("--group", "g"), "has one shard"), (4, (), "has 4 shards: a --group reads this topic prefix")],
)
def test_a_group_and_a_single_producer_refuse_each_others_prefix(
    stack: EmbeddedStack, bank: Any, shards: int, extra: tuple[str, ...], phrase: str
) -> None:
    """The checkpoint topic's shards are fixed when it is created: a group cannot share a
    single producer's prefix, nor a single producer read a group's."""
    prefix = f"shards-{uuid.uuid4().hex[:6]}"
    kafka = KafkaClient(stack.endpoint("kafka"), prefix, {}, 1, -1)
    asyncio.run(kafka.ensure_checkpoint_topic(shards))
    command = produce_command(
        stack.endpoint("spanner"), stack.endpoint("kafka"), bank, "Bank", prefix, *extra
    )
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert_one_line_error(result, 2, phrase)


def test_a_table_filter_that_matches_no_table_is_a_warning(stack: EmbeddedStack, bank: Any) -> None:
    start = now_micros()
    end = start + 2_000_000
    result = run_produce(
        stack, bank, "--include-tables", "Acounts", "--start-timestamp", format_timestamp_micros(start),
        "--end-timestamp", format_timestamp_micros(end),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "table filter 'Acounts' matches no table" in result.stderr


def test_unreachable_broker(stack: EmbeddedStack, bank: Any) -> None:
    command = produce_command(stack.endpoint("spanner"), f"127.0.0.1:{free_port()}", bank, "Bank", "x",
                              "--connect-timeout-seconds", "3")  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert_one_line_error(result, 1, "does not answer")


def test_unreachable_spanner(stack: EmbeddedStack, bank: Any) -> None:
    command = produce_command(f"127.0.0.1:{free_port()}", stack.endpoint("kafka"), bank, "Bank", "x",
                              "--connect-timeout-seconds", "3")  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert_one_line_error(result, 1, "Spanner does not answer within 3s")


def test_sigterm_flushes_checkpoints_and_exits_0(stack: EmbeddedStack, bank: Any) -> None:
    """SIGTERM stops reading, flushes and checkpoints; metrics were served while it ran."""
    prefix = f"term-{uuid.uuid4().hex[:6]}"
    port = free_port()
    command = produce_command(stack.endpoint("spanner"), stack.endpoint("kafka"), bank, "Bank", prefix,
                              "--metrics-port", str(port))  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert "queries_started_total" in scrape(port, "queries_started_total"), "the producer never started"
        with bank.batch() as batch:
            batch.insert_or_update("Accounts", columns=["Id", "Balance"], values=[["term", 1]])
        metrics = scrape(port, "spanner_cdc_producer_events_total{")
        assert 'spanner_cdc_producer_events_total{change_type="INSERT",table="Accounts"} 1.0' in metrics
        assert "spanner_cdc_producer_commit_to_ack_seconds_count 1.0" in metrics
        assert 'spanner_cdc_producer_partitions{state="RUNNING"}' in metrics
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert [e.value["payload"]["Id"] for e in read_events(stack.endpoint("kafka"), prefix, "Accounts")] == [
        "term"
    ]
    assert "Traceback" not in stderr


def test_a_forged_finished_checkpoint_does_not_skip_changes(stack: EmbeddedStack, bank: Any) -> None:
    """Anyone who can produce to ``_checkpoints`` can mark the running partitions FINISHED: the
    next run used to skip their changes (and their descendants'), here the rest of the stream."""
    prefix = f"forge-{uuid.uuid4().hex[:6]}"
    kafka = stack.endpoint("kafka")
    run_until_published(stack, bank, prefix, "before")
    newest = {key: value for _, _, key, value in read_all(kafka, Topics(prefix).checkpoints) if key and value}
    forged = []
    for key, value in newest.items():
        record = json.loads(value)
        if record["state"] == "RUNNING":
            forged.append((key, json.dumps({**record, "state": "FINISHED"}).encode()))
    assert forged, "no running partition was checkpointed"

    async def publish_forged() -> None:
        client = KafkaClient(kafka, prefix, {}, topic_partitions=1, replication_factor=-1)
        async with client.serving():
            for key, value in forged:
                await client.produce_acknowledged(client.topics.checkpoints, key, value)

    asyncio.run(publish_forged())
    upsert_account(bank, "after")  # committed while no producer runs: the next run must read it
    run_until_published(stack, bank, prefix, "unrelated")
    assert {"before", "after"} <= published_ids(stack, prefix)


def test_a_database_role_and_an_rpc_priority_are_accepted(stack: EmbeddedStack, bank: Any) -> None:
    """The emulator ignores both (it has no fine-grained access control), so this proves only that
    the queries carry them without error; tests/unit/common/test_spanner_access.py covers the rest."""
    prefix = f"access-{uuid.uuid4().hex[:6]}"
    run_until_published(
        stack, bank, prefix, "with-role", "--database-role", "cdc_reader", "--rpc-priority", "low"
    )
    assert "with-role" in published_ids(stack, prefix)
