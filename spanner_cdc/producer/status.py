"""The producer's status page (``common/status_page.py``): partitions by state with their
lineage, the low watermark and its lag, events per second, and a backfill's tables.

Built on the event loop, where the partition table changes, and handed to the page's thread as
plain data once a second.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from spanner_cdc.common.status_page import StatusDocument
from spanner_cdc.common.waiting import set_within
from spanner_cdc.producer.lineage.partitions import ROOT, Partition, PartitionState
from spanner_cdc.schemas.timestamps import clock_text, format_timestamp_micros, seconds_behind

if TYPE_CHECKING:
    from spanner_cdc.producer.service import ProducerService

#: Finished partitions shown beside the unfinished ones (a long-running stream has thousands).
FINISHED_SHOWN = 20
PUBLISH_EVERY_SECONDS = 1.0


def short_token(token: str) -> str:
    """Enough of a partition token to tell partitions apart on a screen."""
    return token if token == ROOT or len(token) <= 16 else f"{token[:6]}…{token[-6:]}"


def partition_row(partition: Partition) -> list[str]:
    return [
        short_token(partition.token),
        partition.state.value,
        ", ".join(short_token(parent) for parent in partition.parents) or "-",
        clock_text(partition.start_micros),
        clock_text(partition.checkpoint_micros),
        clock_text(partition.watermark_micros),
        str(partition.retries),
    ]


def producer_status(service: ProducerService, per_second: float) -> StatusDocument:
    """The page's document; ``per_second``: events acknowledged per second lately."""
    scheduler = service.scheduler
    counts = scheduler.count_by_state()
    low = scheduler.low_watermark_micros()
    acknowledged = service.publisher.sender.acknowledged
    partitions = list(scheduler.partitions.values())
    unfinished = [p for p in partitions if p.state != PartitionState.FINISHED]
    finished = [p for p in partitions if p.state == PartitionState.FINISHED]
    recent = sorted(finished, key=lambda p: p.start_micros)[-FINISHED_SHOWN:]
    tables = [
        {
            "title": f"Partitions: {len(unfinished)} unfinished, the last {len(recent)} of "
            f"{len(finished)} finished",
            "columns": ["token", "state", "parents", "start", "checkpoint", "watermark", "retries"],
            "rows": [partition_row(p) for p in sorted(unfinished, key=lambda p: p.start_micros) + recent],
        }
    ]
    if service.backfill is not None:
        tables.append(
            {
                "title": "Backfill (watermarks are held below the oldest unfinished snapshot)",
                "columns": ["table", "snapshot", "rows this run", "state"],
                "rows": service.backfill.progress(),
            }
        )
    return {
        "service": "producer",
        "updated": format_timestamp_micros(int(time.time() * 1_000_000)),
        "summary": [
            ["change stream", f"{service.config.database} / {service.config.change_stream}"],
            ["topic prefix", service.config.topic_prefix],
            ["events acknowledged", f"{acknowledged:,} ({per_second:,.0f}/s now)"],
            ["low watermark", "all partitions finished" if low is None else format_timestamp_micros(low)],
            ["low watermark lag", "-" if low is None else f"{seconds_behind(low):.1f} s"],
            ["partitions", ", ".join(f"{state.value.lower()} {counts[state]}" for state in PartitionState)],
        ],
        "tables": tables,
    }


async def publish_status_periodically(service: ProducerService, stop: asyncio.Event) -> None:
    """Until ``stop``: the status page's document, renewed every second."""
    before, acknowledged_before = time.monotonic(), service.publisher.sender.acknowledged
    while not stop.is_set():
        now, acknowledged = time.monotonic(), service.publisher.sender.acknowledged
        per_second = (acknowledged - acknowledged_before) / max(1e-9, now - before)
        before, acknowledged_before = now, acknowledged
        service.metrics.publish_status(producer_status(service, per_second))
        await set_within(stop, PUBLISH_EVERY_SECONDS)


def describe(service: ProducerService, started_at: float) -> str:
    """The progress line: events/s, lag, partitions running/finished, low watermark (and with
    ``--group`` the shards this process owns)."""
    elapsed = max(1e-9, time.monotonic() - started_at)
    counts = service.scheduler.count_by_state()
    low = service.scheduler.low_watermark_micros()
    if low is None:
        watermark, lag = "all partitions finished", "-"
    else:
        watermark, lag = clock_text(low), f"{seconds_behind(low):.1f}s"
    acked = service.publisher.sender.acknowledged
    backfill = service.backfill
    tail = ""
    if backfill is not None and not backfill.finished:
        tail = f"  backfill {backfill.rows_published} rows"
    if service.group is not None:  # the partition counts are the whole group's
        tail += f"  shards {len(service.scheduler.owned)}/{service.scheduler.shards}"
    return (
        f"events {acked} ({acked / elapsed:,.0f}/s)  lag {lag}  "
        f"partitions running {counts[PartitionState.RUNNING]} waiting {counts[PartitionState.CREATED]} "
        f"finished {counts[PartitionState.FINISHED]}  low watermark {watermark}{tail}"
    )
