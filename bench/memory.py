"""Peak resident memory of this process while a block runs."""

from __future__ import annotations

import threading
from pathlib import Path


class PeakRss:
    """This process's resident memory, sampled every 20 ms while in use (ru_maxrss never falls)."""

    def __init__(self) -> None:
        self.peak_kib = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakRss:
        self._sampler.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._sampler.join()

    @property
    def peak_mib(self) -> float:
        return self.peak_kib / 1024

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    self.peak_kib = max(self.peak_kib, int(line.split()[1]))
