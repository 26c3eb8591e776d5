"""The part of Prometheus metrics both services share: a registry of their own and its HTTP port,
which also serves the service's status page (``common/status_page.py``)."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry

from spanner_cdc.common.status_page import StatusDocument, StatusServer

log = logging.getLogger(__name__)


class ServedMetrics:
    """A registry per service instance (tests run several in one process), served on request."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server: StatusServer | None = None

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Expose /metrics and the status page on ``host:port`` (port 0 disables both) until
        :meth:`close`.

        Loopback unless told otherwise: the metrics name tables and topics, which is nobody's
        business on other interfaces by default.
        """
        if port:
            self._server = StatusServer(self.registry, host, port)
            log.info(
                "metrics on http://%s:%d/metrics, status page on http://%s:%d/", *self.address, *self.address
            )

    def publish_status(self, document: StatusDocument) -> None:
        """What the status page shows from now on (nothing happens when nothing is served)."""
        if self._server is not None:
            self._server.publish(document)

    @property
    def address(self) -> tuple[str, int]:
        """Where /metrics is served; ("", 0) when it is not."""
        if self._server is None:
            return "", 0
        return self._server.address

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
