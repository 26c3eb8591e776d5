"""``spanner-cdc consume`` options and the validated configuration they make."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

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
from spanner_cdc.schemas.topics import Topics

SINKS = ("changelog", "replica")
REPLICAS = ("duckdb", "postgres", "delta")
#: The URI schemes a location may have besides a plain path: ``file://`` (a path) and Hadoop's
#: S3A connector's ``s3a://`` (consumer.locations).
LOCAL_SCHEME = "file"
OBJECT_STORE_SCHEME = "s3a"
#: ``scheme://`` at the start of a location: a URI rather than a path.
_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: The driver's own directory when ``--output-dir`` is not a path and ``--local-dir`` is not given.
DEFAULT_LOCAL_DIR = "spanner-cdc-local"


def uri_scheme(text: str) -> str | None:
    """The scheme of a location given as a URI, lower-cased; None for a plain path."""
    found = _URI_SCHEME.match(text)
    return None if found is None else found.group(1).lower()


def location(text: str) -> str:
    """A directory the driver and the executors share: a path, a ``file://`` URI or an
    ``s3a://bucket/path`` URI. Other URIs (``gs://``, ``abfss://``, ``hdfs://``, ``s3://``) are
    refused in one line: taken as a path, ``gs://bucket/x`` would silently be a local directory
    named ``gs:``."""
    scheme = uri_scheme(text)
    if scheme is None or scheme == LOCAL_SCHEME:
        return text
    if scheme == OBJECT_STORE_SCHEME:
        if not urlsplit(text).netloc:
            raise ValueError("an s3a:// location names its bucket: s3a://BUCKET/PATH")
        return text
    raise ValueError(
        f"{scheme}:// locations are not supported: give a path every node mounts, a file:// URI or an "
        "s3a:// URI (docs/deployment.md)"
    )


def local_path(text: str) -> Path:
    """A directory on the driver's own disk: a path or a ``file://`` URI."""
    scheme = uri_scheme(text)
    if scheme == LOCAL_SCHEME:
        return Path(unquote(urlsplit(text).path))
    if scheme is not None:
        raise ValueError("a directory on the driver's disk: a path or a file:// URI")
    return Path(text)


_TABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)?\Z")


def _sink(text: str) -> str:
    return choice(*SINKS)(text)


def _table(text: str) -> str:
    if not _TABLE_NAME.match(text):
        raise ValueError("a table name (letters, digits, underscores; schema.table for a named schema)")
    return text


#: Writer schemas kept at most from the schema topic, by default (``--max-writer-schemas``):
#: Spanner allows 5,000 tables a database and each version of a table publishes two (event and
#: key). A schema costs the consumer its text without docs (6 KB with 32 columns of every type);
#: the text kept is also capped in all (consumer.decode.schema_topic.MAX_KEPT_SCHEMA_BYTES).
MAX_WRITER_SCHEMAS = 20_000
#: How long the broker may hold a fetch of Spark's Kafka source open when it has nothing new.
FETCH_WAIT_MS = 10

