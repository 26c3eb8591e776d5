"""``spanner-cdc produce`` options and the validated configuration they make."""

from __future__ import annotations

import datetime as dt
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spanner_cdc.common.config import (
    CONNECT_TIMEOUT_SECONDS,
    SERVICE_OPTIONS,
    ConfigError,
    Option,
    boolean,
    choice,
    integer_in,
    on_topic,
    positive_float,
    settings_option,
)
from spanner_cdc.common.schema_registry import REGISTRY_OPTIONS
from spanner_cdc.producer.change_stream_rules import MAX_HEARTBEAT_MS, MIN_HEARTBEAT_MS, validate_stream_name
from spanner_cdc.schemas.timestamps import parse_timestamp_micros, timestamp_micros

#: --release-order: wait for the low watermark (every key in commit order), or not.
RELEASE_ORDERS = ("commit", "partition")
#: How far in the future a start timestamp may be before it is an error (clock skew).
FUTURE_START_TOLERANCE_MICROS = 5_000_000
#: The shortest silence after which a partition query counts as stalled (``stall_seconds``).
MIN_STALL_SECONDS = 5.0
RESOURCE_ID_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-_"
ENDPOINT = re.compile(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?")
#: Spanner's database role names (fine-grained access control).
ROLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")


def _resource_id(text: str) -> str:
    if not text or any(c not in RESOURCE_ID_CHARS for c in text):
        raise ValueError("expected lowercase letters, digits, hyphens and underscores")
    return text


def timestamp_or_now(text: str) -> int:
    return timestamp_micros(text if text.upper() != "NOW" else dt.datetime.now(dt.UTC))


def _stream_name(text: str) -> str:
    return validate_stream_name(text)


def _existing_file(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_file():
        raise ValueError("no such file")
    return path


def _endpoint(text: str) -> str:
    if not ENDPOINT.fullmatch(text):
        raise ValueError("expected host or host:port")
    return text


def _role_name(text: str) -> str:
    if not ROLE_NAME.fullmatch(text):
        raise ValueError("expected a role name: a letter, then letters, digits and underscores")
    return text


def table_pattern(text: str) -> str:
    if not text or any(c in text for c in "'\"`;\n"):
        raise ValueError("a table name or glob pattern (quotes and semicolons are not allowed)")
    return text


PRODUCE_OPTIONS = (
    *on_topic(
        "Spanner",
        Option("project", "Google Cloud project id", _resource_id, required=True),
        Option("instance", "Spanner instance id", _resource_id, required=True),
        Option("database", "Spanner database id", _resource_id, required=True),
        Option("change-stream", "change stream to read (a plain identifier)", _stream_name, required=True),
        Option("emulator-host", "host:port of a Spanner emulator (also read from SPANNER_EMULATOR_HOST)"),
        Option(
            "credentials-file",
            "Google Cloud credentials for Spanner: a service account key or user credentials file "
            "(default: application default credentials)",
            _existing_file,
        ),
        Option(
            "spanner-endpoint",
            "Spanner API endpoint as host[:port], e.g. a regional endpoint or Private Service Connect "
            "(default: spanner.googleapis.com)",
            _endpoint,
        ),
        Option("database-role", "database role the queries run as (fine-grained access control)", _role_name),
        Option(
            "rpc-priority",
            "priority of the producer's Spanner queries: low, medium or high (default: Spanner's, high)",
            choice("low", "medium", "high"),
        ),
    ),
    *on_topic(
        "change stream",
        Option(
            "start-timestamp",
            "RFC 3339 commit timestamp to start from, or 'now'; ignored once checkpoints exist",
            timestamp_or_now,
            default="now",
        ),
        Option(
            "end-timestamp",
            "RFC 3339 timestamp to stop at; exit 0 once every partition finished",
            timestamp_or_now,
        ),
        Option(
            "heartbeat-ms",
            "heartbeat interval of the change-stream queries: with --release-order commit, commit → "
            "Kafka waits up to one interval (shorter: less latency, more heartbeat rows per partition)",
            integer_in(MIN_HEARTBEAT_MS, MAX_HEARTBEAT_MS),
            default=2000,
        ),
        Option(
            "release-order",
            "commit: every key's changes reach Kafka in commit order, each change waiting until every "
            "partition has read past it (up to one heartbeat interval); partition: each partition's "
            "changes as soon as read, in commit order within the partition only (a key's changes "
            "from two partitions may arrive out of order; sort_keys order them)",
            choice(*RELEASE_ORDERS),
            default="commit",
        ),
        Option(
            "include-tables",
            "only these tables (comma-separated names or globs)",
            table_pattern,
            repeated=True,
        ),
        Option(
            "exclude-tables",
            "never these tables (comma-separated names or globs)",
            table_pattern,
            repeated=True,
        ),
        Option(
            "payload",
            "captured (what the change record holds: under some value capture types an UPDATE has only "
            "the changed columns, a DELETE only the key) or whole-row (the rest read from Spanner at the "
            "commit: one read per such record)",
            choice("captured", "whole-row"),
            default="captured",
        ),
    ),
    *on_topic(
        "backfill",
        Option(
            "backfill",
            "publish the rows the watched tables hold at the start as INSERT events (read_method "
            "spanner-backfill), once per topic prefix and table; a started backfill always finishes",
            boolean,
            default=False,
        ),
        Option(
            "backfill-tables",
            "with --backfill, only these tables (comma-separated names or globs; default: every "
            "watched table)",
            table_pattern,
            repeated=True,
        ),
        Option(
            "backfill-snapshot",
            "with --backfill, the RFC 3339 time to read tables at, and backfill again a table whose last "
            "backfill under this prefix read another time (default: once per table, at the start)",
            parse_timestamp_micros,
        ),
        Option("backfill-parallelism", "tables a backfill reads at once", integer_in(1, 256), default=4),
    ),
    *on_topic(
        "Kafka",
        Option("topic-prefix", "Kafka topic prefix (default: the change stream name)"),
        Option(
            "format",
            "avro (single-object encoding, or the registry's wire format) or json (the same envelope as "
            "JSON documents, column values by name in Spanner's JSON form); one format per topic prefix",
            choice("avro", "json"),
            default="avro",
        ),
        Option("stream-name", "stream_name in events (default: projects/…/changeStreams/<stream>)"),
        Option("kafka-bootstrap", "Kafka bootstrap servers", required=True, aliases=("bootstrap-server",)),
        settings_option("kafka-config", "librdkafka"),
        *REGISTRY_OPTIONS,
        Option(
            "topic-partitions", "partitions of each event topic it creates", integer_in(1, 10_000), default=6
        ),
        Option(
            "replication-factor",
            "replication factor of the topics it creates (-1: the broker's default)",
            integer_in(-1, 100),
            default=-1,
        ),
    ),
    *on_topic(
        "several processes (--group)",
        Option(
            "group",
            "share the change stream with the other processes started with this group name: each reads "
            "the partitions of the checkpoint-topic shards Kafka's consumer group assigns it "
            "(docs/scale-out.md); default: this process reads every partition",
            _resource_id,
        ),
        Option(
            "group-shards",
            "shards of the checkpoint topic when a --group creates it: the most processes that can "
            "share the work (fixed once created)",
            integer_in(2, 256),
            default=12,
        ),
        Option(
            "group-session-timeout",
            "seconds a --group process may go unheard before the group hands its shards to the others",
            positive_float,
            default=10.0,
        ),
    ),
    *on_topic(
        "reading and checkpoints",
        Option(
            "max-queries", "most change-stream queries running at once", integer_in(1, 10_000), default=200
        ),
        Option("query-start-rate", "most new queries started per second", positive_float, default=50.0),
        Option(
            "stall-heartbeats",
            "restart a partition query silent for this many heartbeat intervals (and at least 5 s)",
            integer_in(2, 1000),
            default=10,
        ),
        Option("checkpoint-interval", "seconds between checkpoint writes", positive_float, default=1.0),
        Option(
            "watermark-interval",
            "seconds between watermark records on every event-topic partition (when it advanced)",
            positive_float,
            default=1.0,
        ),
        Option(
            "watermark-records",
            "write watermark records to the event topics: the consumer's whole transactions need them; "
            "off for topics that only generic sinks read",
            boolean,
            default=True,
        ),
        Option(
            "delete-tombstones",
            "after each delete, a record with the row's key and no value, so that compacted topics "
            "forget deleted rows",
            boolean,
            default=False,
        ),
        Option(
            "on-oversize-event",
            "an event larger than Kafka accepts: dead-letter (its identity and the reason to "
            "_spanner-cdc.{prefix}.dead_letters, then go on) or fail (stop with one line)",
            choice("dead-letter", "fail"),
            default="dead-letter",
        ),
    ),
    *on_topic(
        "timeouts, metrics and logs",
        *SERVICE_OPTIONS,
        Option("progress", "show a live progress line", boolean, default=True),
    ),
)


@dataclass(frozen=True, kw_only=True)
class PublishSettings:
    """What ``produce`` and ``poll`` share: where the database is, where events go, how the
    service runs. The options behind them are declared once, in PRODUCE_OPTIONS; ``poll`` takes
    them by name (``producer.poll.config``)."""

    project: str
    instance: str
    database: str
    kafka_bootstrap: str
    emulator_host: str | None = None
    credentials_file: Path | None = None
    spanner_endpoint: str | None = None
    database_role: str | None = None
    rpc_priority: str | None = None
    #: Empty: each command's default.
    topic_prefix: str = ""
    stream_name: str = ""
    kafka_config: dict[str, str] = field(default_factory=dict)
    schema_registry_url: str | None = None
    schema_registry_config: dict[str, str] = field(default_factory=dict)
    topic_partitions: int = 6
    replication_factor: int = -1
    watermark_interval: float = 1.0
    watermark_records: bool = True
    on_oversize_event: str = "dead-letter"
    #: avro or json (schemas.json_events).
    format: str = "avro"
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    log_format: str = "text"
    log_level: str = "info"
    progress: bool = True

    @property
    def database_path(self) -> str:
        return f"projects/{self.project}/instances/{self.instance}/databases/{self.database}"

    @property
    def json_events(self) -> bool:
        return self.format == "json"

    def check_publishing(self) -> None:
        """What both commands refuse about where and how events go."""
        if self.json_events and self.schema_registry_url:
            raise ConfigError(
                "--format json and --schema-registry-url: the registry's wire format frames Avro; choose one"
            )

    @staticmethod
    def resolved(values: dict[str, Any]) -> dict[str, Any]:
        """:func:`spanner_cdc.common.config.resolve` output with the shared fields' types."""
        return {
            **values,
            "kafka_config": dict(values["kafka_config"]),
            "schema_registry_config": dict(values["schema_registry_config"]),
            "topic_prefix": values["topic_prefix"] or "",
            "stream_name": values["stream_name"] or "",
        }


@dataclass(frozen=True)
class ProducerConfig(PublishSettings):
    change_stream: str
    start_timestamp_micros: int
    end_timestamp_micros: int | None = None
    heartbeat_ms: int = 2000
    #: commit or partition (producer.changestream.release).
    release_order: str = "commit"
    include_tables: tuple[str, ...] = ()
    exclude_tables: tuple[str, ...] = ()
    payload: str = "captured"
    backfill: bool = False
    backfill_tables: tuple[str, ...] = ()
    #: None: each table once, at the run's snapshot; else every chosen table read at it (again).
    backfill_snapshot_micros: int | None = None
    backfill_parallelism: int = 4
    max_queries: int = 200
    query_start_rate: float = 50.0
    stall_heartbeats: int = 10
    checkpoint_interval: float = 1.0
    delete_tombstones: bool = False
    #: The producer group's name (``--group``), or None: one process reads every partition.
    group: str | None = None
    group_shards: int = 12
    group_session_timeout: float = 10.0

    @property
    def in_commit_order(self) -> bool:
        """``--release-order commit``: every change waits for the low watermark
        (producer.changestream.release)."""
        return self.release_order == "commit"

    @property
    def stall_seconds(self) -> float:
        """How long a partition query may stay silent before it is restarted: ``stall_heartbeats``
        intervals, but never under :data:`MIN_STALL_SECONDS` — with a short heartbeat interval a
        pause of the process or the network would otherwise restart every query."""
        return max(MIN_STALL_SECONDS, self.stall_heartbeats * self.heartbeat_ms / 1000)

    def __post_init__(self) -> None:
        self.check_publishing()
        validate_stream_name(self.change_stream)
        if not self.topic_prefix:
            object.__setattr__(self, "topic_prefix", self.change_stream)
        if not self.stream_name:
            object.__setattr__(
                self, "stream_name", f"{self.database_path}/changeStreams/{self.change_stream}"
            )
        now = int(time.time() * 1_000_000)
        if self.start_timestamp_micros > now + FUTURE_START_TOLERANCE_MICROS:
            raise ConfigError("--start-timestamp is in the future; change streams can only be read up to now")
        if self.end_timestamp_micros is not None and self.end_timestamp_micros < self.start_timestamp_micros:
            raise ConfigError("--end-timestamp is before --start-timestamp")
        if not MIN_HEARTBEAT_MS <= self.heartbeat_ms <= MAX_HEARTBEAT_MS:
            raise ConfigError(f"--heartbeat-ms must be {MIN_HEARTBEAT_MS}-{MAX_HEARTBEAT_MS}")
        if self.release_order not in RELEASE_ORDERS:
            raise ConfigError(f"--release-order must be one of {', '.join(RELEASE_ORDERS)}")
        if self.group is not None and self.backfill:
            raise ConfigError(
                "--backfill runs in one process: backfill without --group, then start the group"
            )
        if not 6 <= self.group_session_timeout <= 300:
            raise ConfigError("--group-session-timeout must be 6-300 seconds (the broker's allowed range)")
        if self.backfill_tables and not self.backfill:
            raise ConfigError("--backfill-tables chooses the tables of a backfill: give --backfill too")
        if self.backfill_snapshot_micros is not None:
            if not self.backfill:
                raise ConfigError("--backfill-snapshot is the time of a backfill: give --backfill too")
            if self.backfill_snapshot_micros > now + FUTURE_START_TOLERANCE_MICROS:
                raise ConfigError(
                    "--backfill-snapshot is in the future; a snapshot can only be read up to now"
                )

    @classmethod
    def from_options(cls, values: dict[str, Any]) -> ProducerConfig:
        """From :func:`spanner_cdc.config.resolve` output for PRODUCE_OPTIONS."""
        start = values.pop("start_timestamp")
        end = values.pop("end_timestamp")
        snapshot = values.pop("backfill_snapshot")
        return cls(
            **{
                **cls.resolved(values),
                "include_tables": tuple(values["include_tables"]),
                "exclude_tables": tuple(values["exclude_tables"]),
                "backfill_tables": tuple(values["backfill_tables"]),
            },
            start_timestamp_micros=start,
            end_timestamp_micros=end,
            backfill_snapshot_micros=snapshot,
        )
