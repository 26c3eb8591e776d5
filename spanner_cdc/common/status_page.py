"""The metrics port of each service: Prometheus metrics at ``/metrics``, and a status page for
people at ``/`` that shows the service's latest status document (``/status.json``).

A status document is plain data the service publishes from its own thread when it has
something new (the producer every second, the consumer after each batch), so the HTTP thread
never reads the service's structures while they change::

    {"service": "producer", "updated": "…", "summary": [["label", "value"], …],
     "tables": [{"title": "…", "columns": ["…"], "rows": [["…"], …]}]}

The page (``status.html``) is one HTML file with a few lines of script (no build step) that
fetches the document every two seconds and draws it; without script it names the document.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

StatusDocument = dict[str, Any]
StartResponse = Callable[[str, list[tuple[str, str]]], Any]

#: The page: a file beside this module, so that it reads as HTML.
PAGE = resources.files(__package__).joinpath("status.html").read_bytes()


class _QuietHandler(WSGIRequestHandler):
    """No access log line per request: the screen is for the service's own lines."""

    def log_message(self, format: str, *args: Any) -> None:
        return


class StatusServer:
    """``/metrics`` from ``registry``, ``/`` and ``/status.json`` from :meth:`publish`."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._metrics = make_wsgi_app(registry)
        self._document: bytes = json.dumps(
            {"service": "", "updated": "not yet", "summary": [], "tables": []}
        ).encode()
        self._server: WSGIServer = make_server(
            host, port, self._app, ThreadingWSGIServer, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(target=self._server.serve_forever, name="status-page", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def publish(self, document: StatusDocument) -> None:
        """The document the page shows from now on (one assignment: readers see old or new)."""
        self._document = json.dumps(document).encode()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path in ("/", "/status"):
            return _respond(start_response, "text/html; charset=utf-8", PAGE)
        if path == "/status.json":
            return _respond(start_response, "application/json", self._document)
        result: Iterable[bytes] = self._metrics(environ, start_response)
        return result


def _respond(start_response: StartResponse, content_type: str, body: bytes) -> list[bytes]:
    start_response(
        "200 OK",
        [("Content-Type", content_type), ("Content-Length", str(len(body))), ("Cache-Control", "no-store")],
    )
    return [body]