CONSUME_OPTIONS = (
    *on_topic(
        "Kafka",
        Option("kafka-bootstrap", "Kafka bootstrap servers", required=True, aliases=("bootstrap-server",)),
        settings_option("kafka-config", "librdkafka"),
        *REGISTRY_OPTIONS,
        Option(
            "topic-prefix", "the producer's topic prefix (its change stream name unless set)", required=True
        ),
        Option(
            "tables",
            "only these tables (comma-separated; default: every {prefix}.<table> topic)",
            _table,
            repeated=True,
        ),
    ),
    *on_topic(
        "sinks",
        Option(
            "output-dir",
            "where the changelog, quarantine and the replica's staged rows go (a path, file:// or "
            "s3a:// URI)",
            location,
            default="spanner-cdc-data",
        ),
        Option(
            "checkpoint-dir",
            "Spark checkpoint, dedupe memory and schema cache (default: <output-dir>/checkpoint; a path, "
            "file:// or s3a:// URI)",
            location,
        ),
        Option(
            "local-dir",
            "the driver's own directory: the DuckDB replica's file, Spark's logs and the dedupe memory's "
            "working copy (default: "
            f"--output-dir when it is a path, else {DEFAULT_LOCAL_DIR})",
            local_path,
        ),
        Option(
            "sinks", "comma-separated subset of changelog,replica", _sink, repeated=True, default=list(SINKS)
        ),
        Option(
            "replica",
            "duckdb (replica.duckdb in --local-dir), postgres, or delta (Delta Lake tables in "
            "<output-dir>/lakehouse, written by Spark)",
            choice(*REPLICAS),
            default="duckdb",
        ),
        Option("postgres-dsn", "PostgreSQL connection string when --replica postgres"),
        Option(
            "postgres-staging",
            "who loads a batch's rows into the PostgreSQL replica before the driver merges them: tasks "
            "(each task its share, in parallel; the executors must reach the database) or driver",
            choice("tasks", "driver"),
            default="tasks",
        ),
        Option(
            "whole-transactions",
            "hold each transaction until the producer's watermarks say it is complete, then apply it "
            "whole, so the replica is a consistent cut (--no-whole-transactions applies every batch as "
            "it comes, for throughput)",
            boolean,
            default=True,
        ),
        Option(
            "history-retention-hours",
            "how long, in commit time, the replica keeps earlier row versions and inserts for streams "
            "(a stream not consumed for longer goes stale; kept only with whole transactions)",
            integer_in(1, 90 * 24),
            default=24,
        ),
        Option(
            "on-bad-message",
            "quarantine (write it to <output-dir>/quarantine with the reason) or fail (stop the query)",
            choice("quarantine", "fail"),
            default="quarantine",
        ),
        Option(
            "dedupe-horizon-seconds",
            "how far back in commit time delivered uuids are remembered for dropping duplicates",
            integer_in(1, 30 * 86400),
            default=3600,
        ),
    ),
    *on_topic(
        "micro-batches",
        Option(
            "max-events-per-batch",
            "most Kafka messages per micro-batch (and held events per slice when the cut releases them)",
            integer_in(1, 10_000_000),
            default=50_000,
        ),
        Option(
            "max-writer-schemas",
            "most writer schemas kept from the schema topic (two per table version: event and key); "
            "further ones are ignored with a warning and their events quarantined as unknown-fingerprint",
            integer_in(100, 10_000_000),
            default=MAX_WRITER_SCHEMAS,
        ),
        Option("trigger-seconds", "seconds between micro-batches", positive_float, default=1.0),
        Option("available-now", "process what is in Kafka now, then exit", boolean, default=False),
    ),
    *on_topic(
        "Kafka",
        Option(
            "starting-offsets",
            "earliest or latest, for a new checkpoint",
            choice("earliest", "latest"),
            default="earliest",
        ),
        Option(
            "fail-on-data-loss",
            "stop when Kafka lost records not read yet (retention, a topic deleted or created again); "
            "false: go on from the earliest records Kafka has (the source's failOnDataLoss)",
            boolean,
            default=True,
        ),
        settings_option(
            "source-option",
            "Spark Kafka source",
            " (e.g. startingTimestamp=…, minPartitions=4, kafka.security.protocol=SASL_SSL; these win "
            "over what the other options set)",
        ),
    ),
    *on_topic(
        "Spark",
        Option("spark-master", "Spark master URL", default="local[2]"),
        Option(
            "spark-ui",
            "serve Spark's web UI, its address in the first line (spark.ui.port and Spark's other "
            "UI settings through --spark-conf)",
            boolean,
            default=True,
        ),
        settings_option(
            "spark-conf",
            "Spark",
            "; launch-time ones too (spark.driver.memory, spark.jars.packages, "
            "spark.driver.extraJavaOptions)",
        ),
    ),
    *on_topic(
        "timeouts, metrics and logs",
        *SERVICE_OPTIONS,
    ),
)


#: librdkafka's SASL mechanisms that log in with a user name and password, and the Java
#: client's login module for each.
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def java_client_settings(librdkafka: dict[str, str]) -> dict[str, str]:
    """``--kafka-config`` (librdkafka's names) for the Java client of Spark's Kafka source: the
    same names, except librdkafka's alias ``sasl.mechanisms`` (the Java client's is
    ``sasl.mechanism``) and a user name and password, which the Java client takes as a JAAS line
    (``sasl.jaas.config``) — unless that is given too, which then wins."""
    own = ("sasl.username", "sasl.password", "sasl.mechanisms")
    settings = {k: v for k, v in librdkafka.items() if k not in own}
    mechanism = librdkafka.get("sasl.mechanism") or librdkafka.get("sasl.mechanisms")
    if mechanism is not None:
        settings["sasl.mechanism"] = mechanism
    module = LOGIN_MODULES.get((mechanism or "").upper())
    if module is not None and "sasl.username" in librdkafka and "sasl.jaas.config" not in librdkafka:
        user, password = (_jaas_quoted(librdkafka.get(k, "")) for k in ("sasl.username", "sasl.password"))
        settings["sasl.jaas.config"] = f"{module} required username={user} password={password};"
    return settings


