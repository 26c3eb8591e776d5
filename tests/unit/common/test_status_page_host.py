"""The status server answers requests that name this machine, and refuses any other ``Host``:
a page of another site whose name resolves here (DNS rebinding) must not read it."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from spanner_cdc.common.status_page import StatusServer

pytestmark = pytest.mark.unit


@pytest.fixture
def server() -> Iterator[StatusServer]:
    started = StatusServer(CollectorRegistry(), "127.0.0.1", 0)
    yield started
    started.close()


def status_with_host(server: StatusServer, host: str | None) -> int:
    address, port = server.address
    connection = http.client.HTTPConnection(address, port, timeout=10)
    try:
        connection.putrequest("GET", "/status.json", skip_host=True)
        if host is not None:
            connection.putheader("Host", host)
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:9400", "localhost:9400", "[::1]:9400", None])
def test_this_machine_s_names_are_answered(server: StatusServer, host: str | None) -> None:
    assert status_with_host(server, host) == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:9400", "localhost.evil.example"])
def test_other_names_are_refused(server: StatusServer, host: str) -> None:
    assert status_with_host(server, host) == 403
