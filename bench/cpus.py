"""A Spark session's processes pinned to fewer CPUs, to measure how a job grows with cores.

``local[1]`` against ``local[2]`` cannot show it on a two-core machine: one task at a time
still keeps two processes busy (the source's Python worker feeds the task's through the JVM),
besides the JVM's compiler threads and the driver. Pinning the driver, Spark's JVM and every
process the JVM started (its Python workers) to one CPU, then running the same ``local[2]`` job,
gives the job the cores and nothing else changes. The broker and the database are not pinned:
they are not the job.

Written here rather than taken from a library: ``os.sched_setaffinity`` does the work, and it
pins one thread (Linux affinity is per thread), so every thread of every process is walked.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def pinned(jvm_pid: int, cpus: set[int]) -> Iterator[None]:
    """This process, the JVM ``jvm_pid`` and its descendants on ``cpus``; as before, after."""
    before = os.sched_getaffinity(0)
    _pin({os.getpid()} | _descendants(jvm_pid), cpus)
    try:
        yield
    finally:
        _pin({os.getpid()} | _descendants(jvm_pid), before)


def _pin(pids: set[int], cpus: set[int]) -> None:
    for _ in range(2):  # a thread started while the first pass ran inherits from one not yet pinned
        for pid in pids:
            with contextlib.suppress(OSError):  # a process or thread that ended meanwhile
                for thread in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(int(thread), cpus)


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry))
    found, waiting = set(), [root]
    while waiting:
        pid = waiting.pop()
        found.add(pid)
        waiting.extend(children.get(pid, []))
    return found
