"""The options of the ``spanner_cdc_kafka`` source, by the names Spark's built-in ``kafka``
source uses, so that switching between the two changes the format and nothing else.

``kafka.<setting>`` options go to the client. Spark's source hands them to the Java client,
this one to librdkafka; most names are the same in both, and the few that differ for the same
meaning are translated here (:data:`JAVA_ONLY`). Java-only settings with no librdkafka
counterpart (JKS key stores) are refused with a line that says what to use instead, rather
than passed on to fail later with librdkafka's own message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from spanner_cdc.common.kafka_offsets import READER_SETTINGS
from spanner_cdc.errors import SpannerCdcError

#: ``{"topic": {"partition": offset}}``; -2 is earliest and -1 latest, as in Spark's JSON form.
Offsets = dict[str, dict[str, int]]
#: A time in milliseconds for every partition read, or ``{"topic": {"partition": millis}}``.
TimeSpec = int | dict[str, dict[str, int]]
#: ``startingOffsetsByTimestampStrategy``: what a partition with no record at or after its time does.
STRATEGIES = ("error", "latest")
EARLIEST, LATEST = -2, -1
#: This source's own option (Spark's ignores it): the task slots a micro-batch is spread over.
PARALLELISM = "parallelism"
_DURATION = re.compile(r"(\d+)\s*(us|ms|s|m|min|h|d)?")
_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_JAAS = re.compile(r"""(username|password)\s*=\s*"((?:[^"\\]|\\.)*)\"""")
#: Java client name → librdkafka name, where only the name differs.
RENAMED = {"sasl.mechanism": "sasl.mechanisms"}
#: Java client settings librdkafka has no counterpart for, and what to set instead.
JAVA_ONLY = {
    "ssl.truststore.location": "kafka.ssl.ca.location (a PEM file)",
    "ssl.truststore.password": "kafka.ssl.ca.location (a PEM file needs no password)",
    "ssl.keystore.location": "kafka.ssl.certificate.location and kafka.ssl.key.location (PEM files)",
    "ssl.keystore.password": "kafka.ssl.key.password",
}


class KafkaSourceError(SpannerCdcError):
    """Misconfiguration or data loss; the message says which option or offsets."""


@dataclass(frozen=True)
class SourceOptions:
    client: dict[str, str]
    topics: tuple[str, ...]
    pattern: re.Pattern[str] | None
    #: ``assign``: exactly these partitions of these topics.
    assigned: dict[str, tuple[int, ...]] | None
    starting: str
    ending: str
    #: ``startingTimestamp`` or else ``startingOffsetsByTimestamp`` (both before ``startingOffsets``).
    starting_times: TimeSpec | None
    #: ``error`` (Spark's default) or ``latest``.
    starting_strategy: str
    #: ``endingTimestamp`` or else ``endingOffsetsByTimestamp`` (batch reads).
    ending_times: TimeSpec | None
    max_rows: int | None
    #: ``minOffsetsPerTrigger``: a trigger with fewer new records waits, up to ``max_delay_seconds``
    #: (``maxTriggerDelay``) since the last batch.
    min_rows: int | None
    max_delay_seconds: float
    min_partitions: int | None
    #: ``maxRecordsPerPartition``: no task reads more offsets than this.
    max_records: int | None
    #: The task slots a micro-batch is spread over (our option ``parallelism``; None: not given).
    parallelism: int | None
    fail_on_data_loss: bool
    include_headers: bool

    @classmethod
    def parse(cls, given: dict[str, str]) -> SourceOptions:
        """Spark hands data sources their options with lower-cased names; so does this."""
        options = {key.lower(): value for key, value in given.items()}
        if not options.get("kafka.bootstrap.servers"):
            raise KafkaSourceError("option kafka.bootstrap.servers is required")
        chosen = [name for name in ("assign", "subscribe", "subscribepattern") if options.get(name)]
        if len(chosen) != 1:
            raise KafkaSourceError("set exactly one of the options assign, subscribe and subscribePattern")
        strategy = options.get("startingoffsetsbytimestampstrategy", "error").lower()
        if strategy not in STRATEGIES:
            raise KafkaSourceError(
                f"startingOffsetsByTimestampStrategy must be error or latest, got {strategy!r}"
            )
        pattern = options.get("subscribepattern")
        return cls(
            client=client_settings(options),
            topics=tuple(t.strip() for t in options.get("subscribe", "").split(",") if t.strip()),
            pattern=re.compile(pattern) if pattern else None,
            assigned=_assigned(options["assign"]) if "assign" in options else None,
            starting=options.get("startingoffsets", ""),
            ending=options.get("endingoffsets", "latest"),
            starting_times=_times(options, "startingTimestamp", "startingOffsetsByTimestamp"),
            starting_strategy=strategy,
            ending_times=_times(options, "endingTimestamp", "endingOffsetsByTimestamp"),
            max_rows=_positive(options, "maxoffsetspertrigger", "maxOffsetsPerTrigger"),
            min_rows=_positive(options, "minoffsetspertrigger", "minOffsetsPerTrigger"),
            max_delay_seconds=_duration(options.get("maxtriggerdelay", "15m"), "maxTriggerDelay"),
            min_partitions=_positive(options, "minpartitions", "minPartitions"),
            max_records=_positive(options, "maxrecordsperpartition", "maxRecordsPerPartition"),
            parallelism=_positive(options, PARALLELISM, PARALLELISM),
            fail_on_data_loss=_flag(options, "failondataloss", "failOnDataLoss", default=True),
            include_headers=_flag(options, "includeheaders", "includeHeaders", default=False),
        )

    def consumer(self) -> Consumer:
        # auto.offset.reset=error: an assigned offset that no longer exists must not silently
        # jump anywhere; data loss is decided by the driver (failOnDataLoss) before reading.
        return Consumer(
            {
                **READER_SETTINGS,
                **self.client,
                "group.id": "spanner-cdc-source",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
            }
        )

    def admin(self) -> AdminClient:
        """For listing offsets: the consumer's client settings, none of its reader settings."""
        return AdminClient(dict(self.client))

    @property
    def may_start_at_an_end(self) -> bool:
        """Can a new streaming query start some partition at its end — ``startingOffsets``
        latest (a streaming query's default) or -1 in its JSON, or a time with
        ``startingOffsetsByTimestampStrategy=latest`` — where it would start later if resolved
        again?"""
        if self.starting_times is not None:
            return self.starting_strategy == "latest"
        if self.starting in ("", "latest"):
            return True
        if self.starting == "earliest":
            return False
        try:
            given = json.loads(self.starting)
            return any(int(offset) == LATEST for parts in given.values() for offset in parts.values())
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
            return False  # not an offsets JSON: resolving it fails the query first

    def wanted(self, topic: str) -> bool:
        if self.assigned is not None:
            return topic in self.assigned
        if self.pattern is not None:
            return bool(self.pattern.fullmatch(topic))
        return topic in self.topics

    def wanted_partition(self, topic: str, partition: int) -> bool:
        return self.assigned is None or partition in self.assigned.get(topic, ())


