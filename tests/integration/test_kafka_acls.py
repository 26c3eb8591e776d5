"""The pipeline on a broker that authenticates with SASL/SCRAM and authorizes with ACLs, nothing
allowed without one: the producer and the consumer each hold only the ACLs docs/security.md
names for their command, and a principal without write ACLs on the event topics — the
consumer's among them — cannot put a message there."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from spanner_cdc.consumer.readers import replica_rows
from spanner_cdc.producer.errors import KafkaSetupError
from spanner_cdc.producer.main import open_kafka
from spanner_cdc.schemas.topics import CONTROL_NAMESPACE
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import consumer_config, run_consumer, unique_prefix
from testkit.spanner_db import create_database
from tests.integration.test_poll import DDL as POLL_DDL
from tests.integration.test_poll import poll_command, write_docs
from tests.support.churn import ACCOUNTS_DDL, produce_to_now, producer_config
from tests.support.kafka_read import read_topic
from tests.support.secure_broker import SecureBroker
from tests.support.stopping import stop_with_sigterm
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]
PREFIXED = ResourcePatternType.PREFIXED
#: docs/security.md, ``produce --group``: the producers' consumer group.
GROUP_OPERATIONS = (AclOperation.DESCRIBE, AclOperation.READ)


def acls(user: str, grants: dict[tuple[ResourceType, str], tuple[AclOperation, ...]]) -> list[AclBinding]:
    """ALLOW bindings of ``user`` for every (resource type, name prefix) and operation."""
    return [
        AclBinding(kind, prefix, PREFIXED, f"User:{user}", "*", operation, AclPermissionType.ALLOW)
        for (kind, prefix), operations in grants.items()
        for operation in operations
    ]


def producer_acls(user: str, prefix: str) -> list[AclBinding]:
    """docs/security.md, ``spanner-cdc produce``."""
    control = f"{CONTROL_NAMESPACE}.{prefix}."
    topic_operations = (
        AclOperation.CREATE,
        AclOperation.DESCRIBE,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.WRITE,
        AclOperation.READ,
    )
    return acls(
        user,
        {
            (ResourceType.TOPIC, f"{prefix}."): topic_operations,
            (ResourceType.TOPIC, control): topic_operations,
            (ResourceType.TRANSACTIONAL_ID, control): (AclOperation.WRITE, AclOperation.DESCRIBE),
        },
    )


def consumer_acls(user: str, prefix: str) -> list[AclBinding]:
    """docs/security.md, ``spanner-cdc consume``."""
    read = (AclOperation.DESCRIBE, AclOperation.READ)
    return acls(
        user,
        {
            (ResourceType.TOPIC, f"{prefix}."): read,
            (ResourceType.TOPIC, f"{CONTROL_NAMESPACE}.{prefix}."): read,
        },
    )


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    broker = SecureBroker(tmp_path_factory.mktemp("secure-kafka"))
    try:
        yield broker
    finally:
        broker.stop()


def refusal(broker: SecureBroker, settings: dict[str, str], topic: str) -> str:
    """The error of one message produced to ``topic`` with ``settings``' login."""
    errors: list[KafkaError | None] = []

    def report(error: KafkaError | None, _message: Message) -> None:
        errors.append(error)

    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 10_000, **settings})
    producer.produce(topic, b"forged", b"key", on_delivery=report)
    producer.flush(30)
    assert errors and errors[0] is not None, f"a message was accepted on {topic}"
    return errors[0].name()


