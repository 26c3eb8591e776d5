"""How the Schema Registry's answers are taken: "not now" (429, 408) is asked again later, never
a refusal — a 429 escaped the decoder as a refusal and stopped the consumer — and an id the
registry does not have is asked once, however many there are."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from spanner_cdc.common.schema_registry import (
    SchemaRegistry,
    SchemaRegistryRefusedError,
    SchemaRegistryUnreachableError,
)
from spanner_cdc.consumer.decode.decoded import Unknown
from spanner_cdc.consumer.decode.driver import BatchDecoder, BrokerPartitions
from spanner_cdc.consumer.decode.gate import DecodeContext
from spanner_cdc.consumer.decode.schema_topic import MAX_REFUSED_SCHEMAS, SchemaTopic
from spanner_cdc.schemas.topics import Topics

pytestmark = pytest.mark.unit


def registry_answering(status: int, asked: list[str] | None = None) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 that answers every request with ``status`` (a registry's
    error body), the paths asked for appended to ``asked``."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if asked is not None:
                asked.append(self.path)
            body = b'{"error_code": %d, "message": "busy"}' % status
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(params=[429, 408, 503])
def busy_registry(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from registry_answering(request.param)


@pytest.fixture
def refusing_registry() -> Iterator[str]:
    yield from registry_answering(401)


def test_a_busy_registry_is_asked_again_later(busy_registry: str) -> None:
    registry = SchemaRegistry.connect(busy_registry, {"max.retries": "1", "retries.wait.ms": "1"})
    with pytest.raises(SchemaRegistryUnreachableError, match="HTTP"):
        registry.schema_text(7)


def test_a_refusal_is_a_refusal(refusing_registry: str) -> None:
    registry = SchemaRegistry.connect(refusing_registry, {"max.retries": "0"})
    with pytest.raises(SchemaRegistryRefusedError) as refused:
        registry.schema_text(7)
    assert refused.value.http_status == 401


def test_ids_the_registry_does_not_have_are_asked_for_once() -> None:
    """Past the first refusals (carried by every batch's context) they were forgotten, and
    asked for again at every batch."""
    asked: list[str] = []
    for url in registry_answering(404, asked):
        registry = SchemaRegistry.connect(url, {"max.retries": "0"})
        decoder = BatchDecoder(SchemaTopic({}, "P"), Topics("P"), BrokerPartitions(dict), registry)
        unknown = [Unknown(schema_id=n) for n in range(1, MAX_REFUSED_SCHEMAS + 201)]
        for _ in range(2):  # two batches meeting the same made-up ids
            learnt = decoder.learn(DecodeContext(Topics("P"), 0), unknown)
            assert learnt is not None
            assert {why[0] for why in learnt.registry_ids.values()} == {"unknown-schema-id"}  # type: ignore[index]
    assert len(asked) == len(unknown)
