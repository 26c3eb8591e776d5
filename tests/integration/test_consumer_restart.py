"""The consumer killed (SIGKILL) mid-run, between and inside micro-batches, then restarted.

Every sink must end up equal to an uninterrupted run over the same topics.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from spanner_cdc.consumer.config import ConsumerConfig
from spanner_cdc.consumer.readers import changelog_rows, delta_table
from spanner_cdc.schemas.events import Event
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import (
    CONSUMER_ENVIRONMENT,
    account_sinks,
    committed_batches,
    consume_command,
    consumed_to_the_end,
    consumer_config,
    expected_account_sinks,
    on_disk,
    run_consumer,
    unique_prefix,
)
from testkit.synthetic import ChangeFactory, final_rows, publish, random_history
from tests.support.object_store import ObjectStore
from tests.support.screen import foreign_lines

pytestmark = [pytest.mark.integration, pytest.mark.spark]
KILLS = 3


def wait_for_a_commit(
    process: subprocess.Popen[bytes], config: ConsumerConfig, before: int, log: Path
) -> None:
    """Until the run committed a batch of its own: Spark's start takes 10-20 s, longer on a
    loaded machine, and a kill before any progress would test nothing."""
    deadline = time.monotonic() + 300
    while committed_batches(config) <= before:
        assert process.poll() is None, f"the consumer exited: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, "no batch committed in 300 s"
        time.sleep(0.1)


def test_killed_consumer_restarts_to_the_same_sinks_as_an_uninterrupted_run(
    stack: EmbeddedStack, tmp_path: Path
) -> None:
    """What an uninterrupted run of the same topics makes: each key's last image in the replica,
    each change once in the changelog (the topics hold a tenth of the changes twice)."""
    prefix, events = published_history(stack)
    killed = consumer_config(stack.endpoint("kafka"), prefix, tmp_path / "killed")
    killed_then_finished(killed, tmp_path / "killed.log", KILLS)
    assert account_sinks(killed) == expected_account_sinks(events)


def test_a_killed_consumer_on_an_object_store_ends_with_each_change_once_in_delta(
    stack: EmbeddedStack, object_store: ObjectStore, tmp_path: Path
) -> None:
    """Every location on an object store (``s3a://``, moto's S3 server: Spark's checkpoint and
    the Delta tables through Hadoop's s3a, the consumer's own files through pyarrow's S3 file
    system) and the replica in Delta tables, which a kill leaves part-way through a batch: after
    the restarts the Delta tables (read by delta-rs) hold each key's last change, and the
    changelog every change once."""
    prefix, events = published_history(stack, 1500)
    bucket = object_store.bucket()
    killed = consumer_config(
        stack.endpoint("kafka"),
        prefix,
        f"s3a://{bucket}/killed",
        replica="delta",
        local_dir=tmp_path / "killed-local",
        spark_conf=object_store.spark_conf(bucket),
    )
    # Two kills: the third of the test above costs a Spark start on an object store.
    killed_then_finished(killed, tmp_path / "killed.log", KILLS - 1)
    accounts = delta_table(killed, "Accounts").uri
    assert object_store.delta_rows(accounts, '"Id", "Balance", "Note"') == final_rows(events)
    uuids = [row[0] for row in changelog_rows(killed, "Accounts", '"envelope$uuid"')]
    assert sorted(uuids) == sorted(e.value["uuid"] for e in events)
    keys = object_store.keys(bucket)
    assert any(k.startswith("killed/checkpoint/spark/commits/") for k in keys), keys[:20]
    assert any(k.startswith("killed/checkpoint/dedupe/batch-") for k in keys), keys[:20]
    assert any(k.startswith("killed/lakehouse/Accounts/_delta_log/") for k in keys), keys[:20]
    left = [k for k in keys if "/_staging/" in k or k.startswith("killed/replica-staging/batch-")]
    assert not left, f"staged files left behind: {left[:5]}"
    assert not (tmp_path / "killed").exists(), "a location of the object store was taken for a path"


def published_history(stack: EmbeddedStack, changes: int = 3000) -> tuple[str, list[Event]]:
    """``changes`` changes of a random history and a tenth of them again (a producer restart's
    duplicates), on topics of their own; their prefix, and the changes."""
    prefix = unique_prefix("K")
    events = random_history(ChangeFactory(), changes)
    publish(stack.endpoint("kafka"), prefix, events + random.Random(5).sample(events, changes // 10))
    return prefix, events


def killed_then_finished(killed: ConsumerConfig, log: Path, kills: int) -> None:
    """``spanner-cdc consume`` killed with SIGKILL ``kills`` times at random moments after a
    batch of its own, then run to Kafka's end."""
    rng = random.Random(3)
    for _ in range(kills):
        before = committed_batches(killed)
        with log.open("a") as stderr:
            process = subprocess.Popen(
                consume_command(killed), env=CONSUMER_ENVIRONMENT, stdout=subprocess.DEVNULL, stderr=stderr
            )
        try:
            wait_for_a_commit(process, killed, before, log)
            time.sleep(rng.uniform(0, 2))  # batches take 1-2 s: the kill lands between or inside one
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(30)
    # The rest in batches of any size: what a kill left planned is replayed as planned (Spark's
    # offsets log), so the size of later batches does not matter to what is tested here.
    consumed_to_the_end(killed)