def _jaas_quoted(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def local_directory(output_dir: str, local_dir: Path | None) -> Path:
    """``--local-dir``; by default ``--output-dir`` when that is on the driver's disk."""
    if local_dir is not None:
        return local_dir
    if uri_scheme(output_dir) in (None, LOCAL_SCHEME):
        return local_path(output_dir)
    return Path(DEFAULT_LOCAL_DIR)


def duckdb_file(output_dir: str, local_dir: Path | None) -> Path:
    """The DuckDB replica's file: ``replica.duckdb`` in the driver's local directory."""
    return local_directory(output_dir, local_dir) / "replica.duckdb"


def require_postgres_dsn(replica: str, postgres_dsn: str | None) -> None:
    """A PostgreSQL replica is named by its connection string (consume and the stream commands)."""
    if replica == "postgres" and not postgres_dsn:
        raise ConfigError("--replica postgres needs --postgres-dsn (or SPANNER_CDC_POSTGRES_DSN)")


@dataclass(frozen=True)
class ConsumerConfig:
    kafka_bootstrap: str
    topic_prefix: str
    output_dir: str
    checkpoint_dir: str | None = None
    local_dir: Path | None = None
    kafka_config: dict[str, str] = field(default_factory=dict)
    schema_registry_url: str | None = None
    schema_registry_config: dict[str, str] = field(default_factory=dict)
    tables: tuple[str, ...] = ()
    sinks: tuple[str, ...] = SINKS
    replica: str = "duckdb"
    postgres_dsn: str | None = None
    postgres_staging: str = "tasks"
    whole_transactions: bool = True
    history_retention_hours: int = 24
    on_bad_message: str = "quarantine"
    dedupe_horizon_seconds: int = 3600
    max_events_per_batch: int = 50_000
    max_writer_schemas: int = MAX_WRITER_SCHEMAS
    trigger_seconds: float = 1.0
    available_now: bool = False
    starting_offsets: str = "earliest"
    fail_on_data_loss: bool = True
    source_option: dict[str, str] = field(default_factory=dict)
    spark_master: str = "local[2]"
    spark_conf: dict[str, str] = field(default_factory=dict)
    spark_ui: bool = True
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    log_format: str = "text"
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not self.sinks:
            raise ConfigError("--sinks must name at least one of changelog, replica")
        if "replica" in self.sinks:
            require_postgres_dsn(self.replica, self.postgres_dsn)

    @property
    def client_config(self) -> dict[str, str]:
        """librdkafka settings for everything that reads Kafka."""
        return {"bootstrap.servers": self.kafka_bootstrap, **self.kafka_config}

    @property
    def source_settings(self) -> dict[str, str]:
        """The options of Spark's Kafka source: the topics, committed records only, the batch
        size, where a new query starts, data loss, ``kafka.<setting>`` for every
        ``--kafka-config`` setting (as :func:`java_client_settings` names it for the Java client),
        then ``--source-option`` over them."""
        settings = {
            "kafka.bootstrap.servers": self.kafka_bootstrap,
            # The Java client's default is read_uncommitted: it would hand over the records of
            # aborted producer transactions.
            "kafka.isolation.level": "read_committed",
            # A task whose offset range ends with a transaction's marker (never handed over)
            # polls past the last record and waits for the broker's answer, the client's default
            # 500 ms (seen in Spark's log, every such task of every batch).
            "kafka.fetch.max.wait.ms": str(FETCH_WAIT_MS),
            "startingOffsets": self.starting_offsets,
            "maxOffsetsPerTrigger": str(self.max_events_per_batch),
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
            **{f"kafka.{key}": value for key, value in java_client_settings(self.kafka_config).items()},
        }
        if self.tables:
            settings["subscribe"] = ",".join(self.table_topics)
        else:
            settings["subscribePattern"] = self.topics.event_pattern
        return {**settings, **self.source_option}

    @property
    def checkpoint_location(self) -> str:
        """``--checkpoint-dir``, by default ``checkpoint`` inside ``--output-dir``."""
        return self.checkpoint_dir or f"{self.output_dir.rstrip('/')}/checkpoint"

    @property
    def local_directory(self) -> Path:
        return local_directory(self.output_dir, self.local_dir)

    @property
    def duckdb_path(self) -> Path:
        return duckdb_file(self.output_dir, self.local_dir)

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)

    @property
    def table_topics(self) -> tuple[str, ...]:
        """The topics ``--tables`` names (empty: every event topic of the prefix)."""
        return tuple(self.topics.event(table) for table in self.tables)

    def subscribed(self, topic: str) -> bool:
        """Does this consumer read ``topic`` (what ``--tables`` or the prefix pattern select)?"""
        if self.tables:
            return topic in self.table_topics
        return self.topics.is_event_topic(topic)

    @classmethod
    def from_options(cls, values: dict[str, Any]) -> ConsumerConfig:
        """From :func:`spanner_cdc.config.resolve` output for CONSUME_OPTIONS."""
        return cls(
            **{
                **values,
                "kafka_config": dict(values["kafka_config"]),
                "schema_registry_config": dict(values["schema_registry_config"]),
                "tables": tuple(values["tables"]),
                "sinks": tuple(dict.fromkeys(values["sinks"])),
                "spark_conf": dict(values["spark_conf"]),
                "source_option": dict(values["source_option"]),
            }
        )
