"""The broker stops answering for longer than the producer's delivery timeout, then comes back."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from typing import Any

import pytest

from spanner_cdc.schemas.timestamps import now_micros
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from testkit.scrape import scrape
from testkit.spanner_db import create_database
from tests.support.churn import ACCOUNTS_DDL, produce_command
from tests.support.freezing import frozen
from tests.support.kafka_read import read_all
from tests.support.produce_process import published_ids, upsert_account
from tests.support.stopping import stop_with_sigterm
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration
#: What the producer is told to wait for a delivery; the outage lasts longer.
DELIVERY_TIMEOUT_MS = 3000
OUTAGE_SECONDS = 8.0


def newest_checkpoint_micros(kafka: str, prefix: str) -> int:
    """The furthest checkpoint of any running partition on the checkpoint topic now."""
    newest: dict[bytes, dict[str, Any]] = {}
    for _, _, key, value in read_all(kafka, Topics(prefix).checkpoints):
        if key and value:
            newest[key] = json.loads(value)
    return max((r["checkpoint_micros"] for r in newest.values() if r["state"] == "RUNNING"), default=0)


def test_an_outage_longer_than_the_delivery_timeout_loses_nothing(stack: EmbeddedStack) -> None:
    """The broker frozen past the delivery timeout: the producer rides it out — the failed
    transaction is aborted (librdkafka bumps the producer epoch, which Apache Kafka grants), its
    partitions restart from their checkpoints — and events and checkpoints move again. Nothing
    is lost and no traceback is shown."""
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
        with frozen(stack.services["kafka"].pgid):
            upsert_account(bank, "during")
            time.sleep(OUTAGE_SECONDS)
        upsert_account(bank, "after")
        after = now_micros()
        everything = {"before", "during", "after"}
        eventually(lambda: process.poll() is not None or everything <= published_ids(stack, prefix), 150)
        assert process.poll() is None, "the producer stopped"
        assert everything <= published_ids(stack, prefix)
        assert eventually(lambda: newest_checkpoint_micros(kafka, prefix) > after, 30), (
            "the checkpoints stopped moving after the outage"
        )
    finally:
        stderr = stop_with_sigterm(process, 60)
    assert "Traceback" not in stderr, stderr
    assert process.returncode == 0, stderr
