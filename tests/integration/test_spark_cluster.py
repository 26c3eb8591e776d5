"""The consumer on a Spark standalone cluster: a master and two workers as JVMs of their own, the
README's own job submitted with ``spark-submit`` in client mode, the built wheel shipped to
executors whose Python does not have the project, and one worker lost mid-run. The sinks equal
an uninterrupted run's (docs/deployment.md)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import sysconfig
import time
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from spanner_cdc.common.jars import jars
from spanner_cdc.consumer.readers import changelog_rows
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import (
    account_sinks,
    committed_batches,
    consume_command,
    consumer_config,
    expected_account_sinks,
    unique_prefix,
)
from testkit.spark_cluster import SPARK_HOME, SparkCluster, spark_cluster, without_python_path
from testkit.synthetic import ChangeFactory, publish, random_history

pytestmark = [pytest.mark.integration, pytest.mark.spark]
REPO = Path(__file__).resolve().parents[2]
#: The archive's name on the executors: unpacked there into a directory of that name.
SHIPPED = "spanner-cdc"


def readme_job() -> str:
    """The job the README shows under "Your own Spark job", exactly."""
    section = (REPO / "README.md").read_text().split("## Your own Spark job", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def python_without_the_project(work: Path) -> Path:
    """A Python with the project's dependencies and not the project: what executors of a
    cluster have until the job ships the project to them."""
    venv.create(work / "executor-python", with_pip=False)
    python = work / "executor-python" / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run(
        [str(python), "-c", "import pyarrow, fastavro; import spanner_cdc"],
        capture_output=True,
        text=True,
        check=False,
        env=without_python_path(),
        cwd=work,
    )
    assert "No module named 'spanner_cdc'" in probe.stderr, probe.stderr
    return python


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory, project_wheel: Path) -> tuple[Path, Path]:
    """The wheel as the archive a job ships, and a Python for executors without the project."""
    work = tmp_path_factory.mktemp("build")
    archive = work / project_wheel.with_suffix(".zip").name  # Spark unpacks archives by their suffix
    shutil.copy(project_wheel, archive)
    return archive, python_without_the_project(work)


@pytest.fixture(scope="module")
def started_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with spark_cluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture
def cluster(started_cluster: SparkCluster) -> SparkCluster:
    """The module's cluster (one start for its tests), every worker there: a test that lost one
    has it started again."""
    started_cluster.replace_lost_workers()
    return started_cluster


def executors(cluster: SparkCluster) -> set[Path]:
    """The executor directories the cluster's workers made so far (``worker-N/app-*``)."""
    return set(cluster.root.glob("worker-*/app-*"))


def test_the_readme_job_on_a_cluster_that_loses_a_worker_writes_what_one_process_writes(
    stack: EmbeddedStack, shipped: tuple[Path, Path], cluster: SparkCluster, tmp_path: Path
) -> None:
    kafka = stack.endpoint("kafka")
    prefix = unique_prefix("cluster")
    events = random_history(ChangeFactory(), 3000)
    publish(kafka, prefix, events + random.Random(7).sample(events, 300))
    archive, executor_python = shipped
    job = tmp_path / "job.py"
    job.write_text(readme_job())
    submitted = consumer_config(kafka, prefix, tmp_path / "submitted")
    env = {
        **os.environ,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYSPARK_PYTHON": str(executor_python),
        "SPANNER_CDC_MAX_EVENTS_PER_BATCH": "300",  # many batches: the loss lands inside the run
    }
    before = executors(cluster)
    command = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--master", cluster.master_url,
        "--deploy-mode", "client",
        "--jars", ",".join(map(str, jars("spark"))),
        "--archives", f"{archive}#{SHIPPED}",
        "--conf", f"spark.executorEnv.PYTHONPATH={SHIPPED}",
        "--conf", "spark.executor.memory=1g",
        "--conf", "spark.sql.shuffle.partitions=2",
        str(job), kafka, prefix, str(submitted.output_dir),
    ]  # fmt: skip
    log = tmp_path / "submitted.log"
    with log.open("w") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while committed_batches(submitted) < 2:
            assert process.poll() is None, log.read_text()[-5000:]
            assert time.monotonic() < deadline, "no two batches committed in 300 s"
            time.sleep(0.1)
        cluster.lose_worker(0)
        assert process.wait(600) == 0, log.read_text()[-5000:]
    finally:
        process.kill()
    workers = {path.parent.name for path in executors(cluster) - before}
    assert workers == {"worker-0", "worker-1"}, f"not every worker ran an executor: {workers}"
    assert committed_batches(submitted) > 3, "the loss came after the last batch: nothing tested"

    # What one uninterrupted process makes of the same topics: each key's last image, each change once.
    assert account_sinks(submitted) == expected_account_sinks(events)


def test_consume_drives_a_standalone_cluster(
    stack: EmbeddedStack, shipped: tuple[Path, Path], cluster: SparkCluster, tmp_path: Path
) -> None:
    """``consume --spark-master spark://…`` is the driver; the archive reaches the executors
    through ``--spark-conf spark.archives``, as docs/deployment.md says."""
    kafka = stack.endpoint("kafka")
    prefix = unique_prefix("driven")
    events = random_history(ChangeFactory(), 1000)
    publish(kafka, prefix, events)
    archive, executor_python = shipped
    config = consumer_config(kafka, prefix, tmp_path / "out")
    before = executors(cluster)
    finished = subprocess.run(
        consume_command(
            config,
            "--available-now",
            "true",
            "--spark-master",
            cluster.master_url,
            "--spark-conf",
            f"spark.archives={archive}#{SHIPPED}",
            "--spark-conf",
            f"spark.executorEnv.PYTHONPATH={SHIPPED}",
            max_events_per_batch=500,
        ),
        env={**os.environ, "PYSPARK_PYTHON": str(executor_python)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert executors(cluster) - before, "no executor ran on the cluster"
    changelog = changelog_rows(config, "Accounts", '"envelope$uuid"')
    assert len(changelog) == len(events) == len(set(changelog))
