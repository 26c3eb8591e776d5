"""(f) The producer's memory with many partitions running.

A real ``ProducerService`` (scheduler, commit-order release, checkpoints, watermark records, the
real broker) reads a synthetic change stream: the root partition splits into N children at once,
and each child returns a one-mod change and a heartbeat every half second until the end
timestamp, as a busy partition's query does. Only Spanner is replaced — its client's own memory
per stream is not in the figure (the README and docs/producer.md say so).

Run as ``python -m bench.many_partitions --bootstrap HOST:PORT --partitions N``, one fresh
process per figure (memory a process once used is seldom returned); prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Iterator

from bench.memory import PeakRss
from bench.producer import offline_publisher
from spanner_cdc.producer.change_stream_rules import GOOGLE_STANDARD_SQL
from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.producer.lineage.partitions import ROOT, PartitionScheduler
from spanner_cdc.producer.main import wire_service
from spanner_cdc.producer.publish.checkpoints import CheckpointStore
from spanner_cdc.producer.publish.kafka import KafkaClient
from spanner_cdc.producer.spanner.query import ChangeStreamQuery
from spanner_cdc.schemas.records import (
    ChangeStreamRecord,
    ChildPartition,
    ChildPartitionsRecord,
    DataChangeRecord,
    HeartbeatRecord,
)
from spanner_cdc.schemas.timestamps import now_micros
from testkit.records import account_transfer_records

#: Each child partition's answer cadence: a change and a heartbeat this often.
STEP_SECONDS = 0.5


@dataclasses.dataclass
class SyntheticStream:
    """The change stream's answers: the root names ``partitions`` children, each child returns
    a change and a heartbeat every :data:`STEP_SECONDS` until the query's end timestamp."""

    partitions: int
    start_micros: int

    def read(
        self, query: ChangeStreamQuery, token: str | None, start_micros: int
    ) -> Iterator[list[ChangeStreamRecord]]:
        if token is None:
            children = tuple(ChildPartition(f"child-{n:05d}", (ROOT,)) for n in range(self.partitions))
            yield [ChildPartitionsRecord(self.start_micros, "00000001", children)]
            return
        end = query.end_timestamp_micros or 0
        template = DataChangeRecord.from_json(account_transfer_records()[0])
        sequence = 0
        while (now := now_micros()) < end:
            time.sleep(STEP_SECONDS)
            sequence += 1
            change = template._replace(
                commit_timestamp_micros=now,
                server_transaction_id=f"{token}-{sequence}",
                record_sequence=f"{sequence:08d}",
            )
            yield [change, HeartbeatRecord(min(now_micros(), end))]
        yield [HeartbeatRecord(end)]


def run(bootstrap: str, partitions: int, seconds: float) -> dict[str, float]:
    start = now_micros() - 1_000_000
    config = ProducerConfig(
        project="bench", instance="bench", database="bench", change_stream="Many",
        kafka_bootstrap=bootstrap, topic_prefix=f"Many{uuid.uuid4().hex[:8]}",
        start_timestamp_micros=start, end_timestamp_micros=start + int((seconds + 1) * 1_000_000),
        max_queries=max(partitions, 1), query_start_rate=float(max(partitions, 1)), progress=False,
    )  # fmt: skip
    kafka = KafkaClient(bootstrap, config.topic_prefix, {}, 6, 1)
    publisher = offline_publisher(kafka, config.stream_name)
    service = wire_service(
        config,
        source=SyntheticStream(partitions, start),
        dialect=GOOGLE_STANDARD_SQL,
        publisher=publisher,
        checkpoints=CheckpointStore(kafka),
        scheduler=PartitionScheduler.starting_at(start),
        metrics=publisher.sender.metrics,
    )
    with PeakRss() as peak:
        began = time.perf_counter()
        asyncio.run(service.run())
        elapsed = time.perf_counter() - began
    return {
        "partitions": partitions,
        "peak_rss_mib": round(peak.peak_mib, 1),
        "events": publisher.sender.acknowledged,
        "seconds": round(elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    print(json.dumps(run(args.bootstrap, args.partitions, args.seconds)))


if __name__ == "__main__":
    main()
