"""The broker stops answering for longer than the producer's delivery timeout, then comes back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from spanner_cdc.schemas.timestamps import now_micros
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from testkit.scrape import scrape
from testkit.spanner_db import create_database
from tests.support.churn import ACCOUNTS_DDL, produce_command
from tests.support.kafka_read import read_all
from tests.support.produce_process import published_ids, run_producer_while, upsert_account
from tests.support.stopping import stop_with_sigterm
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration
#: What the producer is told to wait for a delivery; the outage lasts longer.
DELIVERY_TIMEOUT_MS = 3000
OUTAGE_SECONDS = 8.0


@contextmanager
def broker_frozen(stack: EmbeddedStack) -> Iterator[None]:
    """The broker's processes stopped (SIGSTOP): connections stay open, nothing answers."""
    group = stack.services["kafka"].pgid
    assert group is not None, "the broker is not a process this stack started"
    os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(group, signal.SIGCONT)


def newest_checkpoint_micros(kafka: str, prefix: str) -> int:
    """The furthest checkpoint of any running partition on the checkpoint topic now."""
    newest: dict[bytes, dict[str, Any]] = {}
    for _, _, key, value in read_all(kafka, Topics(prefix).checkpoints):
        if key and value:
            newest[key] = json.loads(value)
    return max((r["checkpoint_micros"] for r in newest.values() if r["state"] == "RUNNING"), default=0)


def test_an_outage_longer_than_the_delivery_timeout_loses_nothing(stack: EmbeddedStack) -> None:
    """The broker frozen past the delivery timeout. Either the producer rides it out (events and
    checkpoints move again) or it stops with one line — what the embedded broker makes it do: the
    failed transaction's abort needs a new producer epoch, which it never grants (docs/facts.md)
    — and a new run publishes what the first could not. Either way nothing is lost and no
    traceback is shown."""
    bank = create_database(stack.endpoint("spanner"), ACCOUNTS_DDL)
    kafka = stack.endpoint("kafka")
    prefix = f"outage-{uuid.uuid4().hex[:6]}"
    port = free_port()
    command = produce_command(stack.endpoint("spanner"), kafka, bank, "Bank", prefix,
                              "--metrics-port", str(port),
                              "--kafka-config", f"message.timeout.ms={DELIVERY_TIMEOUT_MS}")  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        scrape(port, "queries_started_total")
        upsert_account(bank, "before")
        assert eventually(lambda: "before" in published_ids(stack, prefix), 60), "nothing published"
        with broker_frozen(stack):
            upsert_account(bank, "during")
            time.sleep(OUTAGE_SECONDS)
        upsert_account(bank, "after")
        after = now_micros()
        everything = {"before", "during", "after"}
        eventually(lambda: process.poll() is not None or everything <= published_ids(stack, prefix), 150)
        rode_it_out = process.poll() is None
        if rode_it_out:
            assert everything <= published_ids(stack, prefix)
            assert eventually(lambda: newest_checkpoint_micros(kafka, prefix) > after, 30), (
                "the checkpoints stopped moving after the outage"
            )
    finally:
        stderr = stop_with_sigterm(process, 60)
    assert "Traceback" not in stderr, stderr
    if rode_it_out:
        assert process.returncode == 0, stderr
        return
    assert process.returncode == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert "failed for good" in last and "it resumes from its checkpoints" in last, last
    run_producer_while(stack, bank, prefix, lambda: None, lambda: everything <= published_ids(stack, prefix))
    assert everything <= published_ids(stack, prefix)
