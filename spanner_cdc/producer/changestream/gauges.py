"""The producer's gauges, read from its partition table: partitions by state, the shards and
partitions this process owns, and how far the low and the published watermarks lag."""

from __future__ import annotations

from dataclasses import dataclass

from spanner_cdc.producer.lineage.partitions import PartitionScheduler
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.publish.watermarks import WatermarkEmitter
from spanner_cdc.schemas.timestamps import seconds_behind


@dataclass(frozen=True)
class Gauges:
    metrics: ProducerMetrics
    scheduler: PartitionScheduler
    #: What publishes the watermark records (None: --no-watermark-records).
    watermarks: WatermarkEmitter | None

    def update(self) -> None:
        metrics, scheduler = self.metrics, self.scheduler
        for state, count in scheduler.count_by_state().items():
            metrics.partitions.labels(state.value).set(count)
        metrics.shards_owned.set(len(scheduler.owned))
        metrics.partitions_owned.set(sum(1 for p in scheduler.unfinished() if scheduler.mine(p.token)))
        low = scheduler.low_watermark_micros()
        if low is not None:
            metrics.low_watermark_lag.set(seconds_behind(low))
        published = None if self.watermarks is None else self.watermarks.published_micros
        if published is not None:
            metrics.published_watermark_lag.set(seconds_behind(published))
