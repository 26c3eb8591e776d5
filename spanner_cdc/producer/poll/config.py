"""``spanner-cdc poll`` options and the validated configuration they make.

Where the database is, the Kafka side and the service options are the producer's own
declarations (one meaning, one help text); the table, its column and the interval are the
poller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spanner_cdc.common.config import ConfigError, Option, on_topic, positive_float
from spanner_cdc.producer.config import PRODUCE_OPTIONS, PublishSettings, table_pattern, timestamp_or_now

#: What polling cannot see, in ``--help`` and docs/reference.md.
POLL_LIMITS = (
    "Polling cannot see deleted rows, nor versions of a row overwritten between two polls (only "
    "the newest is read), nor rows whose column is not set to the commit timestamp."
)
_SHARED = {option.name: option for option in PRODUCE_OPTIONS}


def _shared(*names: str) -> tuple[Option, ...]:
    return tuple(_SHARED[name] for name in names)


def _column_name(text: str) -> str:
    if (
        not text
        or not (text[0].isalpha() or text[0] == "_")
        or not all(c.isalnum() or c == "_" for c in text)
    ):
        raise ValueError("a column name: a letter or underscore, then letters, digits and underscores")
    return text


POLL_OPTIONS = (
    *_shared(
        "project",
        "instance",
        "database",
        "emulator-host",
        "credentials-file",
        "spanner-endpoint",
        "database-role",
        "rpc-priority",
    ),
    *on_topic(
        "polling",
        Option(
            "table",
            "the table to poll (a schema-qualified name in a named schema)",
            table_pattern,
            required=True,
        ),
        Option(
            "commit-timestamp-column",
            "the table's TIMESTAMP column with allow_commit_timestamp=true that every write sets to the "
            "commit timestamp",
            _column_name,
            required=True,
        ),
        Option("interval", "seconds between polls", positive_float, default=1.0),
        Option(
            "start-timestamp",
            "RFC 3339 timestamp: only rows stamped at or after it, or 'now' (default: every stamped row); "
            "ignored once the table has a position under this prefix",
            timestamp_or_now,
        ),
    ),
    *on_topic(
        "Kafka",
        Option("topic-prefix", "Kafka topic prefix of its own (default: poll-<table>)"),
        Option("stream-name", "stream_name in events (default: projects/…/tables/<table>)"),
    ),
    *_shared(
        "kafka-bootstrap",
        "format",
        "kafka-config",
        "schema-registry-url",
        "schema-registry-config",
        "topic-partitions",
        "replication-factor",
        "watermark-interval",
        "watermark-records",
        "on-oversize-event",
        "connect-timeout-seconds",
        "metrics-port",
        "metrics-host",
        "log-format",
        "log-level",
        "progress",
    ),
)


@dataclass(frozen=True)
class PollConfig(PublishSettings):
    table: str
    commit_timestamp_column: str
    #: 0: every stamped row.
    start_timestamp_micros: int = 0
    interval: float = 1.0

    def __post_init__(self) -> None:
        self.check_publishing()
        if any(c in self.table for c in "*?["):
            raise ConfigError("--table names one table, not a pattern")
        if not self.topic_prefix:
            object.__setattr__(self, "topic_prefix", f"poll-{self.table}")
        if not self.stream_name:
            object.__setattr__(self, "stream_name", f"{self.database_path}/tables/{self.table}")

    @classmethod
    def from_options(cls, values: dict[str, Any]) -> PollConfig:
        """From :func:`spanner_cdc.common.config.resolve` output for POLL_OPTIONS."""
        start = values.pop("start_timestamp")
        return cls(**cls.resolved(values), start_timestamp_micros=start or 0)
