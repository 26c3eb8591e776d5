"""Python's cyclic garbage collector in Spark's Python workers, while a task of this project runs.

Two costs, both measured in the workers of a warm changelog query:

- *During a task.* The collector walks every young object each few hundred allocations, and
  the oldest generation whenever it has grown by a quarter — here the decoded events a task
  holds, so a task's cost grew with its share (decoding a large share took half as long again
  with it). Decoded events and Kafka messages hold no reference cycles: what a
  task allocates is freed by reference counting, and the collector is off while it runs.
- *After every task.* PySpark's forking daemon runs a full collection in a reused worker after
  each task (``pyspark/daemon.py``), and a full collection walks everything the worker holds —
  PySpark, pyarrow, NumPy and the rest it imported, at every task. What a worker holds by its
  first task of this project is there for its life, so it is frozen then (``gc.freeze``): later collections,
  PySpark's included, skip it. An object of those that became garbage in a reference cycle
  later would never be collected; they are the worker's modules and the first task's context,
  once per worker, not per task.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Whether this process froze its objects (``gc.get_freeze_count`` would walk them all to say).
_frozen = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off for the body (on again after it, if it was on), the worker's objects
    frozen the first time in the process. Enter it after reading a Spark broadcast's value:
    PySpark's ``Broadcast.load`` turns the collector on when it has unpickled the value,
    whatever it found (``pyspark/core/broadcast.py``), which ended the pause for the rest of
    every task that read the batch's context first in its worker."""
    global _frozen  # noqa: PLW0603 - once per process: the worker's life
    if not _frozen:
        gc.freeze()
        _frozen = True
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