def client_settings(options: dict[str, str]) -> dict[str, str]:
    """``kafka.*`` options → librdkafka settings (names translated where only they differ)."""
    client: dict[str, str] = {}
    for key, value in options.items():
        if not key.startswith("kafka."):
            continue
        name = key[len("kafka.") :]
        if name in JAVA_ONLY:
            raise KafkaSourceError(f"kafka.{name} is a Java client setting; here use {JAVA_ONLY[name]}")
        if name == "sasl.jaas.config":
            found = dict(_JAAS.findall(value))
            if set(found) != {"username", "password"}:
                raise KafkaSourceError(
                    'kafka.sasl.jaas.config: only username="…" password="…" logins translate'
                )
            client["sasl.username"], client["sasl.password"] = found["username"], found["password"]
            continue
        client[RENAMED.get(name, name)] = value
    return client


def _assigned(text: str) -> dict[str, tuple[int, ...]]:
    try:
        parsed: Any = json.loads(text)
        return {str(topic): tuple(int(p) for p in partitions) for topic, partitions in parsed.items()}
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        raise KafkaSourceError('assign must be JSON like {"topic": [0, 1]}') from None


def _times(options: dict[str, str], everywhere: str, by_partition: str) -> TimeSpec | None:
    """One time for every partition (``everywhere``, which wins, as in Spark) or the JSON of
    ``by_partition``; None when neither is set."""
    if everywhere.lower() in options:
        given = options[everywhere.lower()]
        if not given.isdigit():
            raise KafkaSourceError(f"{everywhere} must be milliseconds since the epoch, got {given!r}")
        return int(given)
    text = options.get(by_partition.lower())
    if text is None:
        return None
    try:
        parsed: Any = json.loads(text)
        times = {
            str(topic): {str(int(partition)): int(millis) for partition, millis in partitions.items()}
            for topic, partitions in parsed.items()
        }
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        raise KafkaSourceError(
            f'{by_partition} must be JSON like {{"topic": {{"0": 1700000000000}}}}'
        ) from None
    if any(millis < 0 for partitions in times.values() for millis in partitions.values()):
        raise KafkaSourceError(f"{by_partition}: times are milliseconds since the epoch, not negative")
    return times


