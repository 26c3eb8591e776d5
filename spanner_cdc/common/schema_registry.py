"""A thin wrapper over confluent-kafka's Schema Registry client: subjects, ids, and errors.

With ``--schema-registry-url`` the producer frames every message in the registry's wire format
(``schemas.wire.registry_header``) so Kafka Connect's AvroConverter, ksqlDB and Flink read the
event topics, and the consumer resolves those ids here. Subjects follow the
TopicNameStrategy those tools default to: ``{topic}-value`` and ``{topic}-key``. Watermark
records share the event topics but are another record type; registered under ``{topic}-value``
they would fail the registry's compatibility check against the table's event schema, so they go
under ``{topic}-spanner_cdc.Watermark`` (the TopicRecordNameStrategy form). Readers decode by
id, whatever the subject, so a generic sink reads them and drops them by their
``spanner-cdc-kind`` header (docs/producer.md).

The registry only maps ids to schemas. The ``_spanner-cdc.{prefix}.schemas`` topic stays the
consumer's source of the writer schemas it trusts (schemas.schema_check); a registry id is
resolved to a fingerprint that must be known there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from spanner_cdc.common.config import Option, settings_option
from spanner_cdc.common.secrets import redact
from spanner_cdc.errors import RetryableError, SpannerCdcError
from spanner_cdc.schemas.watermark import WATERMARK_SCHEMA
from spanner_cdc.schemas.wire import WriterSchema

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

#: The registry's answer to an id it does not have (Confluent's error code 40403, its client's
#: in-memory registry 40400: the HTTP status is what both agree on).
NOT_FOUND = 404
#: Answers that mean "not now" (a timeout, too many requests): asked again later, never taken as
#: a refusal — the client already retried them with backoff (``max.retries``).
BUSY = frozenset({408, 429})
#: The client's settings it wants as numbers; a setting from the command line or TOML is text.
NUMERIC_SETTINGS = frozenset(
    {
        "max.retries",
        "retries.wait.ms",
        "retries.max.wait.ms",
        "timeout",
        "cache.capacity",
        "cache.latest.ttl.sec",
    }
)
WATERMARK_RECORD_NAME = f"{WATERMARK_SCHEMA['namespace']}.{WATERMARK_SCHEMA['name']}"


class RegistryError(SpannerCdcError):
    """The registry cannot be used as asked: never the fault of one message being decoded."""


class SchemaRegistryUnreachableError(RegistryError, RetryableError):
    """The registry did not answer (network, timeout, a 5xx, 408 or 429): asking again later may work."""


class SchemaRegistryRefusedError(RegistryError):
    """The registry answered no: an incompatible or invalid schema, credentials, a missing id."""

    def __init__(self, message: str, http_status: int) -> None:
        super().__init__(message)
        self.http_status = http_status


def registry_url(text: str) -> str:
    """Option parser: an http(s) URL (the client takes several, comma-separated)."""
    for url in text.split(","):
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{redact(url.strip())!r} is not an http(s) URL")
    return text


REGISTRY_OPTIONS = (
    Option(
        "schema-registry-url",
        "Confluent Schema Registry (or compatible) URL: messages in its wire format, schemas under "
        "{topic}-value and {topic}-key (default: none, Avro single-object encoding)",
        registry_url,
        sensitive=True,
    ),
    settings_option("schema-registry-config", "Schema Registry client"),
)


def value_subject(topic: str) -> str:
    return f"{topic}-value"


def key_subject(topic: str) -> str:
    return f"{topic}-key"


def watermark_subject(topic: str) -> str:
    return f"{topic}-{WATERMARK_RECORD_NAME}"


class SchemaRegistry:
    """Registers writer schemas and reads them back by id, each answer kept for the process's
    life (an id never changes meaning in a registry). Blocking: call from a worker thread where
    an event loop runs."""

    def __init__(self, client: SchemaRegistryClient, url: str) -> None:
        self.client = client
        #: The URL as shown in messages: a password in it is hidden.
        self.url = redact(url)
        self._ids: dict[tuple[str, int], int] = {}
        self._texts: dict[int, str] = {}

    @classmethod
    def connect(cls, url: str, settings: Mapping[str, str]) -> SchemaRegistry:
        """A client for ``url`` with extra client ``settings`` (e.g. ``basic.auth.user.info``)."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        typed: dict[str, Any] = dict(settings)
        for key in NUMERIC_SETTINGS & typed.keys():
            try:
                typed[key] = int(typed[key])
            except ValueError:
                raise RegistryError(
                    f"schema registry setting {key}={typed[key]!r} is not a whole number"
                ) from None
        return cls(SchemaRegistryClient({**typed, "url": url}), url)

    def check_reachable(self) -> None:
        """One request at start-up, so a wrong URL or credentials fail in one line at once."""
        self._ask("list subjects", self.client.get_subjects)

    def register(self, subject: str, writer: WriterSchema) -> int:
        """The id of ``writer`` under ``subject``, registering it when the subject lacks it."""
        cache_key = (subject, writer.fingerprint)
        schema_id = self._ids.get(cache_key)
        if schema_id is None:
            from confluent_kafka.schema_registry import Schema

            schema = Schema(writer.schema_json, "AVRO")
            what = f"register schema {writer.fingerprint_hex} under {subject}"
            schema_id = self._ids[cache_key] = int(
                self._ask(what, self.client.register_schema, subject, schema)
            )
        return schema_id

    def schema_text(self, schema_id: int) -> str:
        """The schema the registry knows as ``schema_id``."""
        text = self._texts.get(schema_id)
        if text is None:
            schema = self._ask(f"read schema id {schema_id}", self.client.get_schema, schema_id)
            text = self._texts[schema_id] = str(schema.schema_str)
        return text

    def _ask(self, what: str, request: Any, *args: Any) -> Any:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return request(*args)
        except SchemaRegistryError as exc:
            status = exc.http_status_code
            message = redact(
                f"schema registry at {self.url}: cannot {what}: {exc.error_message} (HTTP {status})"
            )
            if status >= 500 or status in BUSY:
                raise SchemaRegistryUnreachableError(message) from None
            raise SchemaRegistryRefusedError(message, status) from None
        except Exception as exc:  # the client's HTTP library (httpx or httpx2, by version) and OSError
            raise SchemaRegistryUnreachableError(
                redact(f"schema registry at {self.url} does not answer ({what}): {type(exc).__name__}: {exc}")
            ) from None
