"""The part of Prometheus metrics both services share: a registry of their own and its HTTP port."""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)


class ServedMetrics:
    """A registry per service instance (tests run several in one process), served on request."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server: Any = None

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Expose /metrics on ``host:port`` (port 0 disables it) until :meth:`close`.

        Loopback unless told otherwise: the metrics name tables and topics, which is nobody's
        business on other interfaces by default.
        """
        if port:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)
            log.info("metrics on http://%s:%d/metrics", *self.address)

    @property
    def address(self) -> tuple[str, int]:
        """Where /metrics is served; ("", 0) when it is not."""
        if self._server is None:
            return "", 0
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
