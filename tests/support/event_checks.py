"""What a run of the producer must leave on Kafka: the committed changes exactly, each key's in
commit order, and watermark records that never claim a change they precede."""

from __future__ import annotations

import collections
from typing import Any

from spanner_cdc.schemas.timestamps import timestamp_micros
from spanner_cdc.schemas.watermark import Watermark
from tests.support.churn import change_of
from tests.support.kafka_read import Received, read_topic
from tests.support.workload import Committed


def assert_exactly_the_committed_changes(events: list[Received], committed: list[Committed]) -> None:
    expected = collections.Counter((c.key, c.balance, c.commit_micros) for c in committed)
    seen = collections.Counter(change_of(e) for e in events)
    missing = expected - seen
    assert not missing, f"{sum(missing.values())} committed changes missing, e.g. {list(missing)[:3]}"
    unexpected = set(seen) - set(expected)
    assert not unexpected, f"unexpected events: {list(unexpected)[:3]}"


def assert_per_key_commit_order(events: list[Received], replays: bool = False) -> None:
    """Each key's events sit in one Kafka partition, in commit order.

    With ``replays`` (after restarts), a re-sent change may follow later ones: the order is
    checked on each change's first occurrence, which is what a reader deduping by uuid sees.
    """
    by_key: dict[str, list[Received]] = collections.defaultdict(list)
    for event in events:
        by_key[event.value["payload"]["Id"]].append(event)
    for key, key_events in by_key.items():
        assert len({e.partition for e in key_events}) == 1, f"{key} spread over Kafka partitions"
        ordered = sorted(key_events, key=lambda e: e.offset)
        if replays:
            first: dict[str, Received] = {}
            ordered = [first.setdefault(e.value["uuid"], e) for e in ordered if e.value["uuid"] not in first]
        sort_keys = [tuple(e.value["sort_keys"]) for e in ordered]
        assert sort_keys == sorted(sort_keys), f"{key}: changes out of commit order in Kafka"


def assert_watermarks_cover_what_precedes_them(
    kafka: str, prefix: str, partitions: int, last_commit: int
) -> None:
    """Every partition carries watermarks, the newest at or past the last commit; an event
    after a watermark W on its partition is either newer than W or a re-sent copy of an event
    before it (same uuid) — never a change the watermark claimed was already there."""
    events, watermarks = read_topic(kafka, prefix, "Accounts")
    messages = sorted(
        [(e.partition, e.offset, e) for e in events] + [(p, o, w) for p, o, w in watermarks],
        key=lambda m: (m[0], m[1]),
    )
    newest: dict[int, int] = {}
    seen: dict[int, set[str]] = collections.defaultdict(set)
    for partition, offset, message in messages:
        if isinstance(message, Watermark):
            newest[partition] = max(newest.get(partition, -1), message.watermark_micros)
            continue
        commit = timestamp_micros(message.value["source_metadata"]["commit_timestamp"])
        uuid_ = message.value["uuid"]
        assert commit > newest.get(partition, -1) or uuid_ in seen[partition], (
            f"partition {partition} offset {offset}: a change at {commit} after watermark {newest[partition]}"
        )
        seen[partition].add(uuid_)
    assert set(newest) == set(range(partitions)), "a partition without watermark records"
    assert min(newest.values()) >= last_commit


def assert_no_change_twice(events: list[Received]) -> None:
    """Exactly once onto Kafka: a ``read_committed`` reader sees every change once, also after
    SIGKILLs and handovers (each transaction commits the checkpoint of its own events)."""
    counts = collections.Counter(event.value["uuid"] for event in events)
    twice = [uuid for uuid, count in counts.items() if count > 1]
    assert not twice, f"{len(twice)} changes on Kafka more than once, e.g. {twice[:3]}"


def assert_a_change_sent_again_keeps_its_uuid(events: list[Received]) -> None:
    """After restarts or handovers a change may be on Kafka twice: always with one uuid, which
    is what the consumer drops the copy by."""
    uuids_by_change: dict[tuple[Any, ...], set[str]] = collections.defaultdict(set)
    for event in events:
        payload = event.value["payload"]
        uuids_by_change[(payload["Id"], payload["Balance"])].add(event.value["uuid"])
    assert all(len(uuids) == 1 for uuids in uuids_by_change.values()), "a re-sent change got a new uuid"
