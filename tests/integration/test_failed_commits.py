"""Transactions whose commit fails, or is slow to be confirmed, on the embedded Apache Kafka: a
failed one shows nothing of itself — nor of what was kept for the next one while it tried — to a
``read_committed`` reader; a slow one is resumed until it commits."""

from __future__ import annotations

import asyncio
import collections
import functools
import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from spanner_cdc.producer.publish import transactions
from spanner_cdc.producer.publish.transactions import (
    FAILURES_ONLY,
    ClosingRecord,
    DeliveryCallback,
    TransactionalWriter,
)
from spanner_cdc.stack import EmbeddedStack
from tests.support.freezing import frozen
from tests.support.kafka_read import read_all

pytestmark = pytest.mark.integration
#: How long one try of a commit may take here, and how long the broker stops answering: the
#: commit times out several times before it can complete.
COMMIT_TRY_SECONDS = 1.0
FROZEN_SECONDS = 5.0
#: Over the broker's message.max.bytes (about 1 MB by default), under the client's limit here.
TOO_LARGE_FOR_THE_BROKER = 2_000_000


def new_topic(bootstrap: str, name: str, partitions: int) -> str:
    """A topic of its own, ``name`` and a random suffix, created now."""
    topic = f"{name}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    return topic


def transactional_client(bootstrap: str, **settings: Any) -> Producer:
    """A client with a transactional id of its own and ``settings``."""
    return Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"writer-{uuid.uuid4().hex[:8]}", **settings}
    )


@pytest.mark.parametrize("reports_of", ["failures only", "every message"])
def test_messages_kept_during_a_failed_commit_fail_with_it(stack: EmbeddedStack, reports_of: str) -> None:
    """A message the broker refuses dooms its transaction. The messages produced while its
    commit ran were kept for the next transaction and sent into it — yet their partitions
    restart from the checkpoint the aborted transaction did not move, and send them again.
    Each message is reported once, whether librdkafka reports failures only (as the producer's
    writers have it) or every message."""
    bootstrap = stack.endpoint("kafka")
    topic = new_topic(bootstrap, "failed-commit", 2)
    producer = transactional_client(
        bootstrap,
        **{"message.max.bytes": 3 * TOO_LARGE_FOR_THE_BROKER, "linger.ms": 20},
        **(FAILURES_ONLY if reports_of == "failures only" else {}),
    )
    writer = TransactionalWriter(producer)
    reports: dict[str, list[KafkaError | None]] = collections.defaultdict(list)

    def report(name: str) -> DeliveryCallback:
        def delivered(error: KafkaError | None, _message: Message | None) -> None:
            reports[name].append(error)

        return delivered

    async def scenario() -> int:
        await writer.take_over()
        writer.produce(topic, b"big", bytes(TOO_LARGE_FOR_THE_BROKER), report("refused"), 0)
        # On another partition: staged, then aborted with the transaction. (One behind the refused
        # message in its partition would report only after transaction.timeout.ms.)
        writer.produce(topic, b"same", b"in the doomed transaction", report("doomed"), 1)
        commit = asyncio.create_task(writer.commit())
        await asyncio.sleep(0)  # the commit began: what is produced now is kept for the next one
        writer.produce(topic, b"kept", b"produced while the commit ran", report("kept"), 1)
        failed = await commit
        await writer.commit()
        return failed

    failed = asyncio.run(scenario())
    writer.poll(1.0)  # a report librdkafka still had for them (the abort's purge) would come now
    assert set(reports) == {"refused", "doomed", "kept"}
    assert all(len(errors) == 1 and errors[0] is not None for errors in reports.values()), reports
    assert failed >= 1
    assert read_all(bootstrap, topic) == []


