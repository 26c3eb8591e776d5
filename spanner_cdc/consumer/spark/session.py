"""The consumer's Spark session, with Spark's own output kept off the terminal.

Spark logs through log4j2 to the console, draws stage progress bars, and its JVM and Python
workers print stack traces to the stderr they inherit: on a person's terminal that buries the
project's own progress line and reads like a crash when a stop cancels a job. Given a log
directory, the session sends all of it there: log4j2 to ``spark.log``, the JVM's own stdout and
stderr (and so the workers') to ``spark-jvm.out``, py4j's logs to ``py4j.log``, no progress bars.

The caller's settings (``--spark-conf``) are part of the configuration the JVM is launched
with, so launch-time settings take effect: ``spark.driver.memory``, ``spark.jars.packages``,
``spark.driver.extraJavaOptions`` (after the log configuration's option, so a caller's own
``-D`` of the same name wins). One JVM per process: a session after a stopped one reuses it,
and its log files.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from spanner_cdc.common.jars import jars, log4j2_to_file

_SETTINGS = {
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
}
_DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
JARS_SETTING = "spark.jars"
#: Kept open for the JVM's lifetime (it writes to it); one per process, like the JVM itself.
_jvm_output: IO[bytes] | None = None


#: What a session needs to write Delta tables (static settings: given at its start), besides
#: Delta's jars (the project's ``delta`` jars, resolved at setup).
DELTA_SETTINGS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Delta's state reconstruction otherwise runs 50 tasks per table snapshot.
    "spark.databricks.delta.snapshotPartitions": "2",
}
#: With the UI: the streaming query's rates also in Spark's own metrics system.
_UI_SETTINGS = {"spark.ui.enabled": "true", "spark.sql.streaming.metricsEnabled": "true"}


def spark_session(
    master: str,
    app_name: str,
    extra_conf: Mapping[str, str] | None = None,
    *,
    log_dir: Path | None = None,
    ui: bool = False,
    delta: bool = False,
) -> Any:
    """A session for the consumer (and its tests): Spark's Kafka connector on its classpath, UTC,
    few shuffle partitions; Python workers run this interpreter (it has the project installed).
    With ``log_dir``, Spark's and the JVM's output go to files there (see the module's doc).
    With ``ui``, Spark serves its web UI (``spark.ui.port``, 4040 or the next free one); with
    ``delta``, it writes Delta tables (:data:`DELTA_SETTINGS` and Delta's jars). The caller's
    settings win over all of them."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = SparkConf().setMaster(master).setAppName(app_name).setAll(list(_SETTINGS.items()))
    if ui:
        conf.setAll(list(_UI_SETTINGS.items()))
    if delta:
        conf.setAll(list(DELTA_SETTINGS.items()))
    conf.setAll(list((extra_conf or {}).items()))
    conf.set(JARS_SETTING, with_connector_jars(conf.get(JARS_SETTING, ""), delta=delta))
    if log_dir is not None and SparkContext._gateway is None:  # this session launches the JVM
        _start_jvm_logging_to(log_dir, conf)
    return SparkSession.builder.config(conf=conf).getOrCreate()


def session_hadoop_settings(spark: Any) -> dict[str, str]:
    """The object-store settings (``fs.s3a.*``) of a session's Hadoop configuration."""
    found = spark.sparkContext._jsc.hadoopConfiguration().getValByRegex(r"^fs\.s3a\.")
    return {str(key): str(found.get(key)) for key in found.keySet()}


def with_connector_jars(given: str, *, delta: bool = False) -> str:
    """``spark.jars`` with Spark's connectors (the project's ``spark`` jars: Kafka, S3; with
    ``delta``, the ``delta`` jars too; resolved at setup) after the caller's own. Spark ships
    them to every executor."""
    ours = [str(jar) for jar in [*jars("spark"), *(jars("delta") if delta else [])]]
    return ",".join([entry for entry in given.split(",") if entry.strip()] + ours)


def _start_jvm_logging_to(log_dir: Path, conf: Any) -> None:
    """Start Spark's JVM with its log4j2 configuration and its output in ``log_dir``."""
    global _jvm_output  # noqa: PLW0603 - the JVM outlives any one call; its output file must too
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    log_dir.mkdir(parents=True, exist_ok=True)
    log4j = log4j2_to_file(log_dir / "log4j2.properties", log_dir / "spark.log")
    callers = conf.get(_DRIVER_JAVA_OPTIONS, "")
    conf.set(_DRIVER_JAVA_OPTIONS, f"{log4j} {callers}".rstrip())
    conf.set("spark.ui.showConsoleProgress", "false")
    _jvm_output = (log_dir / "spark-jvm.out").open("ab")
    # py4j logs every exception a Python callback raises, with the Java stack trace inside (a stop
    # that cancels a running batch makes one); it belongs with Spark's logs, not on the screen.
    py4j = logging.getLogger("py4j")
    py4j.addHandler(logging.FileHandler(log_dir / "py4j.log"))
    py4j.propagate = False
    gateway = launch_gateway(conf, popen_kwargs={"stdout": _jvm_output, "stderr": _jvm_output})  # type: ignore[no-untyped-call]
    SparkContext(conf=conf, gateway=gateway)
