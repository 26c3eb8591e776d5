"""Where a figure's CPU went: the calling thread (the event loop's, for the producer's figures),
this process, and the rest of the machine (on the bench's machine, mostly the broker beside it).

The producer's figures share two cores with the embedded broker: a figure's rate is bounded by
the CPU every process spends per event, and by the CPU of the one thread that runs the
producer's per-event Python. Read from Linux's ``/proc/stat`` (the machine's busy time),
``getrusage`` (this process's) and ``time.thread_time`` (the thread's) — a few lines, so
written here rather than taken from a library.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
#: /proc/stat's "cpu" columns that are not busy time: idle and iowait.
_IDLE_COLUMNS = (3, 4)


@dataclass(frozen=True)
class CpuSeconds:
    """CPU seconds: this process's (every thread), the whole machine's since boot, and the
    calling thread's."""

    own: float
    machine: float
    thread: float

    @classmethod
    def now(cls) -> CpuSeconds:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        columns = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = sum(value for index, value in enumerate(columns) if index not in _IDLE_COLUMNS)
        return cls(usage.ru_utime + usage.ru_stime, busy / _TICKS_PER_SECOND, time.thread_time())

    def __sub__(self, earlier: CpuSeconds) -> CpuSeconds:
        return CpuSeconds(
            self.own - earlier.own, self.machine - earlier.machine, self.thread - earlier.thread
        )

    @property
    def rest(self) -> float:
        """The machine's busy time less this process's (never below zero: the two are sampled
        by different clocks)."""
        return max(self.machine - self.own, 0.0)
