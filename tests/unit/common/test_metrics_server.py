"""Where the services' metrics listen."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from spanner_cdc.common.metrics import ServedMetrics

pytestmark = pytest.mark.unit


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_metrics_listen_on_loopback_unless_told_otherwise() -> None:
    metrics = ServedMetrics()
    port = free_port()
    metrics.serve(port)
    try:
        assert metrics.address == ("127.0.0.1", port)
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).status == 200
    finally:
        metrics.close()
