"""The running consumer serves Prometheus metrics, and they move as events flow; with the Spark
UI on, its first line names the UI, which shows the query.

(The producer's counterpart is in test_producer_errors.py: events, latency and partitions
scraped while `spanner-cdc produce` runs.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from testkit.consumer_run import consume_command, consumer_config, unique_prefix
from testkit.scrape import fetch, scrape, total
from testkit.synthetic import ChangeFactory, publish, random_history

pytestmark = [pytest.mark.integration, pytest.mark.spark]
EVENTS = "spanner_cdc_consumer_events_total"
DUPLICATES = "spanner_cdc_consumer_duplicates_total"
HELD = "spanner_cdc_consumer_held_events"
QUERY_RATE = "spanner_cdc_consumer_query_rows_per_second"


def test_consumer_metrics_count_what_flows_through_it(stack: EmbeddedStack, tmp_path: Path) -> None:
    config = consumer_config(stack.endpoint("kafka"), unique_prefix("M"), tmp_path)
    history = random_history(ChangeFactory(), 200, keys=20)
    publish(config.kafka_bootstrap, config.topic_prefix, history[:120])
    port, ui_port = free_port(), free_port()
    log = tmp_path / "consumer.log"
    with log.open("w") as stderr:  # not a pipe: nobody reads it until the end, and a full one blocks
        process = subprocess.Popen(
            consume_command(
                config, "--metrics-port", str(port), "--spark-ui", "--spark-conf", f"spark.ui.port={ui_port}"
            ),
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        first = scrape(port, f"{EVENTS}{{", timeout=180)
        assert total(first, EVENTS) > 0, "no events counted"
        assert total(first, "spanner_cdc_consumer_batches_total") >= 1
        publish(config.kafka_bootstrap, config.topic_prefix, history[120:] + history[:10])
        later, deadline = first, time.monotonic() + 180

        def counted_everything() -> bool:
            # The duplicates, and the watermark records that release the held events, may sit in
            # a batch after the one that delivers the last event.
            return (
                total(later, EVENTS) >= len(history)
                and total(later, DUPLICATES) >= 10
                and total(later, HELD) == 0
            )

        while not counted_everything() and time.monotonic() < deadline:
            time.sleep(1)
            later = fetch(port) or later
            assert process.poll() is None, "the consumer stopped"
        assert total(later, EVENTS) == len(history)
        assert total(later, DUPLICATES) == 10
        assert total(later, "spanner_cdc_consumer_watermarks_total") > total(
            first, "spanner_cdc_consumer_watermarks_total"
        )
        assert total(later, HELD) == 0
        assert total(later, QUERY_RATE) > 0, "Spark's rates did not reach the metrics"
        ui = re.search(r"consuming \S+ into [^;\n]+; Spark UI at (http://\S+)", log.read_text())
        assert ui is not None and ui.group(1).endswith(f":{ui_port}"), log.read_text()[-2000:]
        with urllib.request.urlopen(f"{ui.group(1)}/StreamingQuery/", timeout=30) as page:
            assert page.status == 200
            assert "Active Streaming Queries" in page.read().decode()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    assert process.returncode == 0, log.read_text()[-2000:]
