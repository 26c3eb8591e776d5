"""One micro-batch, start to finish: decode, quarantine, dedupe, order, write every sink.

The order of writes is what makes a crash at any point harmless. Spark replays an unfinished
batch with the same offsets, and every step repeats its first attempt's result:

1. changelog files and the quarantine file are named by batch id and replaced whole;
2. the replica transaction records the batch id with the data — and, with whole
   transactions, with the held events, watermarks and cut (consumer.sinks.replica.cut) — and
   skips a batch it has;
3. the delivered-uuid memory is saved last, tagged with the batch id; once it has the batch,
   a replay is skipped entirely.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spanner_cdc.consumer.decode import DecodedBatch, DecodedEvent, Quarantined
from spanner_cdc.consumer.dedupe import DeliveredChanges
from spanner_cdc.consumer.errors import BadMessageError
from spanner_cdc.consumer.kafka_rows import DECODE_COLUMNS
from spanner_cdc.consumer.metrics import ConsumerMetrics
from spanner_cdc.consumer.sinks.contents import BatchContents, Sink
from spanner_cdc.consumer.status import BatchSeen
from spanner_cdc.schemas.timestamps import now_micros, seconds_behind

log = logging.getLogger("spanner_cdc.consumer")


@dataclass
class BatchProcessor:
    #: Kafka rows (``kafka_rows.DECODE_SCHEMA``) → events, watermarks and quarantine rows.
    decode: Callable[[pa.Table], DecodedBatch]
    delivered: DeliveredChanges
    #: Written in this order; each must make a replay of the same batch id harmless.
    sinks: Sequence[Sink]
    fail_on_bad_message: bool
    metrics: ConsumerMetrics

    def __call__(self, batch: Any, batch_id: int) -> None:
        """The ``foreachBatch`` function: a Spark DataFrame of Kafka rows and its batch id."""
        self.process(batch.select(*DECODE_COLUMNS).toArrow(), batch_id)

    def process(self, rows: pa.Table, batch_id: int) -> None:
        started = time.monotonic()
        if self.delivered.committed(batch_id):
            self.metrics.batches.labels("replayed-skipped").inc()
            log.info("batch %d was already written by an earlier attempt; skipped", batch_id)
            return
        decoded = self.decode(rows)
        events, quarantined = decoded.events, decoded.quarantined
        if quarantined and self.fail_on_bad_message:
            first = quarantined[0]
            raise BadMessageError(
                f"{first.topic}[{first.partition}] offset {first.offset}: {first.reason} ({first.detail}); "
                f"{len(quarantined)} undecodable message(s) in batch {batch_id}"
            )
        fresh = self._deduplicate(batch_id, events)
        horizon = self.delivered.oldest_remembered(batch_id)
        beyond_horizon = sum(1 for e in fresh if horizon is not None and e.commit_micros < horizon)
        contents = BatchContents(fresh, quarantined, decoded.watermarks)
        for sink in self.sinks:
            sink.write(batch_id, contents)
        self.delivered.remember(batch_id, [e.record["uuid"] for e in fresh], [e.commit_micros for e in fresh])
        self.metrics.tombstones.inc(decoded.tombstones)
        seen = BatchSeen(
            batch_id,
            len(fresh),
            len(events) - len(fresh),
            len(quarantined),
            time.monotonic() - started,
            now_micros(),
        )
        self._observe(seen, fresh, quarantined, beyond_horizon)

    def _deduplicate(self, batch_id: int, events: list[DecodedEvent]) -> list[DecodedEvent]:
        keep = self.delivered.fresh(
            batch_id, [e.record["uuid"] for e in events], [e.commit_micros for e in events]
        )
        return [event for event, kept in zip(events, keep, strict=True) if kept]

    def _observe(
        self,
        seen: BatchSeen,
        fresh: list[DecodedEvent],
        quarantined: list[Quarantined],
        beyond_horizon: int,
    ) -> None:
        batch_id = seen.batch_id
        metrics = self.metrics
        reasons = Counter(q.reason for q in quarantined)
        metrics.observe_batch(seen, reasons)
        metrics.duplicates.inc(seen.duplicates)
        metrics.batches.labels("written").inc()
        metrics.batch_seconds.observe(seen.seconds)
        metrics.beyond_horizon.inc(beyond_horizon)
        counts = Counter((e.record["object"], e.record["source_metadata"]["change_type"]) for e in fresh)
        for (table, change_type), count in counts.items():
            metrics.events.labels(table, change_type).inc(count)
        for reason, count in reasons.items():
            metrics.quarantined.labels(reason).inc(count)
            log.warning("batch %d: quarantined %d message(s): %s", batch_id, count, reason)
        if fresh:
            newest = max(e.commit_micros for e in fresh)
            metrics.commit_lag.set(seconds_behind(newest))
        if beyond_horizon:
            log.warning(
                "batch %d: %d event(s) older than the dedupe horizon were delivered without a uuid check",
                batch_id,
                beyond_horizon,
            )
