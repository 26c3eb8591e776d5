"""Reading a service's Prometheus endpoint the way a scraper does."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def fetch(port: int, path: str = "/metrics") -> str:
    """``path`` (/metrics unless told) now; empty while the service is not serving yet."""
    try:
        return str(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read().decode())
    except OSError:
        return ""


def scrape(port: int, wanted: str, timeout: float = 60) -> str:
    """/metrics once it contains ``wanted`` (or what it had when time ran out)."""
    deadline = time.monotonic() + timeout
    metrics = ""
    while wanted not in metrics and time.monotonic() < deadline:
        time.sleep(0.3)
        metrics = fetch(port) or metrics
    return metrics


def total(metrics: str, sample_name: str) -> float:
    """The sum of every sample called ``sample_name`` (over all label sets)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == sample_name
    )
