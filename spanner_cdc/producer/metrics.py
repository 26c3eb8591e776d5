"""Prometheus metrics of the producer (docs/design.md §7), on a registry of its own per service."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from spanner_cdc.common.metrics import ServedMetrics

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class ProducerMetrics(ServedMetrics):
    def __init__(self) -> None:
        super().__init__()
        self.events = Counter(
            "spanner_cdc_producer_events",
            "Events acknowledged by Kafka",
            ["table", "change_type"],
            registry=self.registry,
        )
        self._event_counts: dict[tuple[str, str], Counter] = {}
        self.backfill_rows = Counter(
            "spanner_cdc_producer_backfill_rows",
            "Snapshot rows of a backfill acknowledged by Kafka (also counted in events as INSERT)",
            ["table"],
            registry=self.registry,
        )
        self.partitions = Gauge(
            "spanner_cdc_producer_partitions",
            "Change-stream partitions by state",
            ["state"],
            registry=self.registry,
        )
        self.shards_owned = Gauge(
            "spanner_cdc_producer_shards_owned",
            "Shards of the checkpoint topic this process owns (all of them, one, without --group)",
            registry=self.registry,
        )
        self.partitions_owned = Gauge(
            "spanner_cdc_producer_partitions_owned",
            "Unfinished change-stream partitions of this process's shards (spanner_cdc_producer_"
            "partitions counts the whole group's)",
            registry=self.registry,
        )
        self.low_watermark_lag = Gauge(
            "spanner_cdc_producer_low_watermark_lag_seconds",
            "Now minus the low watermark over unfinished partitions",
            registry=self.registry,
        )
        self.published_watermark_lag = Gauge(
            "spanner_cdc_producer_published_watermark_lag_seconds",
            "Now minus the last watermark written to every event-topic partition",
            registry=self.registry,
        )
        self.commit_to_ack = Histogram(
            "spanner_cdc_producer_commit_to_ack_seconds",
            "Spanner commit timestamp to Kafka acknowledgement",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.delivery_errors = Counter(
            "spanner_cdc_producer_delivery_errors", "Events Kafka did not acknowledge", registry=self.registry
        )
        self.dead_letters = Counter(
            "spanner_cdc_producer_dead_letters",
            "Events larger than Kafka accepts, written to _spanner-cdc.{prefix}.dead_letters instead",
            registry=self.registry,
        )
        self.late_records = Counter(
            "spanner_cdc_producer_late_records",
            "Data change records older than their partition's watermark (a server-side ordering bug)",
            registry=self.registry,
        )
        self.queries_ended_early = Counter(
            "spanner_cdc_producer_queries_ended_early",
            "Partition queries that ended before the end timestamp without child partitions (retried)",
            registry=self.registry,
        )
        self.queries_started = Counter(
            "spanner_cdc_producer_queries_started",
            "Change-stream queries started",
            ["kind"],
            registry=self.registry,
        )

    def count_event(self, table: str, change_type: str) -> None:
        """One event acknowledged. Each (table, change type) child is looked up once: ``labels``
        costs several times the count itself, and it ran for every event."""
        child = self._event_counts.get((table, change_type))
        if child is None:
            child = self._event_counts[(table, change_type)] = self.events.labels(table, change_type)
        child.inc()

    def observe_commit_to_ack(self, seconds: float) -> None:
        self.commit_to_ack.observe(seconds)
