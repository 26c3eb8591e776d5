"""Prometheus metrics of the producer (docs/design.md §7), on a registry of its own per service."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from prometheus_client import Counter, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from spanner_cdc.common.metrics import ServedMetrics

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class AcknowledgedEvents(Collector):
    """``spanner_cdc_producer_events_total`` (by table and change type) and the histogram
    ``spanner_cdc_producer_commit_to_ack_seconds``, counted in plain numbers and exposed at each
    scrape. Both move once per commit timestamp of a batch of events, on the event loop's
    thread: the client library's ``Counter.inc`` and ``Histogram.observe`` take a lock and walk
    their children or buckets per call, and it offers no way to add many observations at once;
    in a profile of the producer they were most of a delivery report's cost. A scrape (on the
    metrics server's thread) reads copies, each made whole under the interpreter lock."""

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], int] = {}
        #: Observations per bucket (not cumulative; the last is beyond the largest bound).
        self._buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self._seconds = 0.0

    def count(self, table: str, change_type: str, lag_seconds: float | None, events: int = 1) -> None:
        """``events`` acknowledged, ``lag_seconds`` after their commit (None: they have no commit
        to measure from, as backfill rows, whose timestamp is their snapshot's)."""
        counts = self._events
        key = (table, change_type)
        counts[key] = counts.get(key, 0) + events
        if lag_seconds is not None:
            self._buckets[bisect.bisect_left(LATENCY_BUCKETS, lag_seconds)] += events
            self._seconds += lag_seconds * events

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "spanner_cdc_producer_events", "Events acknowledged by Kafka", labels=["table", "change_type"]
        )
        for (table, change_type), count in dict(self._events).items():
            events.add_metric([table, change_type], count)
        yield events
        buckets, seconds = list(self._buckets), self._seconds
        cumulative, total = [], 0
        for bound, count in zip((*map(floatToGoString, LATENCY_BUCKETS), "+Inf"), buckets, strict=True):
            total += count
            cumulative.append((bound, total))
        yield HistogramMetricFamily(
            "spanner_cdc_producer_commit_to_ack_seconds",
            "Spanner commit timestamp to Kafka acknowledgement",
            buckets=cumulative,
            sum_value=seconds,
        )


class ProducerMetrics(ServedMetrics):
    def __init__(self) -> None:
        super().__init__()
        self.acknowledged = AcknowledgedEvents()
        self.registry.register(self.acknowledged)
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
