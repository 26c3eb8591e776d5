"""The consumer's Spark session (consumer.spark.session) launches its JVM with the caller's
settings, logs into the log directory, and starts one JVM per process.

In a child process: a session started here cannot be this run's shared one (``spark``), and the
JVM's launch is what is tested."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]

#: Starts a session with launch-time settings, stops it, starts a second (as the bench does for
#: local[1]) and prints what the JVM was launched with and how many JVMs the process started.
CHILD = """
import json, os, subprocess, sys
from pathlib import Path
from spanner_cdc.consumer.spark.session import spark_session

logs, caller_options = Path(sys.argv[1]), sys.argv[2]
settings = {
    "spark.driver.memory": "700m",
    "spark.python.worker.reuse": "false",
    "spark.driver.extraJavaOptions": caller_options,
}
first = spark_session("local[1]", "first", settings, log_dir=logs / "first")
jvm = first.sparkContext._jvm
seen = {
    "max_heap_mib": jvm.java.lang.Runtime.getRuntime().maxMemory() // 2**20,
    "worker_reuse": first.sparkContext.getConf().get("spark.python.worker.reuse"),
    "caller_property": jvm.java.lang.System.getProperty("spanner.cdc.test"),
    "log_configuration": jvm.java.lang.System.getProperty("log4j2.configurationFile"),
}
first.stop()
second = spark_session("local[2]", "second", log_dir=logs / "second")
seen["second_runs"] = second.range(3).count()
children = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout.split()
seen["jvms"] = sum("java" in Path(f"/proc/{pid}/cmdline").read_text() for pid in children)
second.stop()
print(json.dumps(seen))
"""


def test_the_callers_settings_reach_the_jvm_and_a_second_session_reuses_it(tmp_path: Path) -> None:
    """``--spark-conf`` settings read when the JVM starts (its heap, core settings, Java
    options) took effect beside the log configuration's option; they used to be dropped
    whenever the session logged to a directory, which ``spanner-cdc consume`` always does. A
    second session in the process used to launch a JVM that nothing used."""
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), "-Dspanner.cdc.test=caller"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["max_heap_mib"] == 700
    assert seen["worker_reuse"] == "false"
    assert seen["caller_property"] == "caller"
    assert seen["log_configuration"] == f"file:{tmp_path / 'first' / 'log4j2.properties'}"
    assert (tmp_path / "first" / "spark.log").stat().st_size > 0
    assert seen["second_runs"] == 3
    assert seen["jvms"] == 1
