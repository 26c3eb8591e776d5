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

import ipaddress
import json
import socket
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


#: The names of this machine a request may use beside IP addresses.
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def allowed_hosts(host: str) -> frozenset[str]:
    """The ``Host`` names a request may carry to a server listening on ``host``: the local ones,
    that address, and the machine's own names when it listens on every interface. Any other
    name is refused, so a web page whose name an attacker points at this machine (DNS
    rebinding) cannot read the status or the metrics from a browser."""
    names = {*LOCAL_NAMES, host.lower()}
    if host in WILDCARDS:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return frozenset(names)


def host_allowed(header: str | None, allowed: frozenset[str]) -> bool:
    """Whether a request's ``Host`` header names this server: an IP address (a page served from
    an address is that address's own), or one of ``allowed``. No header (HTTP/1.0): allowed."""
    if not header:
        return True
    if header.startswith("["):  # [IPv6]:port
        name = header[1:].partition("]")[0]
    else:
        name = header.partition(":")[0] if header.count(":") == 1 else header
    name = name.rstrip(".").lower()
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return name in allowed


class StatusServer:
    """``/metrics`` from ``registry``, ``/`` and ``/status.json`` from :meth:`publish`; requests
    whose ``Host`` names another machine are refused (403)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._metrics = make_wsgi_app(registry)
        self._allowed = allowed_hosts(host)
        self._document: bytes = json.dumps(
            {"service": "", "updated": "not yet", "summary": [], "tables": []}
        ).encode()
        self._server: WSGIServer = make_server(
            host, port, self._app, ThreadingWSGIServer, handler_class=_QuietHandler
        )
        # serve_forever looks for a shutdown request between waits of poll_interval (0.5 s by
        # default), so a service's stop would wait up to that long for its page.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="status-page", daemon=True
        )
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
        if not host_allowed(environ.get("HTTP_HOST"), self._allowed):
            start_response("403 Forbidden", [("Content-Type", "text/plain"), ("Content-Length", "13")])
            return [b"unknown Host\n"]
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
