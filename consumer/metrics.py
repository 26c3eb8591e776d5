"""Prometheus metrics of the consumer (DESIGN §7)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from spanner_cdc.metrics import ServedMetrics

BATCH_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class ConsumerMetrics(ServedMetrics):
    def __init__(self) -> None:
        super().__init__()
        self.events = Counter(
            "spanner_cdc_consumer_events",
            "Events delivered to the sinks (after dedupe)",
            ["table", "change_type"],
            registry=self.registry,
        )
        self.duplicates = Counter(
            "spanner_cdc_consumer_duplicates",
            "Events dropped as already delivered (same uuid)",
            registry=self.registry,
        )
        self.beyond_horizon = Counter(
            "spanner_cdc_consumer_beyond_dedupe_horizon",
            "Events older than the dedupe horizon, delivered without a uuid check",
            registry=self.registry,
        )
        self.quarantined = Counter(
            "spanner_cdc_consumer_quarantined",
            "Messages quarantined, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.batches = Counter(
            "spanner_cdc_consumer_batches", "Micro-batches by outcome", ["outcome"], registry=self.registry
        )
        self.batch_seconds = Histogram(
            "spanner_cdc_consumer_batch_seconds",
            "Time to write one micro-batch to every sink",
            buckets=BATCH_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.commit_lag = Gauge(
            "spanner_cdc_consumer_commit_lag_seconds",
            "Now minus the newest commit timestamp written to the sinks",
            registry=self.registry,
        )
