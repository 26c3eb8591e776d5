"""The per-event work of a micro-batch, as Spark tasks: each reads its share of the batch's Kafka
rows through the one gate (consumer.message_reader) on an executor.

- :func:`outline` — every message as one narrow row: what it is (event, watermark, quarantined,
  tombstone) and, for an event, what deduplication and the metrics need (uuid, commit time,
  table, change type). Only this crosses to the driver; bytes only for the few watermarks,
  which the driver checks, for messages naming a schema the driver may learn — and for events
  when a replica is written (its merge still runs on the driver). The task stages the messages
  its gate refused, bytes and all, in the batch's quarantine staging directory; with a
  changelog, its events' changelog files in the changelog's (one file per table, commit date
  and task). The driver publishes both.
- :func:`drop_from_staged` — when deduplication dropped events: their rows removed from the
  staged files, by Kafka coordinates, each file by one task (nothing decoded again).

The outline takes the batch's :class:`DecodeContext`, fixed by the driver for the batch, so
every task (and a replay) decides exactly as the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext

from spanner_cdc.consumer.decoded import DecodedBatch, DecodedEvent, Quarantined
from spanner_cdc.consumer.message_reader import LEARNABLE, DecodeContext, MessageReader
from spanner_cdc.consumer.sinks.changelog import ChangelogSink
from spanner_cdc.consumer.sinks.contents import by_table
from spanner_cdc.consumer.sinks.quarantine import QuarantineSink

ArrowTask = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]

EVENT, WATERMARK, QUARANTINED, TOMBSTONE = "event", "watermark", "quarantined", "tombstone"
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
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)


def outline(
    context: DecodeContext, batch_id: int, staging: Path | None, quarantine: Path | None, with_bytes: bool
) -> ArrowTask:
    """The ``mapInArrow`` function that outlines its share of the batch (see the module
    docstring). With ``quarantine`` it stages what its gate refused, bytes and all, there
    (``QuarantineSink.stage``; none with ``--on-bad-message fail``, which stops the query
    instead); with ``staging``, it also writes the changelog of every event it
    read there, so a batch is decoded once (consumer.batch). With ``with_bytes``, events keep
    their key and value (the replica is merged on the driver)."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        reader = MessageReader(context)
        events: list[DecodedEvent] = []
        refused: list[Quarantined] = []
        named: set[tuple[str, str]] = set()
        for rows in batches:
            decoded = reader.read(rows)
            refused.extend(decoded.quarantined)
            if staging is not None:
                events.extend(decoded.events)
            yield pa.RecordBatch.from_pylist(outlined(decoded, with_bytes, named), schema=OUTLINE_SCHEMA)
        part = task_partition()
        if quarantine is not None:
            QuarantineSink.stage(quarantine, batch_id, part, refused)
        if staging is not None:
            write_events(ChangelogSink(staging), batch_id, events, part)

    return task


def outlined(decoded: DecodedBatch, with_bytes: bool, named: set[tuple[str, str]]) -> list[dict[str, object]]:
    """One row per message of ``decoded``; the columns a kind does not use stay null.

    A quarantined message's bytes stay with the task (it stages them), except for the first
    message of the task naming each schema, registry id or table version the driver does not
    know (``LEARNABLE``; ``named`` holds the reasons and details already sent): the driver learns
    as much from one as from a thousand, and a flood of them costs it one message's bytes each
    name, not each message."""
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
                **({"key": q.key, "value": q.value} if _first_naming(q, named) else {}),
            }
            for q in decoded.quarantined
        ),
        *({"kind": TOMBSTONE} for _ in range(decoded.tombstones)),
    ]


def _first_naming(message: Quarantined, named: set[tuple[str, str]]) -> bool:
    """Whether ``message`` is the first of the task to name something the driver may learn."""
    name = (message.reason, message.detail)
    if message.reason not in LEARNABLE or name in named:
        return False
    named.add(name)
    return True


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