def newest(config: ConsumerConfig, log: str) -> int:
    return max(int(p.name) for p in (on_disk(config).spark_checkpoint / log).glob("[0-9]*"))


def test_a_stopped_consumer_ends_between_batches(spark: Any, stack: EmbeddedStack, tmp_path: Path) -> None:
    """SIGTERM while batches run back to back (a backlog in batches of 150): the running batch
    finishes and commits, the next is not started, the consumer exits 0 with only its own log
    lines on the screen — it used to cancel the running Spark job, which printed Java stack
    traces. The next run picks up where it stopped: every event once."""
    prefix = unique_prefix("S")
    kafka = stack.endpoint("kafka")
    events = random_history(ChangeFactory(), 6000)
    publish(kafka, prefix, events)
    config = consumer_config(kafka, prefix, tmp_path / "out")
    log = tmp_path / "stopped.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            consume_command(config), env=CONSUMER_ENVIRONMENT, stdout=stderr, stderr=stderr
        )
    try:
        wait_for_a_commit(process, config, 0, log)
        time.sleep(1.5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 0, log.read_text()[-3000:]
    finally:
        process.kill()
    screen = log.read_text().splitlines()
    assert foreign_lines(log.read_text()) == [], "\n".join(screen[-40:])
    planned, committed = newest(config, "offsets"), newest(config, "commits")
    assert committed < len(events) // 150, "the backlog was consumed before the stop: nothing tested"
    assert committed == planned or (
        committed == planned - 1 and any(f"batch {planned} runs at the next start" in line for line in screen)
    ), (planned, committed, screen[-5:])

    run_consumer(spark, config)
    changelog = changelog_rows(config, "Accounts", '"envelope$uuid"')
    assert len(changelog) == len(events) == len({row[0] for row in changelog})


def test_a_consumer_killed_while_spark_planned_its_first_batch_starts_again(
    spark: Any, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """What a SIGKILL during Spark's first offsets write leaves: its temporary file and no batch.
    Spark alone refuses every later start (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY)."""
    config = consumer_config(
        stack.endpoint("kafka"), unique_prefix("F"), tmp_path / "out", sinks=["changelog"]
    )
    offsets = on_disk(config).spark_checkpoint / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.5d8a3c1e-7f0b-4f7e-9a55-2b1c0e6d4f3a.tmp").write_text('v1\n{"batchWatermarkMs":0')
    factory = ChangeFactory()
    events = factory.events(factory.record("INSERT", {"Id": "a"}, {"Balance": "1", "Note": "x"}))
    publish(config.kafka_bootstrap, config.topic_prefix, events)

    run_consumer(spark, config)

    assert changelog_rows(config, "Accounts", '"Id"') == [("a",)]
