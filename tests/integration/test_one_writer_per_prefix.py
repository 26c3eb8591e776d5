"""Two producers started on one topic prefix (a rolling deploy's overlap, a second run by
mistake): the second fences the first, which stops with one line and writes nothing more; the
second carries on, and nothing is lost (producer/publish/transactions.py)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
import warnings

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from spanner_cdc.producer.errors import KafkaClientLostError
from spanner_cdc.producer.publish.transactions import (
    COMMIT_PATIENCE_SECONDS,
    TRANSACTION_TIMEOUT_SECONDS,
    TransactionalWriter,
)
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from testkit.scrape import scrape
from testkit.spanner_db import create_database
from tests.support.churn import ACCOUNTS_DDL, produce_command
from tests.support.kafka_read import read_all
from tests.support.produce_process import published_ids, upsert_account
from tests.support.stopping import REPORT_SECONDS, stop_with_sigterm
from tests.support.waiting import eventually, wait_for

pytestmark = pytest.mark.integration
#: How long the first producer may take to stop once fenced: it learns of the fence at its next
#: transactional step, and a commit in flight at the takeover may be resumed, timing out, for as
#: long as commits are before it reports the fence.
FENCED_STOP_SECONDS = COMMIT_PATIENCE_SECONDS + TRANSACTION_TIMEOUT_SECONDS + 30


def test_a_second_producer_on_a_prefix_fences_the_first(stack: EmbeddedStack) -> None:
    bank = create_database(stack.endpoint("spanner"), ACCOUNTS_DDL)
    kafka = stack.endpoint("kafka")
    prefix = f"fence-{uuid.uuid4().hex[:6]}"

    def start() -> tuple[subprocess.Popen[str], int]:
        port = free_port()
        command = produce_command(stack.endpoint("spanner"), kafka, bank, "Bank", prefix,
                                  "--metrics-port", str(port))  # fmt: skip
        return subprocess.Popen(command, stderr=subprocess.PIPE, text=True), port

    first, first_port = start()
    second = None
    stopped = False
    try:
        scrape(first_port, "queries_started_total")
        upsert_account(bank, "first")
        wait_for(lambda: "first" in published_ids(stack, prefix), 60, "the first producer's event")
        second, second_port = start()
        scrape(second_port, "queries_started_total")
        stopped = eventually(lambda: first.poll() is not None, FENCED_STOP_SECONDS)
        if stopped:
            fenced_at = len(read_all(kafka, f"{prefix}.Accounts"))
            upsert_account(bank, "second")
            wait_for(lambda: "second" in published_ids(stack, prefix), 60, "the second producer's event")
            assert second.poll() is None, "the second producer stopped"
        else:  # its stderr, read below, then ends in where its tasks wait
            first.send_signal(signal.SIGUSR1)
            time.sleep(REPORT_SECONDS)
    finally:
        # Up to two transaction timeouts (30 s each, producer.publish.transactions): seen once in CI, the
        # embedded broker's transaction coordinator dropped its connection while the last commit
        # ran, and that commit and the next one each waited their whole timeout.
        first_stderr = stop_with_sigterm(first, 120)
        second_stderr = stop_with_sigterm(second, 120) if second is not None else ""
    assert stopped, f"the first producer did not stop, fenced, in {FENCED_STOP_SECONDS:.0f}s:\n{first_stderr}"
    assert first.returncode == 1, first_stderr
    assert "Traceback" not in first_stderr, first_stderr
    last = first_stderr.strip().splitlines()[-1]
    assert "another producer took over this topic prefix" in last, last
    assert second.returncode == 0 and "Traceback" not in second_stderr, second_stderr
    after = [value for _, _, _, value in read_all(kafka, f"{prefix}.Accounts")[fenced_at:]]
    assert after, "nothing written after the fence"
    assert {"first", "second"} <= published_ids(stack, prefix)


def test_a_fenced_writer_names_the_fence_even_when_a_produce_learns_of_it_first(
    stack: EmbeddedStack,
) -> None:
    """A writer fenced while it was paused learns of it from a produce that fails with
    librdkafka's bare "Local: Fatal error", before any poll served the fence: its one line
    still says another producer took over, not that the client failed."""
    bootstrap = stack.endpoint("kafka")
    topic = f"fenced-produce-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    config = {"bootstrap.servers": bootstrap, "transactional.id": f"fenced-{uuid.uuid4().hex[:8]}"}
    first, second = TransactionalWriter(Producer(config)), TransactionalWriter(Producer(config))

    def ignore(_error: KafkaError | None, _message: Message | None) -> None:
        pass

    async def scenario() -> str:
        await first.take_over()
        first.produce(topic, b"k", b"before", ignore)
        await first.commit()
        await second.take_over()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                first.produce(topic, b"k", b"after the fence", ignore)
            except KafkaClientLostError as exc:
                return str(exc)
            time.sleep(0.05)  # not a poll: the fence must surface through produce
        return "never refused"

    try:
        said = asyncio.run(scenario())
    finally:  # not left retrying the broker after the test stack stops
        second.producer.close()
        with warnings.catch_warnings():  # the fenced one cannot abort its transaction: the point
            warnings.simplefilter("ignore", RuntimeWarning)
            first.producer.close()
    assert "another producer took over this topic prefix" in said
