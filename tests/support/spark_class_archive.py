"""A class-data-sharing archive of Spark's driver JVM, recorded once per test run.

The suite starts Spark's JVM dozens of times (every ``spanner-cdc consume`` it kills, every
demo); each start loads and verifies the same ~20,000 classes, about a third of the 15-20 s a
consumer takes to its first batch on a 2-core machine. Java's own class data sharing
(``-XX:ArchiveClassesAtExit`` once, ``-XX:SharedArchiveFile`` after) maps them from one file
instead. Measured on the 2-core machine: session start 9.2-10.2 s -> 6.1-6.4 s, first job
5.8-5.9 s -> 3.1-3.5 s.

This is test-run plumbing, not the product's: the archive is only valid for one JDK and one
set of Spark jars (the JVM checks both and falls back to loading classes itself, silently, when
they differ), which a test run controls and a user's deployment does not.

``python -m tests.support.spark_class_archive PATH`` records the archive at ``PATH``: it starts
a session the way the consumer does, runs a small job of each kind the consumer runs (a Python
data source, ``mapInArrow``, a Parquet write, a streaming query with ``foreachBatch``), stops,
and waits for the JVM to write the archive as it exits.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Read by Spark's launcher and added to the driver JVM's options (``spark-class``).
OPTIONS_VARIABLE = "SPARK_SUBMIT_OPTS"


def recording_options(archive: Path) -> str:
    return f"-XX:ArchiveClassesAtExit={archive}"


def using_options(archive: Path) -> str:
    return f"-XX:SharedArchiveFile={archive}"


def _identity(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


def _exercise(spark: Any, where: Path) -> None:
    frame = spark.range(1000).selectExpr("id", "cast(id as string) as text")
    frame.mapInArrow(_identity, frame.schema).write.parquet(str(where / "table"))
    spark.read.parquet(str(where / "table")).groupBy("text").count().toArrow()
    query = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 10)
        .load()
        .writeStream.foreachBatch(lambda batch, _: batch.mapInArrow(_identity, batch.schema).toArrow())
        .option("checkpointLocation", str(where / "checkpoint"))
        .trigger(processingTime="0.1 seconds")
        .start()
    )
    deadline = time.monotonic() + 120
    while len(query.recentProgress) < 2 and time.monotonic() < deadline:
        query.awaitTermination(0.2)
    query.stop()


def record(archive: Path) -> None:
    from spanner_cdc.consumer.spark_session import spark_session

    with tempfile.TemporaryDirectory() as scratch:
        spark = spark_session("local[2]", "class-archive", log_dir=Path(scratch) / "logs")
        jvm = spark.sparkContext._gateway.proc
        _exercise(spark, Path(scratch))
        spark.stop()
        jvm.stdin.close()  # the JVM exits when its stdin closes, and writes the archive then
        jvm.wait(180)


if __name__ == "__main__":
    record(Path(sys.argv[1]))