def test_a_commit_the_broker_is_slow_to_confirm_is_resumed_until_it_commits(
    stack: EmbeddedStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker stops answering after it took a transaction's messages in, for several times
    the commit's own timeout. A commit that timed out is still under way in librdkafka: it is
    resumed (aborting it then fails the client: "Conflicting commit_transaction API call is
    already in progress"), and once the broker answers again the messages commit, delivered."""
    monkeypatch.setattr(transactions, "TRANSACTION_TIMEOUT_SECONDS", COMMIT_TRY_SECONDS)
    bootstrap = stack.endpoint("kafka")
    topic = new_topic(bootstrap, "slow-commit", 1)
    writer = TransactionalWriter(transactional_client(bootstrap, **FAILURES_ONLY))
    reports: list[KafkaError | None] = []

    async def scenario() -> int:
        await writer.take_over()
        for n in range(3):
            writer.produce(topic, b"k", f"message {n}".encode(), lambda error, _: reports.append(error))
        while len(writer.producer) > 0:  # every message staged: what is left is the commit
            writer.poll(0.05)
        with frozen(stack.services["kafka"].pgid):
            commit = asyncio.create_task(writer.commit())
            await asyncio.sleep(FROZEN_SECONDS)
        return await commit

    assert asyncio.run(scenario()) == 0
    assert writer.lost is None, writer.lost
    assert reports == [None, None, None]
    committed = [value for _, _, _, value in read_all(bootstrap, topic)]
    assert committed == [f"message {n}".encode() for n in range(3)]


def test_a_commit_interrupted_after_staging_stages_each_message_once(stack: EmbeddedStack) -> None:
    """A commit can stop after it staged the transaction's messages and before it committed —
    a shutdown cancels the checkpoint round it runs in; here the closing records' maker fails
    once. The next commit carries the same messages: each is staged once, and delivered."""
    bootstrap = stack.endpoint("kafka")
    topic = new_topic(bootstrap, "interrupted", 1)
    interrupted: list[bool] = []

    def closing() -> list[ClosingRecord]:
        if not interrupted:
            interrupted.append(True)
            raise asyncio.CancelledError  # what a cancelled round meets at its next await
        return []

    writer = TransactionalWriter(transactional_client(bootstrap, **FAILURES_ONLY), closing)
    staged: list[int] = []
    delivered: list[KafkaError | None] = []

    async def scenario() -> None:
        await writer.take_over()
        for n in range(3):
            on_staged = functools.partial(staged.append, n)
            writer.produce(topic, b"k", b"v", lambda error, _: delivered.append(error), on_staged=on_staged)
        with pytest.raises(asyncio.CancelledError):
            await writer.commit()
        assert await writer.commit() == 0

    asyncio.run(scenario())
    assert sorted(staged) == [0, 1, 2]
    assert delivered == [None, None, None]
    assert len(read_all(bootstrap, topic)) == 3


def test_messages_produced_with_one_report_are_one_batch_reported_once_per_transaction(
    stack: EmbeddedStack,
) -> None:
    """Messages produced with the report of the writer's latest batch join it, in the open
    transaction or, while a commit runs, the kept batch of the next one: each batch is staged
    and reported once. A message librdkafka refuses for its size goes to the batch's
    ``on_refused``; the rest of the batch is delivered. A batch keeps the callbacks it was
    made with."""
    bootstrap = stack.endpoint("kafka")
    topic = new_topic(bootstrap, "batches", 1)
    client = transactional_client(bootstrap, **FAILURES_ONLY, **{"message.max.bytes": 10_000})
    writer = TransactionalWriter(client, closing=list)  # no closing records: staging still runs
    reports: list[KafkaError | None] = []
    staged: list[str] = []
    refused: list[bytes] = []

    def report(error: KafkaError | None, _message: Message | None) -> None:
        reports.append(error)

    def refuse(message: transactions.Outbound, reason: str) -> None:
        assert "too large" in reason.lower()
        refused.append(message[0])

    def batch(*values: bytes) -> list[transactions.Outbound]:
        return [(value[:5], value, None) for value in values]

    async def scenario() -> None:
        await writer.take_over()
        first = functools.partial(staged.append, "first")
        writer.produce_batch(topic, batch(b"one", b"two"), report, on_staged=first, on_refused=refuse)
        assert writer.joins(topic, report) and not writer.joins(f"{topic}-other", report)
        writer.produce_batch(topic, [*batch(b"three"), (b"large", bytes(20_000), None)], report)
        commit = asyncio.create_task(writer.commit())
        await asyncio.sleep(0)  # the commit began: a batch produced now is kept for the next one
        assert not writer.joins(topic, report)
        writer.produce_batch(
            topic, batch(b"four"), report, on_staged=functools.partial(staged.append, "kept")
        )
        assert writer.joins(topic, report)
        writer.produce_batch(topic, batch(b"five"), report)
        assert await commit == 0
        assert await writer.commit() == 0

    asyncio.run(scenario())
    assert reports == [None, None]
    assert staged == ["first", "kept"]
    assert refused == [b"large"]
    assert [value for _, _, _, value in read_all(bootstrap, topic)] == [
        b"one",
        b"two",
        b"three",
        b"four",
        b"five",
    ]
