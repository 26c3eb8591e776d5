"""A Kafka broker of a test's own that authenticates clients with SASL/SCRAM and authorizes them
with ACLs (Kafka's StandardAuthorizer, nothing allowed without an ACL), as production brokers do.

Clients connect to the SASL listener; the broker's own traffic and the test's administration
(users, ACLs) go through a plaintext listener whose anonymous principal is the super user.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from confluent_kafka.admin import (
    AclBinding,
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from spanner_cdc.stack.kafka import KafkaNode
from spanner_cdc.stack.process import LocalProcess, free_port
from spanner_cdc.stack.services import probe_kafka

READY_SECONDS = 60.0
MECHANISM = "SCRAM-SHA-256"


@dataclasses.dataclass(frozen=True)
class ScramKafkaNode(KafkaNode):
    internal_port: int

    @property
    def internal_bootstrap(self) -> str:
        return f"127.0.0.1:{self.internal_port}"

    def settings(self) -> dict[str, str]:
        return {
            **super().settings(),
            "listeners": f"SASL_PLAINTEXT://{self.bootstrap},INTERNAL://{self.internal_bootstrap},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"SASL_PLAINTEXT://{self.bootstrap},INTERNAL://{self.internal_bootstrap}",
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,INTERNAL:PLAINTEXT,"
            "CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
        }


class SecureBroker:
    def __init__(self, directory: Path) -> None:
        self.node = ScramKafkaNode(directory, free_port(), free_port(), free_port())
        self.node.prepare()
        self.process = LocalProcess.start("kafka", self.node.argv(), directory / "kafka.log")
        self.process.wait_ready(lambda: probe_kafka(self.node.internal_bootstrap), READY_SECONDS)
        self.admin = AdminClient({"bootstrap.servers": self.node.internal_bootstrap})

    @property
    def bootstrap(self) -> str:
        """The SASL listener, where every client but the test's administration connects."""
        return self.node.bootstrap

    def add_user(self, name: str, password: str) -> dict[str, str]:
        """A SCRAM user; the librdkafka settings that log in as it."""
        upsert = UserScramCredentialUpsertion(
            name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), password.encode()
        )
        for future in self.admin.alter_user_scram_credentials([upsert]).values():
            future.result(30)
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": MECHANISM,
            "sasl.username": name,
            "sasl.password": password,
        }

    def grant(self, bindings: Iterable[AclBinding]) -> None:
        for future in self.admin.create_acls(list(bindings)).values():
            future.result(30)

    def stop(self) -> None:
        """The administration client goes first: left alive, its librdkafka threads retry the
        stopped broker, and print each refused connection on the test run's screen."""
        del self.admin
        self.process.stop()
