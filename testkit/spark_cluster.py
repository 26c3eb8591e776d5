"""A Spark standalone cluster on this machine: a master and workers as separate JVMs, started
with the ``spark-class`` PySpark ships, each in its own process group (a worker's executors are
its children: killing the group is losing the machine)."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from spanner_cdc.stack.process import LocalProcess, free_port

SPARK_HOME = Path(pyspark.__file__).parent
STARTUP_SECONDS = 120


def without_python_path() -> dict[str, str]:
    """This process's environment without ``PYTHONPATH``: what the cluster's executors import
    comes from their own Python and what a job ships, not from where the tests run."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


@dataclass
class SparkCluster:
    master_url: str
    ui_url: str
    master: LocalProcess
    root: Path
    cores: int
    memory: str
    workers: list[LocalProcess] = field(default_factory=list)

    def alive_workers(self) -> int:
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as answer:
            return int(json.load(answer)["aliveworkers"])

    def answers(self) -> None:
        """Raises until the master's web UI answers."""
        self.alive_workers()

    def lose_worker(self, index: int) -> None:
        """SIGKILL a worker and its executors at once, as when its machine goes away."""
        self.workers[index].stop(grace=0)

    def replace_lost_workers(self) -> None:
        """Start again every worker that is gone (its work directory kept), and wait until the
        master counts them all."""
        for number, worker in enumerate(self.workers):
            if not worker.is_alive():
                self.workers[number] = self._worker(number)
        self.wait_for_workers()

    def add_worker(self) -> None:
        self.workers.append(self._worker(len(self.workers)))

    def _worker(self, number: int) -> LocalProcess:
        return LocalProcess.start(
            f"spark worker {number}",
            _spark_class(
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--host",
                "127.0.0.1",
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(self.root / f"worker-{number}"),
            ),
            self.root / f"worker-{number}.log",
            env=without_python_path(),
        )

    def wait_for_workers(self) -> None:
        expected = len(self.workers)

        def all_registered() -> None:
            if self.alive_workers() < expected:
                raise RuntimeError(f"{self.alive_workers()} of {expected} workers registered")

        self.master.wait_ready(all_registered, STARTUP_SECONDS)

    def stop(self) -> None:
        for process in [*self.workers, self.master]:
            process.stop(grace=5)


def _spark_class(main_class: str, *args: str) -> list[str]:
    return [str(SPARK_HOME / "bin" / "spark-class"), main_class, *args]


@contextmanager
def spark_cluster(root: Path, workers: int = 2, cores: int = 1, memory: str = "2g") -> Iterator[SparkCluster]:
    """A master on free ports and ``workers`` workers of ``cores`` cores each; stopped after."""
    port, ui_port = free_port(), free_port()
    master = LocalProcess.start(
        "spark master",
        _spark_class(
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui_port),
        ),
        root / "master.log",
        env=without_python_path(),
    )
    cluster = SparkCluster(
        f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}", master, root, cores, memory
    )
    try:
        master.wait_ready(cluster.answers, STARTUP_SECONDS)
        for _ in range(workers):
            cluster.add_worker()
        cluster.wait_for_workers()
        yield cluster
    finally:
        cluster.stop()
