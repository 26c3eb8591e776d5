"""The per-event work of a micro-batch, as Spark tasks: each reads its share of the batch's Kafka
rows through the one gate (consumer.message_reader) on an executor.

- :func:`outline` — every message as one narrow row: what it is (event, watermark, quarantined,
  tombstone) and, for an event, what deduplication and the metrics need (uuid, commit time,
  table, change type); for a message naming a schema, registry id or table version the batch's
  context lacks, that name (``decoded.Unknown``). Only this crosses to the driver; bytes only
  for the few watermarks, which the driver checks — and for events when a replica is written
  (its merge still runs on the driver). The task stages the messages
  its gate refused, bytes and all, in the batch's quarantine staging directory; with a
  changelog, its events' changelog files in the changelog's (one file per table, commit date
  and task). The driver publishes both.
- :func:`drop_from_staged` — when deduplication dropped events: their rows removed from the
  staged files, by Kafka coordinates, each file by one task (nothing decoded again).

The outline takes the batch's :class:`DecodeContext`, fixed by the driver for the batch, so
every task (and a replay) decides exactly as the others. Its lookups (the writer schemas' texts
and JSON table versions: tens of MB for thousands of tables) reach the executors as a Spark
broadcast, sent to each executor once while they stay the same, not with every task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
from pyspark import TaskContext

from spanner_cdc.consumer.decoded import DecodedBatch, DecodedEvent, Quarantined, Unknown
from spanner_cdc.consumer.message_reader import DecodeContext, MessageReader
from spanner_cdc.consumer.sinks.changelog import ChangelogSink
from spanner_cdc.consumer.sinks.contents import by_table
from spanner_cdc.consumer.sinks.quarantine import QuarantineSink

ArrowTask = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


class Shared(Protocol):
    """A value the tasks read where it was sent to their executor (a pyspark ``Broadcast``)."""

    @property
    def value(self) -> DecodeContext: ...


EVENT, WATERMARK, QUARANTINED, TOMBSTONE = "event", "watermark", "quarantined", "tombstone"
#: What a quarantined message names that the driver may learn (decoded.Unknown; the fingerprint
#: in hex: Spark has no unsigned 64-bit type).
UNKNOWN_FIELDS = [
    pa.field("unknown_fingerprint", pa.string()),
    pa.field("unknown_schema_id", pa.int64()),
    pa.field("unknown_table", pa.string()),
    pa.field("unknown_schema_key", pa.string()),
]
UNKNOWN_COLUMNS = [f.name for f in UNKNOWN_FIELDS]
OUTLINE_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("kind", pa.string()),
        ("uuid", pa.string()),
        ("commit_micros", pa.int64()),
        ("object", pa.string()),
        ("change_type", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        *UNKNOWN_FIELDS,
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)


def outline(
    lookups: Shared,
    now_micros: int,
    batch_id: int,
    *,
    staging: Path | None,
    quarantine: Path | None,
    with_bytes: bool,
) -> ArrowTask:
    """The ``mapInArrow`` function that outlines its share of the batch (see the module
    docstring), read with the context ``lookups`` holds at the batch's ``now_micros``. With
    ``quarantine`` it stages what its gate refused, bytes and all, there
    (``QuarantineSink.stage``; none with ``--on-bad-message fail``, which stops the query
    instead); with ``staging``, it also writes the changelog of every event it read there, so
    a batch is decoded once (consumer.batch). With ``with_bytes``, events keep their key and
    value (the replica is merged on the driver)."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        reader = MessageReader(replace(lookups.value, now_micros=now_micros))
        events: list[DecodedEvent] = []
        refused: list[Quarantined] = []
        for rows in batches:
            decoded = reader.read(rows)
            refused.extend(decoded.quarantined)
            if staging is not None:
                events.extend(decoded.events)
            yield pa.RecordBatch.from_pylist(outlined(decoded, with_bytes), schema=OUTLINE_SCHEMA)
        part = task_partition()
        if quarantine is not None:
            QuarantineSink.stage(quarantine, batch_id, part, refused)
        if staging is not None:
            write_events(ChangelogSink(staging), batch_id, events, part)

    return task


def outlined(decoded: DecodedBatch, with_bytes: bool) -> list[dict[str, object]]:
    """One row per message of ``decoded``; the columns a kind does not use stay null.

    A quarantined message's bytes stay with the task (it stages them); what the driver may
    learn from it travels as its name, so a flood of messages naming new schemas costs the
    driver a few bytes each, not each message's size."""
    return [
        *(
            {
                "topic": e.topic,
                "partition": e.partition,
                "offset": e.offset,
                "kind": EVENT,
                "uuid": e.record["uuid"],
                "commit_micros": e.commit_micros,
                "object": e.record["object"],
                "change_type": e.record["source_metadata"]["change_type"],
                **({"key": e.key, "value": e.value} if with_bytes else {}),
            }
            for e in decoded.events
        ),
        *(
            {
                "topic": w.topic,
                "partition": w.partition,
                "offset": w.offset,
                "kind": WATERMARK,
                "value": w.value,
            }
            for w in decoded.watermarks
        ),
        *(
            {
                "topic": q.topic,
                "partition": q.partition,
                "offset": q.offset,
                "kind": QUARANTINED,
                "reason": q.reason,
                "detail": q.detail,
                **unknown_columns(q.unknown),
            }
            for q in decoded.quarantined
        ),
        *({"kind": TOMBSTONE} for _ in range(decoded.tombstones)),
    ]


def unknown_columns(unknown: Unknown | None) -> dict[str, object]:
    """The outline's ``unknown_*`` columns of a name."""
    if unknown is None:
        return {}
    table, schema_key = unknown.table_version or (None, None)
    return {
        "unknown_fingerprint": None if unknown.fingerprint is None else f"{unknown.fingerprint:016x}",
        "unknown_schema_id": unknown.schema_id,
        "unknown_table": table,
        "unknown_schema_key": schema_key,
    }


def unknown_from_columns(row: dict[str, Any]) -> Unknown:
    """The name an outline row's ``unknown_*`` columns hold (:func:`unknown_columns`)."""
    fingerprint, table = row["unknown_fingerprint"], row["unknown_table"]
    return Unknown(
        None if fingerprint is None else int(fingerprint, 16),
        row["unknown_schema_id"],
        None if table is None else (table, row["unknown_schema_key"]),
    )


def drop_from_staged(duplicates: pa.Table) -> ArrowTask:
    """The ``mapInArrow`` function that removes ``duplicates`` (``topic``, ``partition``,
    ``offset``) from the staged changelog files named in its rows (column ``file``). It yields no
    rows: its work is the files. (``mapInArrow`` rather than ``foreachPartition``: measured on a
    2-core machine, the first ``foreachPartition`` of a session took 3.2 s where the first such
    ``mapInArrow`` took 0.4 s; why was not investigated.)"""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for files in batches:
            for file in files.column("file").to_pylist():
                ChangelogSink.drop_messages(Path(file), duplicates)
        yield from ()

    return task


def write_events(sink: ChangelogSink, batch_id: int, events: list[DecodedEvent], part: int) -> dict[str, int]:
    """Task ``part``'s events of the batch into ``sink``, a file per table and commit date named
    by the task's partition; rows written per table."""
    return {changes.table: sink.write_table(batch_id, changes, part) for changes in by_table(events)}


def task_partition() -> int:
    """The running Spark task's partition: what its files are named by."""
    return TaskContext.get().partitionId()  # type: ignore[union-attr]  # set in every task
