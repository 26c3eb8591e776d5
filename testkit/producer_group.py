"""Producer processes of a ``--group`` run from a test or a benchmark: started with their log in
a file and a metrics port of their own, and read back from both (which shards each owns, which
partition tokens it read when)."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from spanner_cdc.stack.process import free_port
from testkit.scrape import fetch, total

#: "... INFO spanner_cdc.producer.service: shards 0,3 of 6 are this process's now (2 shards in all)"
SHARDS_LINE = re.compile(
    r"^(?P<at>\S+ \S+) INFO \S+: shards (?P<shards>[0-9,]+) "
    r"(?:of \d+ are this process's now|(?P<back>handed back))",
    re.MULTILINE,
)
#: "... DEBUG spanner_cdc.producer.changestream.partition_run: partition T: query started at 1"
QUERY_LINE = re.compile(
    r"^(?P<at>\S+ \S+) DEBUG \S+: partition (?P<token>\S+): query (?P<what>started|stopped)", re.MULTILINE
)


@dataclass
class ProducerProcess:
    """One ``spanner-cdc produce --group`` process, its log and its metrics port."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    port: int
    #: When it was killed (or frozen): its queries open then count as stopped there.
    killed_at: float | None = field(default=None)

    @classmethod
    def start(cls, name: str, command: list[str], log: Path) -> ProducerProcess:
        """``command`` with a metrics port of its own, its stderr (the log) to ``log``."""
        port = free_port()
        with log.open("w") as written:
            process = subprocess.Popen([*command, "--metrics-port", str(port)], stderr=written)
        return cls(name, process, log, port)

    def shards(self) -> float:
        return total(fetch(self.port), "spanner_cdc_producer_shards_owned")

    def owned_shards(self) -> set[int]:
        """The shards this process owns, as its log says."""
        owned: set[int] = set()
        for _, shards, taken in self.shard_moves():
            owned = owned | shards if taken else owned - shards
        return owned

    def shard_moves(self) -> list[tuple[float, set[int], bool]]:
        """(when, shards, True if taken / False if handed back), as its log says."""
        return [
            (_seconds(line["at"]), {int(shard) for shard in line["shards"].split(",")}, not line["back"])
            for line in SHARDS_LINE.finditer(self.log.read_text())
        ]

    def reading(self) -> bool:
        """Whether a query of this process is running now (as its log says)."""
        return any(stopped is None for _, _, stopped in self._spans())

    def queries(self) -> list[tuple[str, float, float]]:
        """(token, started, stopped) of every query this process ran, in wall-clock seconds; a
        query still open when the process was killed stops at the kill."""
        end = self.killed_at if self.killed_at is not None else time.time()
        return [
            (token, started, end if stopped is None else stopped) for token, started, stopped in self._spans()
        ]

    def _spans(self) -> list[tuple[str, float, float | None]]:
        open_since: dict[str, float] = {}
        spans: list[tuple[str, float, float | None]] = []
        for line in QUERY_LINE.finditer(self.log.read_text()):
            at = _seconds(line["at"])
            if line["what"] == "started":
                open_since[line["token"]] = at
            elif line["token"] in open_since:
                spans.append((line["token"], open_since.pop(line["token"]), at))
        return spans + [(token, started, None) for token, started in open_since.items()]


def _seconds(logged: str) -> float:
    """A log line's time (``2026-11-27 14:55:01,123``, local time) as epoch seconds."""
    return dt.datetime.strptime(logged, "%Y-%m-%d %H:%M:%S,%f").timestamp()
