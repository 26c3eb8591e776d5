"""The per-event work of a micro-batch, as Spark tasks: each reads its share of the batch's Kafka
rows through the one gate (consumer.decode.gate) on an executor.

- :func:`outline` — every message as one narrow row (consumer.decode.outline_rows); only this reaches
  the driver, staged by the task as an Arrow file (:func:`staged_outline` reads them): through
  Spark, each outline row would be made a Spark row and then Arrow again, which cost the JVM
  more than the rows' hand-over to the task (docs/consumer.md, Performance). The task also
  stages the messages its gate refused, bytes and all, in the batch's
  quarantine staging directory; with a changelog, its events' changelog files in the
  changelog's (one file per table, commit date and task); with a replica, its events' stage
  rows in the replica's (sinks.replica.stage.rows), and into a PostgreSQL replica itself
  (sinks.replica.stage.loaded). The driver publishes or merges them.
- :func:`drop_from_staged` — when deduplication dropped events: their rows removed from the
  staged changelog files, by Kafka coordinates, each file by one task (nothing decoded again).

The outline takes the batch's :class:`DecodeContext`, fixed by the driver for the batch, so
every task (and a replay) decides exactly as the others. Its lookups (the writer schemas' texts
and JSON table versions: tens of MB for thousands of tables) reach the executors as a Spark
broadcast, sent to each executor once while they stay the same, not with every task.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
from pyspark import TaskContext

from spanner_cdc.consumer.decode.decoded import DecodedEvent, Quarantined
from spanner_cdc.consumer.decode.gate import DecodeContext, MessageReader
from spanner_cdc.consumer.decode.outline_rows import OUTLINE_SCHEMA, outline_batch
from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.sinks.changelog import ChangelogSink
from spanner_cdc.consumer.sinks.contents import by_table
from spanner_cdc.consumer.sinks.quarantine import QuarantineSink
from spanner_cdc.consumer.sinks.replica.stage.rows import ReplicaStaging, event_messages, parts_of_tables
from spanner_cdc.consumer.spark.worker_collector import collector_paused

if TYPE_CHECKING:  # imported where a task unpickles one: psycopg only in a PostgreSQL replica's workers
    from spanner_cdc.consumer.sinks.replica.stage.loaded import StagedTables

ArrowTask = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


class Shared(Protocol):
    """A value the tasks read where it was sent to their executor (a pyspark ``Broadcast``)."""

    @property
    def value(self) -> DecodeContext: ...


#: What an outlining task hands Spark: the name of the file it staged its outline rows in.
STAGED_OUTLINE_SCHEMA = pa.schema([("file", pa.string())])


def outline(
    lookups: Shared,
    now_micros: int,
    batch_id: int,
    *,
    outlines: Location,
    staging: Location | None,
    quarantine: Location | None,
    replica: Location | None,
    replica_messages: bool,
    replica_tables: StagedTables | None,
) -> ArrowTask:
    """The ``mapInArrow`` function that outlines its share of the batch (see the module
    docstring), read with the context ``lookups`` holds at the batch's ``now_micros``, into a
    file in ``outlines`` (one row of :data:`STAGED_OUTLINE_SCHEMA` names it). With
    ``quarantine`` it stages what its gate refused, bytes and all, there
    (``QuarantineSink.stage``; none with ``--on-bad-message fail``, which stops the query
    instead); with ``staging``, it also writes the changelog of every event it read there, and
    with ``replica`` their replica stage rows there, and with ``replica_messages`` their Kafka
    messages (what the consistent cut holds; held events read again need not stage theirs), so a
    batch is decoded once (consumer.batch). With ``replica_tables`` it also loads the stage rows
    into the PostgreSQL replica (sinks.replica.stage.loaded)."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Before the pause: loading a broadcast's value turns the collector on (collector_paused).
        context = replace(lookups.value, now_micros=now_micros)
        with collector_paused():
            # The share's events are freed as ``share`` returns, before the collector is back on
            # (it would otherwise walk them all once, tens of ms a task).
            yield from share(MessageReader(context), batches)

    def share(reader: MessageReader, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        events: list[DecodedEvent] = []
        refused: list[Quarantined] = []
        outlined: list[pa.RecordBatch] = []
        for rows in batches:
            decoded = reader.read(rows)
            refused.extend(decoded.quarantined)
            if staging is not None or replica is not None:
                events.extend(decoded.events)
            outlined.append(outline_batch(decoded))
        part = task_partition()
        yield stage_outline(outlines / f"part-{part:05d}.arrow", outlined)
        if quarantine is not None:
            QuarantineSink.stage(quarantine, batch_id, part, refused)
        tables = by_table(events)
        if staging is not None:
            changelog, runs = ChangelogSink(staging), Counter[str]()
            for changes in tables:
                changelog.write_table(batch_id, changes, part, runs[changes.table])
                runs[changes.table] += 1
        if replica is not None:
            messages = event_messages(events) if replica_messages else None
            parts = parts_of_tables(tables)
            if replica_tables is not None:
                parts = replica_tables.load(part, parts)
            ReplicaStaging(replica).write(part, parts, messages)

    return task


def drop_from_staged(staged: Location, duplicates: pa.Table) -> ArrowTask:
    """The ``mapInArrow`` function that removes ``duplicates`` (``topic``, ``partition``,
    ``offset``) from the staged changelog files named in its rows (column ``file``, relative to
    ``staged``). It yields no rows: its work is the files. (``mapInArrow`` rather than
    ``foreachPartition``: the first ``foreachPartition`` of a session took seconds where the
    first such ``mapInArrow`` took a fraction of one; why was not investigated.)"""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for files in batches:
            for file in files.column("file").to_pylist():
                ChangelogSink.drop_messages(staged / file, duplicates)
        yield from ()

    return task


def stage_outline(file: Location, outlined: list[pa.RecordBatch]) -> pa.RecordBatch:
    """A task's outline rows written to ``file`` (whole or not at all: a task attempt again
    writes the same rows), and the row that names it."""
    file.write_arrow(pa.Table.from_batches(outlined, OUTLINE_SCHEMA))
    return pa.RecordBatch.from_pylist([{"file": file.name}], STAGED_OUTLINE_SCHEMA)


def staged_outline(outlines: Location, staged: pa.Table) -> pa.Table:
    """The outline rows of the files in ``outlines`` that ``staged`` (rows of
    :data:`STAGED_OUTLINE_SCHEMA`) names: only those, never a file an earlier job left."""
    tables = [(outlines / file).read_arrow() for file in staged.column("file").to_pylist()]
    return pa.concat_tables(tables) if tables else OUTLINE_SCHEMA.empty_table()


def task_partition() -> int:
    """The running Spark task's partition: what its files are named by."""
    return TaskContext.get().partitionId()  # type: ignore[union-attr]  # set in every task
