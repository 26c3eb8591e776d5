"""Stopping the streaming query between micro-batches, never inside one.

Spark's ``query.stop()`` interrupts the query's thread wherever it is. Inside a batch that
cancels the running Spark job: nothing is lost (the batch has no commit, so the next start
runs it again), but Spark reports the cancelled job with long Java stack traces, and a person
reads them as a crash. Waiting for a moment between batches does not work either: with a
trigger every half second and batches that take about as long, the query is almost never
idle.

So a stop closes a gate instead. The batch that runs finishes and commits; the next one is
refused before it does any work, which ends the query with :class:`StoppingBeforeBatchError` — Spark
has written that batch's offsets but no commit, so the next start plans the same batch again.
When no batch follows (no data), the query is stopped while it waits for its next trigger.
A second SIGINT/SIGTERM does not wait for a long batch: the query stops at once and one
line says which batch is run again at the next start.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from spanner_cdc.consumer.errors import ConsumerError

log = logging.getLogger("spanner_cdc.consumer")
POLL_SECONDS = 0.5
#: A Python traceback and the line it ends with: the exception, whatever its class is called
#: (pyarrow's ``ArrowInvalid`` ends in neither Error nor Exception).
PYTHON_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):\n(?:[ \t].*\n)+(\S.*)$", re.MULTILINE)
PYTHON_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception): .*$", re.MULTILINE)
#: A Java cause in a JVM stack trace: ``Caused by: <class>: <message>``.
JAVA_CAUSE = re.compile(r"^Caused by: ([\w.$]+): (.+)$", re.MULTILINE)
#: What a Python call into the JVM raises when the JVM failed: the cause is in the Java trace.
PY4J_ERROR = "Py4JJavaError"
#: Java causes that only wrap another (their message says nothing of what failed).
JAVA_WRAPPERS = ("org.apache.spark.SparkException", "java.util.concurrent.ExecutionException")


class StoppingBeforeBatchError(ConsumerError):
    """Raised in ``foreachBatch`` to end the query before a batch starts (not a failure)."""


@dataclass
class StopRequest:
    """``requested``: stop after the running batch; ``urgent``: stop now, even inside a batch."""

    requested: threading.Event = field(default_factory=threading.Event)
    urgent: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def already(cls) -> StopRequest:
        """A request made before the query runs: its first batch-free moment ends it."""
        request = cls()
        request.requested.set()
        return request

    def signal(self) -> None:
        """One more SIGINT/SIGTERM: the first asks for a stop, the second for a stop now."""
        (self.urgent if self.requested.is_set() else self.requested).set()


@contextmanager
def stop_requested() -> Iterator[StopRequest]:
    """SIGINT/SIGTERM make a :class:`StopRequest` instead of killing the process mid-batch."""
    request = StopRequest()
    previous = {s: signal.signal(s, lambda *_: request.signal()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class BatchGate:
    """Which micro-batch runs (if any), and whether the next one may start."""

    def __init__(self) -> None:
        self._state = threading.Condition()
        self._closed = False
        self._running: int | None = None
        #: The batch refused at the gate: the query ended before it, as asked.
        self.refused: int | None = None

    @contextmanager
    def batch(self, batch_id: int) -> Iterator[None]:
        """Around one ``foreachBatch`` call; raises :class:`StoppingBeforeBatchError` once closed."""
        with self._state:
            if self._closed:
                self.refused = batch_id
                raise StoppingBeforeBatchError(f"batch {batch_id} not started: the consumer is stopping")
            self._running = batch_id
        try:
            yield
        finally:
            with self._state:
                self._running = None
                self._state.notify_all()

    def close(self, urgent: threading.Event) -> int | None:
        """Refuse every batch from now on and wait for the running one to return; returns the
        batch still running if ``urgent`` was set first."""
        with self._state:
            self._closed = True
            while self._running is not None and not urgent.is_set():
                self._state.wait(POLL_SECONDS)
            return self._running


def stop_between_batches(query: Any, gate: BatchGate, request: StopRequest, idle_seconds: float) -> None:
    """Run ``query`` until it ends or ``request`` asks; then end it between two batches.

    ``idle_seconds`` is how long to wait for a next batch to be refused before stopping a
    query that starts none (a little over one trigger interval).
    """
    from pyspark.errors import StreamingQueryException

    try:
        while query.isActive and not request.requested.is_set():
            query.awaitTermination(POLL_SECONDS)
        if query.isActive:
            cut_short = gate.close(request.urgent)
            if cut_short is not None:
                log.warning(
                    "stopping inside batch %d (second stop signal): it runs again at the next start",
                    cut_short,
                )
            else:
                query.awaitTermination(idle_seconds)
        query.stop()
    except StreamingQueryException as exc:
        if gate.refused is None:
            raise ConsumerError(f"the streaming query failed: {python_error(str(exc))}") from None
    if gate.refused is not None:
        log.info("stopped after the last whole batch; batch %d runs at the next start", gate.refused)


def python_error(text: str) -> str:
    """The Python exception line inside Spark's report (its traceback is noise for a user): the
    line the last Python traceback ends with, else the last line that names an error. Where that
    is a call into the JVM that failed (a batch's Spark job: data Kafka no longer has, say), the
    first Java cause that is not a mere wrapper, by its message."""
    found = PYTHON_TRACEBACK.findall(text) or PYTHON_ERROR_LINE.findall(text)
    line = found[-1].strip() if found else text.strip().splitlines()[0]
    if PY4J_ERROR in line:
        causes = [message for name, message in JAVA_CAUSE.findall(text) if name not in JAVA_WRAPPERS]
        if causes:
            return str(causes[0]).strip()
    return line
