"""The embedded Apache Kafka broker: one KRaft node (broker and controller in one JVM).

Its jars come from Maven Central at setup (``jvm/kafka/pom.xml``; common.jars). A node lives in
one directory — ``server.properties``, the log4j2 configuration and the log directories — and
keeps its ports, so it can be stopped (or killed) and started again on the same data: records,
committed transactions and consumer offsets survive a restart, as on a production broker. The
storage is formatted on the first start only.

Settings differ from Kafka's defaults only where one node needs it (replication factors of 1)
or where a development broker should answer sooner than a production one: retention and
timed-out transactions checked every second, internal topics of a few partitions (50 each by
default, created on first use). A consumer group's first rebalance waits Kafka's default 3 s,
so that processes of a ``--group`` started together share the shards from the start instead of
the first one taking them all and handing them on.
"""

from __future__ import annotations

import base64
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from spanner_cdc.common.jars import jars, java_binary, log4j2_to_file
from spanner_cdc.stack.process import ServiceError

MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
#: Heap of the broker's JVM: enough for tests, demo and bench on a 2-core machine.
HEAP = ("-Xms256m", "-Xmx768m")
JVM_OPTIONS = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true")


#: The transactional id the stack's readiness check initialises (see warm_up_transactions).
WARM_UP_TRANSACTIONAL_ID = "_spanner-cdc.stack.ready"
TRANSACTIONS_READY_SECONDS = 60.0


def warm_up_transactions(bootstrap: str) -> None:
    """Create and load the broker's transaction state before anyone uses it: the first
    transactional producer of a new broker otherwise waits for the coordinator to load
    (librdkafka prints "Coordinator load in progress: retrying" on the user's screen)."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": WARM_UP_TRANSACTIONAL_ID, "log_level": 0}
    )
    producer.init_transactions(TRANSACTIONS_READY_SECONDS)


@dataclass(frozen=True)
class KafkaNode:
    """One broker-and-controller node in ``directory``, listening on 127.0.0.1."""

    directory: Path
    port: int
    controller_port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def properties_file(self) -> Path:
        return self.directory / "server.properties"

    def settings(self) -> dict[str, str]:
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "log.retention.check.interval.ms": "1000",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        }

    def prepare(self) -> None:
        """Write the configuration and, on the first start, format the storage."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.properties_file.write_text("".join(f"{k}={v}\n" for k, v in self.settings().items()))
        if (self.data_dir / "meta.properties").is_file():
            return
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        formatted = subprocess.run(
            # "--cluster-id=": a base64 id may start with "-", which the tool takes for an option.
            [*self._java(), STORAGE_TOOL, "format", f"--cluster-id={cluster_id}",
             "-c", str(self.properties_file), "--standalone"],
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        if formatted.returncode != 0:
            raise ServiceError(
                f"kafka: formatting {self.data_dir} failed:\n{formatted.stdout}{formatted.stderr}"
            )

    def argv(self) -> list[str]:
        return [*self._java(), MAIN_CLASS, str(self.properties_file)]

    def _java(self) -> list[str]:
        classpath = ":".join(str(jar) for jar in jars("kafka"))
        log4j = log4j2_to_file(self.directory / "log4j2.properties", self.directory / "server.log")
        return [java_binary(), *HEAP, *JVM_OPTIONS, log4j, "-cp", classpath]
