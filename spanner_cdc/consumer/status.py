"""The consumer's status page (``common/status_page.py``): the last micro-batch, the replica's
consistent cut and its lag, the events held for it, what was quarantined, the streams over the
replica and their offsets.

Updated on the driver as each batch ends, and handed to the page's thread as plain data.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from spanner_cdc.common.status_page import StatusDocument
from spanner_cdc.schemas.timestamps import format_timestamp_micros, seconds_behind

#: Batches listed on the page, newest first.
BATCHES_SHOWN = 10


@dataclass(frozen=True)
class BatchSeen:
    batch_id: int
    events: int
    duplicates: int
    quarantined: int
    seconds: float
    finished_micros: int

    def summary(self) -> str:
        return (
            f"{self.batch_id}: {self.events:,} events processed in {self.seconds:.2f} s, "
            f"finished {format_timestamp_micros(self.finished_micros)}"
        )

    def row(self) -> list[str]:
        return [
            str(self.batch_id),
            f"{self.events:,}",
            f"{self.duplicates:,}",
            f"{self.quarantined:,}",
            f"{self.seconds:.2f}",
            format_timestamp_micros(self.finished_micros),
        ]


@dataclass(frozen=True)
class StreamSeen:
    """A stream over the replica, as of the last batch."""

    name: str
    table_on: str
    mode: str
    offset_micros: int

    def row(self, cut_micros: int | None) -> list[str]:
        behind = "-" if cut_micros is None else f"{max(0, cut_micros - self.offset_micros) / 1e6:.1f}"
        return [self.name, self.table_on, self.mode, format_timestamp_micros(self.offset_micros), behind]


@dataclass
class ConsumerStatus:
    """What the page shows; ``subject`` names the topics and sinks."""

    subject: str = ""
    batches: list[BatchSeen] = field(default_factory=list)
    cut_micros: int | None = None
    held: int = 0
    whole_transactions: bool = False
    quarantined: Counter[str] = field(default_factory=Counter)
    streams: list[StreamSeen] = field(default_factory=list)

    def batch_done(self, batch: BatchSeen, quarantined: Counter[str]) -> None:
        self.batches = [batch, *self.batches[: BATCHES_SHOWN - 1]]
        self.quarantined.update(quarantined)

    def released(self, cut_micros: int | None, held: int) -> None:
        self.whole_transactions = True
        self.cut_micros, self.held = cut_micros, held

    def document(self) -> StatusDocument:
        last = self.batches[0] if self.batches else None
        summary = [
            ["consuming", self.subject],
            ["last batch", "none yet" if last is None else last.summary()],
        ]
        if self.whole_transactions:
            cut = self.cut_micros
            summary += [
                ["consistent cut", "not yet" if cut is None else format_timestamp_micros(cut)],
                ["consistent cut lag", "-" if cut is None else f"{seconds_behind(cut):.1f} s"],
                ["events held for the cut", f"{self.held:,}"],
            ]
        summary.append(
            ["quarantined since start", ", ".join(f"{r} {n}" for r, n in self.quarantined.items()) or "0"]
        )
        tables = [
            {
                "title": f"Last {len(self.batches)} micro-batches",
                "columns": ["batch", "events", "duplicates", "quarantined", "processed in (s)", "finished"],
                "rows": [batch.row() for batch in self.batches],
            }
        ]
        if self.streams:
            tables.append(
                {
                    "title": f"{len(self.streams)} stream(s) over the replica",
                    "columns": ["stream", "on table", "mode", "offset", "offset behind the cut (s)"],
                    "rows": [stream.row(self.cut_micros) for stream in self.streams],
                }
            )
        return {
            "service": "consumer",
            "updated": format_timestamp_micros(int(time.time() * 1_000_000)),
            "summary": summary,
            "tables": tables,
        }
