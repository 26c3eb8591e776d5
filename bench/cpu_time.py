"""Where a figure's CPU went: this process (the producer, for the producer's figures) and the
rest of the machine (on the bench's machine, mostly the broker beside it).

The producer's figures share two cores with the embedded broker: a figure's rate is bounded by
the CPU that every process spends per event, not by the producer's alone. Read from Linux's
``/proc/stat`` (the machine's busy time) and ``getrusage`` (this process's) — a few lines, so
written here rather than taken from a library.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
#: /proc/stat's "cpu" columns that are not busy time: idle and iowait.
_IDLE_COLUMNS = (3, 4)


@dataclass(frozen=True)
class CpuSeconds:
    """CPU seconds since boot: this process's (every thread) and the whole machine's."""

    own: float
    machine: float

    @classmethod
    def now(cls) -> CpuSeconds:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        columns = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = sum(value for index, value in enumerate(columns) if index not in _IDLE_COLUMNS)
        return cls(usage.ru_utime + usage.ru_stime, busy / _TICKS_PER_SECOND)

    def __sub__(self, earlier: CpuSeconds) -> CpuSeconds:
        return CpuSeconds(self.own - earlier.own, self.machine - earlier.machine)

    @property
    def rest(self) -> float:
        """The machine's busy time less this process's (never below zero: the two are sampled
        by different clocks)."""
        return max(self.machine - self.own, 0.0)
