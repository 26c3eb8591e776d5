"""Where the Kafka source's next micro-batch begins, and the data loss found on the way.

A batch begins where the last one ended (Spark keeps that in the query's checkpoint). Between
two triggers the broker can move under it in four ways, each one records the query will never
read — the four Spark's own Kafka source reports (``reportDataLoss``):

- retention or compaction removed offsets not read yet: the start is under the partition's
  earliest offset;
- the topic was deleted and created again (or its log lost): the start is past the partition's
  end — its offsets went back;
- a partition read before is gone (its topic deleted, not created again);
- a partition seen for the first time does not start at 0: records were removed before the
  query saw them.

With ``failOnDataLoss`` true (the default) the query fails naming them. With false it goes on:
a partition from its earliest offset now, a gone partition forgotten. Where offsets went back,
Spark's source goes on from the partition's new end and so skips what the new topic already
holds; this source reads the new topic from its start, because none of it was read.

A topic deleted and created again that has grown past the old position before a trigger looks
like a topic that only grew: offsets alone cannot tell them apart (Spark's source cannot
either).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spanner_cdc.consumer.kafka_source_options import Offsets


@dataclass
class Resumed:
    """The next batch's start of every partition that exists now, and what was lost."""

    begin: Offsets = field(default_factory=dict)
    #: One line per partition that lost records, e.g. ``"t[0]: offsets 5..9 are gone"``.
    lost: list[str] = field(default_factory=list)


def resume(start: Offsets, earliest: Offsets, ends: Offsets) -> Resumed:
    """``start``: where the last batch ended (or the query's starting offsets); ``ends``: every
    wanted partition's end now (or the batch's end), ``earliest`` its earliest offset now (0
    where unknown)."""
    resumed = Resumed()
    for topic, partitions in sorted(ends.items()):
        for partition, end in sorted(partitions.items(), key=lambda item: int(item[0])):
            low = earliest.get(topic, {}).get(partition, 0)
            known = start.get(topic, {}).get(partition)
            lost = _lost(f"{topic}[{partition}]", known, low, end)
            if lost:
                resumed.lost.append(lost)
            resumed.begin.setdefault(topic, {})[partition] = low if lost or known is None else known
    for topic, partitions in sorted(start.items()):
        for partition in sorted(partitions, key=int):
            if partition not in ends.get(topic, {}):
                resumed.lost.append(f"{topic}[{partition}]: the partition is gone (its topic deleted?)")
    return resumed


def _lost(name: str, known: int | None, low: int, end: int) -> str | None:
    """What a partition lost between ``known`` (None: seen for the first time) and now."""
    if known is None:
        return (
            f"{name}: a new partition starts at {low}, not 0 (offsets 0..{low - 1} are gone)" if low else None
        )
    if known < low:
        return f"{name}: offsets {known}..{low - 1} are gone (retention or compaction)"
    if known > end:
        return f"{name}: offsets went back from {known} to {end} (the topic deleted and created again?)"
    return None
