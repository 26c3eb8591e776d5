"""The streaming query's progress, as Spark reports it to its listeners, in the project's metrics.

Spark's Structured Streaming tab (the UI ``consume`` serves) shows the same figures, and with
``spark.sql.streaming.metricsEnabled`` (on for ``consume``) Spark's own metrics system has them
too; this puts them beside the project's metrics on its Prometheus endpoint.
"""

from __future__ import annotations

import math
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from spanner_cdc.consumer.metrics import ConsumerMetrics


class QueryRates(StreamingQueryListener):
    """Called on the driver after each micro-batch with Spark's progress report."""

    def __init__(self, metrics: ConsumerMetrics) -> None:
        self.metrics = metrics

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's name
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802 - Spark's name
        progress = event.progress
        self.metrics.observe_query_rates(
            _rate(progress.inputRowsPerSecond), _rate(progress.processedRowsPerSecond)
        )

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802 - Spark's name
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802 - Spark's name
        pass


def _rate(value: float | None) -> float:
    """Spark reports no rate (NaN) for a batch of no time or rows."""
    return 0.0 if value is None or math.isnan(value) else float(value)
