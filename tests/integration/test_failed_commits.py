"""A transaction that cannot commit, on the embedded Apache Kafka: nothing of it — nor of what
was kept for the next one while it tried — reaches a ``read_committed`` reader."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from spanner_cdc.producer.publish.transactions import DeliveryCallback, TransactionalWriter
from spanner_cdc.stack import EmbeddedStack
from tests.support.kafka_read import read_all

pytestmark = pytest.mark.integration
#: Over the broker's message.max.bytes (about 1 MB by default), under the client's limit here.
TOO_LARGE_FOR_THE_BROKER = 2_000_000


def test_messages_kept_during_a_failed_commit_fail_with_it(stack: EmbeddedStack) -> None:
    """A message the broker refuses dooms its transaction. The messages produced while its
    commit ran were kept for the next transaction and sent into it — yet their partitions
    restart from the checkpoint the aborted transaction did not move, and send them again."""
    bootstrap = stack.endpoint("kafka")
    topic = f"failed-commit-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"failed-commit-{uuid.uuid4().hex[:8]}",
            "message.max.bytes": 3 * TOO_LARGE_FOR_THE_BROKER,
            "linger.ms": 20,
        }
    )
    writer = TransactionalWriter(producer)
    reports: dict[str, KafkaError | None] = {}

    def report(name: str) -> DeliveryCallback:
        def delivered(error: KafkaError | None, _message: Message | None) -> None:
            reports[name] = error

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
    assert set(reports) == {"refused", "doomed", "kept"}
    assert all(error is not None for error in reports.values()), reports
    assert failed >= 1
    assert read_all(bootstrap, topic) == []
