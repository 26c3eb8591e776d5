"""A class-data-sharing archive of Spark's driver JVM, recorded once per test run.

The suite starts Spark's JVM dozens of times (every ``spanner-cdc consume`` it kills, every
demo); each start loads and verifies the same classes, about a third of the 15-20 s a
consumer takes to its first batch on a 2-core machine. Java's own class data sharing
(``-XX:ArchiveClassesAtExit`` once, ``-XX:SharedArchiveFile`` after) maps them from one file
instead. Measured on the 2-core machine: session start 9.2-10.2 s -> 6.1-6.4 s, first job
5.8-5.9 s -> 3.1-3.5 s.

This is test-run plumbing, not the product's: the archive is only valid for one JDK and one
set of Spark jars (the JVM checks both, and when they differ loads its classes itself with a
warning in its own output), which a test run controls and a user's deployment does not.

``python -m tests.support.spark_class_archive PATH`` records the archive at ``PATH``: it starts
a session the way the consumer does, runs a small job of each kind the consumer runs
(``mapInArrow``, a Parquet write and read, a streaming query with ``foreachBatch``), stops, and
waits for the JVM to write the archive as it exits — about a minute on 2 cores, 20 s of it the
dump. :class:`ArchiveRecording` runs that in the background while the first tests run, once per
test run: the first pytest worker to ask records it in a directory the workers share, the
others wait for its outcome file. JVMs started once it is done use the archive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Read by Spark's launcher and added to the driver JVM's options (``spark-class``).
OPTIONS_VARIABLE = "SPARK_SUBMIT_OPTS"


def recording_options(archive: Path) -> str:
    return f"-XX:ArchiveClassesAtExit={archive}"


def using_options(archive: Path) -> str:
    return f"-XX:SharedArchiveFile={archive}"


def with_options(*options: str) -> str:
    """:data:`OPTIONS_VARIABLE` as it is now, with ``options`` after what it holds."""
    return " ".join([os.environ.get(OPTIONS_VARIABLE, ""), *options]).strip()


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
    from spanner_cdc.consumer.spark.session import spark_session

    with tempfile.TemporaryDirectory() as scratch:
        spark = spark_session("local[2]", "class-archive", log_dir=Path(scratch) / "logs")
        jvm = spark.sparkContext._gateway.proc
        _exercise(spark, Path(scratch))
        spark.stop()
        jvm.stdin.close()  # the JVM exits when its stdin closes, and writes the archive then
        jvm.wait(180)


class ArchiveRecording:
    """The recording in ``directory``, started in the background by the first worker whose
    :class:`ArchiveRecording` claims the directory; :meth:`use_if_recorded` points the JVMs
    started afterwards at the archive once its outcome is written (between tests, so a test's
    JVMs agree)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.archive = directory / "driver.jsa"
        self._log = directory / "recording.log"
        self._outcome = outcome_file(self.archive)
        self._process: subprocess.Popen[bytes] | None = None
        self._settled = False
        try:
            os.close(os.open(directory / "claimed", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return  # another worker records it
        with self._log.open("w") as output:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(self.archive)],
                env={**os.environ, OPTIONS_VARIABLE: with_options(recording_options(self.archive))},
                stdout=output,
                stderr=output,
                start_new_session=True,  # its JVM with it, when stopped
            )

    def use_if_recorded(self) -> None:
        if self._settled or not self._outcome.is_file():
            return
        self._settled = True
        if self._outcome.read_text() != RECORDED:
            tail = self._log.read_text()[-500:]
            warnings.warn(f"no Spark class archive, JVMs start slower: {tail}", stacklevel=1)
            return
        os.environ[OPTIONS_VARIABLE] = with_options(using_options(self.archive))

    def stop(self) -> None:
        """End a recording this worker started that is still running (a short test run), its
        JVM included."""
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()


#: The outcome file's text when the archive was written.
RECORDED = "recorded"


def outcome_file(archive: Path) -> Path:
    """Written when the recording ends: :data:`RECORDED`, or why there is no archive."""
    return archive.with_suffix(".outcome")


def _record_with_outcome(archive: Path) -> None:
    try:
        record(archive)
    except BaseException as exc:
        outcome_file(archive).write_text(f"failed: {exc!r}")
        raise
    outcome_file(archive).write_text(RECORDED if archive.is_file() else "failed: the JVM wrote no archive")


if __name__ == "__main__":
    _record_with_outcome(Path(sys.argv[1]))
