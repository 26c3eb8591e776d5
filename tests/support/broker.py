"""A Kafka broker of a test's own, on disk as the embedded stack runs it (stack.kafka), that the
test can SIGKILL and start again on the same ports and log directories."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from spanner_cdc.stack.kafka import KafkaNode
from spanner_cdc.stack.process import LocalProcess, free_port
from spanner_cdc.stack.services import probe_kafka

READY_SECONDS = 60.0


class OwnBroker:
    def __init__(self, directory: Path) -> None:
        self.node = KafkaNode(directory, free_port(), free_port())
        self.node.prepare()
        self.log = directory / "kafka.log"
        self.process = self._start()

    @property
    def bootstrap(self) -> str:
        return self.node.bootstrap

    @property
    def pgid(self) -> int:
        return self.process.pgid

    def _start(self) -> LocalProcess:
        process = LocalProcess.start("kafka", self.node.argv(), self.log)
        process.wait_ready(lambda: probe_kafka(self.node.bootstrap), READY_SECONDS)
        return process

    def kill(self) -> None:
        """SIGKILL, as a machine failure would: nothing flushed, nothing closed."""
        os.killpg(self.process.pgid, signal.SIGKILL)

    def start_again(self) -> None:
        self.process = self._start()

    def stop(self) -> None:
        self.process.stop()