def test_the_pipeline_runs_on_its_acls_and_only_the_producer_can_write(
    spark: Any,
    stack: EmbeddedStack,
    secure_broker: SecureBroker,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    prefix = unique_prefix("acl")
    producing = secure_broker.add_user("producer", "producer-secret")
    consuming = secure_broker.add_user("consumer", "consumer-secret")
    nobody = secure_broker.add_user("nobody", "nobody-secret")
    secure_broker.grant(producer_acls("producer", prefix))
    secure_broker.grant(consumer_acls("consumer", prefix))
    database = create_database(stack.endpoint("spanner"), ACCOUNTS_DDL)
    config = producer_config(
        stack.endpoint("spanner"), secure_broker.bootstrap, database, "Bank",
        topic_prefix=prefix, kafka_config=producing,
    )  # fmt: skip
    with database.batch() as batch:
        batch.insert("Accounts", columns=["Id", "Balance"], values=[[f"a{n}", n] for n in range(20)])
    produce_to_now(config)
    # As a restart opens Kafka: the prefix's topics exist now, and their size limits are read on
    # its ACLs.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spanner_cdc"):
        asyncio.run(open_kafka(config))
    assert not [r for r in caplog.records if r.name.startswith("spanner_cdc")], caplog.text

    consumer = consumer_config(secure_broker.bootstrap, prefix, tmp_path, kafka_config=consuming)
    run_consumer(spark, consumer)
    assert replica_rows(consumer, "Accounts", '"Id", "Balance"') == sorted((f"a{n}", n) for n in range(20))
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    leaked = [path for path in files if b"consumer-secret" in path.read_bytes()]
    assert not leaked, f"the consumer's password is in {leaked}"

    for settings in (consuming, nobody):
        assert refusal(secure_broker, settings, f"{prefix}.Accounts") == "TOPIC_AUTHORIZATION_FAILED"


def test_a_producer_group_and_a_poller_run_on_the_acls_the_docs_name(
    stack: EmbeddedStack, secure_broker: SecureBroker, tmp_path: Path
) -> None:
    """``produce --group`` holding produce's ACLs and its consumer group's, and ``poll`` holding
    produce's, each publish every change (read back through the broker's administration
    listener). Without the group's ACLs the group process stops in one line naming them (it
    waited for a shard for ever)."""
    spanner = stack.endpoint("spanner")
    prefix = unique_prefix("aclgroup")
    grouped = secure_broker.add_user("grouped", "grouped-secret")
    group = (ResourceType.GROUP, f"{CONTROL_NAMESPACE}.{prefix}.producers.")
    secure_broker.grant(producer_acls("grouped", prefix))
    database = create_database(spanner, ACCOUNTS_DDL)
    config = producer_config(
        spanner, secure_broker.bootstrap, database, "Bank", topic_prefix=prefix, kafka_config=grouped,
        group="bank", group_shards=2, group_session_timeout=6,
    )  # fmt: skip
    with database.batch() as batch:
        batch.insert("Accounts", columns=["Id", "Balance"], values=[[f"a{n}", n] for n in range(20)])
    with pytest.raises(
        KafkaSetupError, match=r"GROUP_AUTHORIZATION_FAILED .* needs Describe and Read on the group"
    ):
        produce_to_now(config)
    secure_broker.grant(acls("grouped", {group: GROUP_OPERATIONS}))
    produce_to_now(config)
    published = read_topic(secure_broker.node.internal_bootstrap, prefix, "Accounts")[0]
    assert sorted(e.key["Id"] for e in published) == sorted(f"a{n}" for n in range(20))

    polled = unique_prefix("aclpoll")
    login = secure_broker.add_user("poller", "poller-secret")
    secure_broker.grant(producer_acls("poller", polled))
    docs = create_database(spanner, POLL_DDL)
    write_docs(docs, [(1, "one"), (2, "two"), (3, "three")])
    settings = [f"--kafka-config={name}={value}" for name, value in login.items()]
    log = tmp_path / "poll.log"
    with log.open("w") as err:
        poller = subprocess.Popen(
            poll_command(spanner, secure_broker.bootstrap, docs, polled, *settings), stderr=err
        )
    try:
        wait_for(
            lambda: len(read_topic(secure_broker.node.internal_bootstrap, polled, "Docs")[0]) == 3,
            60,
            "the poller's three rows",
        )
    finally:
        stop_with_sigterm(poller, 60, log)
    assert poller.returncode == 0, log.read_text()[-3000:]
