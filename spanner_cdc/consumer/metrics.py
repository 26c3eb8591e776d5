"""Prometheus metrics of the consumer (docs/design.md §7)."""

from __future__ import annotations

import time
from collections import Counter as CounterOf

from prometheus_client import Counter, Gauge, Histogram

from spanner_cdc.common.metrics import ServedMetrics
from spanner_cdc.consumer.status import BatchSeen, ConsumerStatus, StreamSeen

BATCH_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class ConsumerMetrics(ServedMetrics):
    """The consumer's metrics and, from the same observations, its status page."""

    def __init__(self, subject: str = "") -> None:
        super().__init__()
        self.status = ConsumerStatus(subject)
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
        self.lost_offsets = Counter(
            "spanner_cdc_consumer_lost_offsets",
            "Offsets gone from Kafka before a batch read them, skipped (--fail-on-data-loss false)",
            registry=self.registry,
        )
        self.tombstones = Counter(
            "spanner_cdc_consumer_tombstones",
            "Keyed messages without a value (the producer's --delete-tombstones), skipped",
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
        self.watermarks = Counter(
            "spanner_cdc_consumer_watermarks",
            "Watermark records read (control records, not written to any sink)",
            registry=self.registry,
        )
        self.held_events = Gauge(
            "spanner_cdc_consumer_held_events",
            "Events waiting for the cut to pass their commit timestamp",
            registry=self.registry,
        )
        self.cut_lag = Gauge(
            "spanner_cdc_consumer_consistent_cut_lag_seconds",
            "Now minus the replica's consistent cut",
            registry=self.registry,
        )
        self.incomplete_transactions = Counter(
            "spanner_cdc_consumer_incomplete_transactions",
            "Transactions applied when the cut passed them without all their records",
            registry=self.registry,
        )
        self.behind_cut = Counter(
            "spanner_cdc_consumer_events_behind_cut",
            "Events that arrived committed at or before the recorded cut",
            registry=self.registry,
        )
        self.query_rates = Gauge(
            "spanner_cdc_consumer_query_rows_per_second",
            "The streaming query's rates in its last micro-batch, as Spark reports them "
            "(StreamingQueryProgress: input, read by the Kafka source; processed)",
            ["rate"],
            registry=self.registry,
        )
        self.stopped_changes = Counter(
            "spanner_cdc_consumer_replica_stopped_changes",
            "Changes of tables stopped in the replica, not applied (cdc$stopped)",
            ["table"],
            registry=self.registry,
        )

    def observe_query_rates(self, input_rows_per_second: float, processed_rows_per_second: float) -> None:
        """The rates of the streaming query's last progress report (Spark's own figures)."""
        self.query_rates.labels("input").set(input_rows_per_second)
        self.query_rates.labels("processed").set(processed_rows_per_second)

    def observe_batch(self, batch: BatchSeen, quarantined: CounterOf[str]) -> None:
        """The end of a written batch: the status page shows it."""
        self.status.batch_done(batch, quarantined)
        self.publish_status(self.status.document())

    def observe_streams(self, streams: list[StreamSeen]) -> None:
        """The streams over the replica as of the batch being committed."""
        self.status.streams = streams

    def observe_release(
        self, cut_micros: int | None, held: int, incomplete_transactions: int, behind_cut: int
    ) -> None:
        """What the replica's consistent cut released of a batch (``sinks.replica.cut.Release``)."""
        self.status.released(cut_micros, held)
        self.held_events.set(held)
        self.incomplete_transactions.inc(incomplete_transactions)
        self.behind_cut.inc(behind_cut)
        if cut_micros is not None:
            self.cut_lag.set(max(0.0, time.time() - cut_micros / 1_000_000))
