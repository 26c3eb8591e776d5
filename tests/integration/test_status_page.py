"""The status page on each service's metrics port, opened in headless Chromium while the
service runs: what a person would read there. Screenshots: the paths in the output."""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spanner_cdc.consumer.sinks.replica.backends import open_backend
from spanner_cdc.consumer.streams.api import StreamReplica
from spanner_cdc.stack import EmbeddedStack
from spanner_cdc.stack.process import free_port
from testkit.consumer_run import consume_command, consumer_config, unique_prefix
from testkit.scrape import fetch, scrape
from testkit.spanner_db import create_database
from testkit.synthetic import ChangeFactory, publish, random_history
from tests.support.browser import rendered
from tests.support.churn import ACCOUNTS_DDL, produce_command
from tests.support.produce_process import published_ids, upsert_account

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def text_of(dom: str) -> str:
    """The page's words as a person reads them: scripts and tags dropped, entities decoded."""
    body = re.sub(r"<(script|noscript)>.*?</\1>", " ", dom.split("<body>", 1)[-1], flags=re.DOTALL)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


def status_summary(port: int) -> dict[str, str]:
    """The summary of the service's status document now (empty while it does not answer)."""
    return dict(json.loads(fetch(port, "/status.json") or '{"summary": []}')["summary"])


def test_the_producer_page_shows_partitions_lineage_and_watermark(
    stack: EmbeddedStack, tmp_path: Path
) -> None:
    database = create_database(stack.endpoint("spanner"), ACCOUNTS_DDL)
    prefix, port = unique_prefix("page"), free_port()
    command = produce_command(stack.endpoint("spanner"), stack.endpoint("kafka"), database, "Bank", prefix,
                              "--metrics-port", str(port))  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        scrape(port, "queries_started_total")
        upsert_account(database, "seen")
        deadline = time.monotonic() + 60
        while "seen" not in published_ids(stack, prefix) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.5)  # the page's document is renewed every second
        screenshot = tmp_path / "producer.png"
        page = text_of(rendered(f"http://127.0.0.1:{port}/", screenshot))
        print(f"producer status page screenshot: {screenshot}")
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert "spanner-cdc producer" in page, page
    assert f"{database.database_id} / Bank" in page and prefix in page
    events = re.search(r"events acknowledged ([\d,]+) \([\d,]+/s now\)", page)
    assert events and int(events.group(1).replace(",", "")) >= 1, page
    assert re.search(r"low watermark \d{4}-\d\d-\d\dT", page), page
    assert re.search(r"low watermark lag [\d.]+ s", page), page
    assert re.search(r"partitions created \d+, running [1-9]\d*, finished \d+", page), page
    assert "token state parents start checkpoint watermark retries" in page
    assert re.search(r"<root> (RUNNING|FINISHED) - ", page), page  # the initial query, no parents
    assert re.search(r"RUNNING <root> ", page), page  # a child of the initial query, its parent named
    assert screenshot.stat().st_size > 0


def test_the_consumer_page_shows_batches_and_the_consistent_cut(stack: EmbeddedStack, tmp_path: Path) -> None:
    kafka = stack.endpoint("kafka")
    prefix, port = unique_prefix("page"), free_port()
    publish(kafka, prefix, random_history(ChangeFactory(), 400))
    config = consumer_config(kafka, prefix, tmp_path / "out")
    streams = StreamReplica(open_backend(config.replica, config.duckdb_path, None))
    streams.create("audit_feed", on="Accounts", mode="append_only")
    streams.close()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    log = tmp_path / "consumer.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            consume_command(config, "--metrics-port", str(port)), env=env, stdout=stderr, stderr=stderr
        )
    try:
        deadline = time.monotonic() + 300
        while status_summary(port).get("consistent cut", "not yet") == "not yet":
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
        screenshot = tmp_path / "consumer.png"
        page = text_of(rendered(f"http://127.0.0.1:{port}/", screenshot))
        print(f"consumer status page screenshot: {screenshot}")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(120)
    assert "spanner-cdc consumer" in page, page
    assert f"consuming {prefix}.* into changelog, replica" in page, page
    assert re.search(r"last batch \d+: [\d,]+ events processed in [\d.]+ s, finished \d{4}-", page), page
    assert re.search(r"consistent cut \d{4}-\d\d-\d\dT", page), page
    assert re.search(r"events held for the cut [\d,]+", page), page
    assert "quarantined since start 0" in page
    assert re.search(r"batch events duplicates quarantined processed in \(s\) finished \d+ [\d,]+ ", page), (
        page
    )
    assert "1 stream(s) over the replica" in page, page
    assert re.search(r"audit_feed Accounts append_only 1970-01-01T00:00:00(\.0+)?Z [\d.]+", page), page
