"""Held events' stage rows, kept from the batch whose tasks built them.

The consistent cut (sinks.replica.cut) holds the events committed after it in ``cdc$pending``
as their Kafka messages: that copy is the durable one, written in the replica's transaction.
When a later batch's cut passes them they need stage rows, and building those from the bytes
means decoding the events a second time (on the driver for a few, by a Spark job for more). The
tasks of the batch that delivered them built those rows once already, in the batch's staging
directory, which goes when the batch is written. This keeps the held events' rows — only
theirs — as Arrow files per batch beside it (memory-mapped when read, like the staging), so a
release takes them by Kafka coordinates and commit time and stages from the bytes only what is not kept.

It is a cache, and nothing depends on it for correctness: rows are staged from a message's
bytes and its writer schema alone, so a kept row is the row staging again would build. Rows are
dropped as they are taken, before the transaction that applies them commits; if it rolls back,
or after a restart (which clears the staging root, this with it), what is missing is staged
from ``cdc$pending`` as before. A batch's files go with its last held event taken, so a
release reads only the batches that still have some, and the files never outlive
``cdc$pending``'s rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from spanner_cdc.consumer.decode.kafka_rows import DECODE_SCHEMA
from spanner_cdc.consumer.decode.outline_rows import COORDINATES, row_numbers
from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.sinks.replica.stage.rows import (
    ReplicaStaging,
    StagedEvents,
    StagedPart,
    parts_of_events,
)


class HeldStageRows:
    """Per batch, the stage rows and outline rows of the events the cut held."""

    def __init__(self, root: Location) -> None:
        self.root = root

    def keep(self, batch_id: int, held: pa.Table, parts: Sequence[StagedPart]) -> None:
        """Keep the rows of ``held`` (outline rows of events the cut held) from ``parts`` (the
        batch's staged parts, which hold every event the batch read)."""
        if not held.num_rows:
            return
        staging = ReplicaStaging(self.root / f"batch-{batch_id:012d}")
        staging.clear()
        own = parts_of_events(parts, held)
        staging.write(0, [part.unloaded() for part in own if part.rows.num_rows], None)
        staging.write_outline(held)

    def staging_with(self, stage: Callable[[pa.Table], StagedEvents]) -> Callable[[pa.Table], StagedEvents]:
        """A stager of held events (their messages, ``stage.rows.MESSAGES_SCHEMA``) that takes the
        kept rows (no longer kept) and hands the rest to ``stage`` (as Kafka rows,
        ``kafka_rows.DECODE_SCHEMA``).

        A kept row is a held message's when their Kafka coordinates and commit time agree: the
        coordinates alone may be two messages' (a topic deleted and created again while an event
        of the old one is held). Messages that even those do not tell apart are staged from their
        bytes, and their kept rows dropped."""

        def staged(held: pa.Table) -> StagedEvents:
            missing, ambiguous = _told_apart(held)
            outlines: list[pa.Table] = []
            parts: list[StagedPart] = []
            for staging in self._batches():
                if not missing.num_rows and not ambiguous.num_rows:
                    break
                outline = staging.outline()
                found = outline.take(_matching(outline, missing, named=True))
                if found.num_rows:
                    outlines.append(found)
                    parts.extend(parts_of_events(staging.read(), found))
                    missing = missing.take(_matching(missing, found, named=False))
                still_held = outline.take(_matching(outline, found, named=False))
                still_held = still_held.take(_matching(still_held, ambiguous, named=False))
                if still_held.num_rows == outline.num_rows:
                    continue
                if still_held.num_rows:
                    staging.write_outline(still_held)
                else:
                    staging.clear()
            rest = pa.concat_tables([missing, ambiguous])
            if rest.num_rows:
                again = stage(rest.select(DECODE_SCHEMA.names))
                outlines.append(again.outline)
                parts.extend(again.parts)
            return StagedEvents(pa.concat_tables(outlines), parts)

        return staged

    def _batches(self) -> list[ReplicaStaging]:
        return [ReplicaStaging(d) for d in self.root.directories("batch-*")]


#: What tells a held message's kept rows apart (outline rows and messages name them alike).
_HELD_KEY = [*COORDINATES, "commit_micros"]


def _matching(rows: pa.Table, others: pa.Table, *, named: bool) -> pa.Array:
    """The numbers of ``rows`` whose :data:`_HELD_KEY` is (``named``) or is not among ``others``'."""
    return row_numbers(rows, _HELD_KEY, others, named=named, on=_HELD_KEY)


def _told_apart(held: pa.Table) -> tuple[pa.Table, pa.Table]:
    """``held`` split in the messages no other of them shares :data:`_HELD_KEY` with, and the rest."""
    counts = held.group_by(_HELD_KEY).aggregate([("offset", "count")])
    shared = counts.filter(pc.greater(counts.column("offset_count"), 1))
    return held.take(_matching(held, shared, named=False)), held.take(_matching(held, shared, named=True))
