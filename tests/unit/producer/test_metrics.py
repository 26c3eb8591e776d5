"""The producer's acknowledged-event metrics read as the client library's own would."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from spanner_cdc.producer.metrics import LATENCY_BUCKETS, ProducerMetrics


def exposed(registry: CollectorRegistry, prefixes: tuple[str, ...]) -> list[str]:
    """The registry's sample lines of the named metrics (creation times left out: they differ)."""
    text = generate_latest(registry).decode()
    return sorted(line for line in text.splitlines() if line.startswith(prefixes) and "_created" not in line)


def test_counts_and_latencies_read_as_a_counter_and_a_histogram_would() -> None:
    rng = random.Random(4)
    metrics = ProducerMetrics()
    reference = CollectorRegistry()
    events = Counter(
        "spanner_cdc_producer_events",
        "Events acknowledged by Kafka",
        ["table", "change_type"],
        registry=reference,
    )
    latency = Histogram(
        "spanner_cdc_producer_commit_to_ack_seconds",
        "Spanner commit timestamp to Kafka acknowledgement",
        buckets=LATENCY_BUCKETS,
        registry=reference,
    )
    # Every bound itself (an observation equal to a bound is in that bucket), beyond the last,
    # and values in between; some events without a latency (backfill rows).
    lags: list[float | None] = [*LATENCY_BUCKETS, 301.0, 0.0, None, None]
    lags += [rng.choice([None, rng.uniform(0, 400), rng.expovariate(2)]) for _ in range(500)]
    for lag in lags:
        table, change_type = rng.choice(["Accounts", 'Odd "name"']), rng.choice(["INSERT", "DELETE"])
        metrics.acknowledged.count(table, change_type, lag)
        events.labels(table, change_type).inc()
        if lag is not None:
            latency.observe(lag)
    names = ("spanner_cdc_producer_events", "spanner_cdc_producer_commit_to_ack")
    ours = exposed(metrics.registry, names)
    assert ours == exposed(reference, names)
    assert any(
        line.startswith('spanner_cdc_producer_commit_to_ack_seconds_bucket{le="1.0"}') for line in ours
    )
