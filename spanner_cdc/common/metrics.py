"""The part of Prometheus metrics both services share: a registry of their own and its HTTP port."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, start_http_server


class ServedMetrics:
    """A registry per service instance (tests run several in one process), served on request."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server: Any = None

    def serve(self, port: int) -> None:
        """Expose /metrics on ``port`` (0 disables it) until :meth:`close`."""
        if port:
            self._server, _ = start_http_server(port, addr="0.0.0.0", registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