def times_for(spec: TimeSpec, partitions: list[tuple[str, int]], name: str) -> dict[tuple[str, int], int]:
    """The time of each partition read; with the JSON form every one must be named, as Spark's
    source requires (a partition left out has no obvious start)."""
    if isinstance(spec, int):
        return dict.fromkeys(partitions, spec)
    missing = [
        f"{topic}[{partition}]"
        for topic, partition in partitions
        if str(partition) not in spec.get(topic, {})
    ]
    if missing:
        raise KafkaSourceError(
            f"{name} gives no time for {', '.join(missing[:5])}: name every partition read"
        )
    return {(topic, partition): spec[topic][str(partition)] for topic, partition in partitions}


def _positive(options: dict[str, str], key: str, name: str) -> int | None:
    value = options.get(key)
    if value is None:
        return None
    if not value.isdigit() or int(value) <= 0:
        raise KafkaSourceError(f"{name} must be a positive whole number, got {value!r}")
    return int(value)


def _duration(value: str, name: str) -> float:
    """Seconds in a duration as Spark writes them (``15m``, ``30s``, ``500ms``; a bare number
    is milliseconds, as in Spark's ``timeStringAsMs``)."""
    found = _DURATION.fullmatch(value.strip().lower())
    if found is None:
        raise KafkaSourceError(f"{name} must be a duration like 15m, 30s or 500ms, got {value!r}")
    return int(found[1]) * _DURATION_UNITS[found[2] or "ms"]


def _flag(options: dict[str, str], key: str, name: str, default: bool) -> bool:
    value = options.get(key, str(default)).lower()
    if value not in ("true", "false"):
        raise KafkaSourceError(f"{name} must be true or false, got {value!r}")
    return value == "true"


def resolve(spec: str, earliest: Offsets, ends: Offsets, name: str) -> Offsets:
    """``earliest``, ``latest`` or Spark's JSON form → offsets for every partition read.

    In JSON, -2 means earliest and -1 latest; a partition the JSON leaves out starts at the
    earliest offset (as Spark's source does for partitions it discovers)."""
    if spec == "earliest":
        return earliest
    if spec == "latest":
        return ends
    try:
        given = json.loads(spec)
        offsets: Offsets = {}
        for topic, partitions in earliest.items():
            for partition, low in partitions.items():
                wanted = int(given.get(topic, {}).get(partition, EARLIEST))
                resolved = (
                    low if wanted == EARLIEST else ends[topic][partition] if wanted == LATEST else wanted
                )
                offsets.setdefault(topic, {})[partition] = resolved
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        raise KafkaSourceError(
            f'{name} is not earliest, latest or JSON like {{"topic": {{"0": 23}}}}'
        ) from None
    return offsets
