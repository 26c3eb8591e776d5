"""Several producer processes sharing one change stream (``--group``) against the churning
emulator and the embedded broker: every change once and in per-key order with three of them, and
nothing lost when one is killed and another joins later (producer/shards/group.py, docs/scale-out.md)."""

from __future__ import annotations

import collections
import itertools
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from spanner_cdc.producer.lineage.partitions import PartitionState, shard_of
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from testkit.producer_group import ProducerProcess
from testkit.producer_run import checkpointed_partitions
from testkit.spanner_db import create_database
from tests.support.churn import (
    ACCOUNTS_DDL,
    RERUN_ON_EMULATOR_SKIP,
    SourceLog,
    bank_source_log,
    now_micros,
    produce_command,
)
from tests.support.event_checks import (
    assert_a_change_sent_again_keeps_its_uuid,
    assert_exactly_the_committed_changes,
    assert_no_change_twice,
    assert_per_key_commit_order,
    assert_watermarks_cover_what_precedes_them,
)
from tests.support.kafka_read import Received, read_all, read_events
from tests.support.stopping import stop_with_sigterm
from tests.support.waiting import wait_for
from tests.support.workload import AccountWriter

pytestmark = pytest.mark.integration

SHARDS = 6
#: The group's session timeout in these tests: the shortest the broker allows.
SESSION_SECONDS = 6


@dataclass
class Group:
    """Producer processes of one group on a new database's Bank stream, its writer, and what
    the emulator returned to them (their debug logs)."""

    kafka: str
    prefix: str
    command: list[str]
    directory: Path
    writer: AccountWriter
    source_log: SourceLog
    members: list[ProducerProcess] = field(default_factory=list)
    #: When the test began stopping its processes.
    stopping_at: float = float("inf")

    def start(self, name: str) -> ProducerProcess:
        member = ProducerProcess.start(name, self.command, self.directory / f"{name}.log")
        self.members.append(member)
        return member

    def start_settled(self, *names: str) -> list[ProducerProcess]:
        """Start a process for each name, and wait until they shared the shards."""
        started = [self.start(name) for name in names]
        wait_for(
            self.settled, 120, f"the group to share its {SHARDS} shards among {len(self.live())} processes"
        )
        return started

    def live(self) -> list[ProducerProcess]:
        return [m for m in self.members if m.killed_at is None]

    def settled(self) -> bool:
        """Every shard owned by a live member, each member owning some."""
        owned = [m.shards() for m in self.live()]
        return sum(owned) == SHARDS and all(owned)

    def write_and_wait(self, seconds: float, during: list[tuple[float, Any]]) -> list[Received]:
        """Write for ``seconds`` (running each ``(after, action)`` of ``during`` meanwhile), then
        wait until every change committed so far is on Kafka; the events."""
        writing = threading.Thread(target=self.writer.run, args=(seconds,))
        writing.start()
        started = time.monotonic()
        try:
            for after, action in during:
                time.sleep(max(0.0, started + after - time.monotonic()))
                action()
        finally:
            writing.join()
        expected = {(c.key, c.balance) for c in self.writer.committed}

        def published() -> bool:
            events = read_events(self.kafka, self.prefix, "Accounts")
            return expected <= {(e.value["payload"]["Id"], e.value["payload"]["Balance"]) for e in events}

        with self.diagnosing():  # a change the emulator skipped never arrives: say so, and re-run
            wait_for(published, 120, "every committed change on Kafka")
        return read_events(self.kafka, self.prefix, "Accounts")

    @contextmanager
    def diagnosing(self) -> Iterator[None]:
        """Assertions about what reached Kafka, blamed on the emulator when its debug logs say so
        (SourceLog.diagnosing), from the processes' logs as they are when one fails."""
        with self.source_log.diagnosing():
            try:
                yield
            except AssertionError:
                self.source_log.add("".join(m.log.read_text() for m in self.members))
                raise


@contextmanager
def group_of(stack: EmbeddedStack, spanner: str, directory: Path) -> Iterator[Group]:
    """A group on a new database (its processes started by the test), each live process stopped
    with SIGTERM at the end, and required to stop cleanly."""
    kafka = stack.endpoint("kafka")
    database = create_database(spanner, ACCOUNTS_DDL)
    prefix = f"group-{uuid.uuid4().hex[:8]}"
    source_log = bank_source_log(spanner, kafka, database, prefix, now_micros())
    command = produce_command(
        spanner, kafka, database, "Bank", prefix,
        "--start-timestamp", "now", "--log-level", "debug", "--group", "bank",
        "--group-shards", str(SHARDS), "--group-session-timeout", str(SESSION_SECONDS),
    )  # fmt: skip
    group = Group(kafka, prefix, command, directory, AccountWriter(database), source_log)
    try:
        yield group
    except BaseException:
        _stop_members(group)  # the test's own failure is the one to show
        raise
    failures = _stop_members(group)
    if failures:
        raise failures[0]
    for member in group.live():
        text = member.log.read_text()
        assert member.process.returncode == 0, (
            f"{member.name} exited {member.process.returncode}: {text[-3000:]}"
        )
        assert "Traceback" not in text, text[-3000:]


def _stop_members(group: Group) -> list[AssertionError]:
    """Stop every process the test left running, also when it failed: each live one with SIGTERM,
    one by one (the others take each leaver's shards and resume its tokens — queries of the stop,
    not of the run, which the checks leave out); one the test killed or froze (SIGSTOP) and did
    not wait for, with SIGKILL. The live ones that did not stop in time."""
    group.stopping_at = time.time()
    failures = []
    for member in group.members:
        if member.process.poll() is not None:
            continue
        if member.killed_at is not None:
            member.process.kill()  # delivered to a stopped process too
            member.process.wait(30)
            continue
        try:
            stop_with_sigterm(member.process, 90, member.log)
        except AssertionError as exc:
            failures.append(exc)
    return failures


def kill_one_reading(group: Group) -> ProducerProcess:
    """SIGKILL a live process while one of its queries runs (with a few partitions live, a
    process often has none for a while): the one whose tokens must be taken over."""
    wait_for(lambda: any(m.reading() for m in group.live()), 30, "a process reading")
    victim = next(m for m in group.live() if m.reading())
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.wait()
    victim.killed_at = time.time()
    return victim


def assert_no_token_read_twice_at_once(group: Group) -> dict[str, list[str]]:
    """No token's queries in two processes overlap in time; returns token → the process of each
    query of it, in the order they started."""
    spans: dict[str, list[tuple[float, float, str]]] = collections.defaultdict(list)
    for member in group.members:
        for token, started, stopped in member.queries():
            if started < group.stopping_at:
                spans[token].append((started, stopped, member.name))
    for token, token_spans in spans.items():
        ordered = sorted(token_spans)
        for (_, stopped, first), (started, _, second) in itertools.pairwise(ordered):
            assert first == second or started >= stopped, (
                f"token {token[:16]} read by {first} until {stopped:.3f} and by {second} from {started:.3f}"
            )
    return {token: [name for _, _, name in sorted(token_spans)] for token, token_spans in spans.items()}


def merges_recorded(kafka: str, prefix: str) -> int:
    """Partitions with more than one parent, as the checkpoint records say."""
    records = read_all(kafka, Topics(prefix).checkpoints)
    return sum(1 for _, _, _, value in records if value and len(json.loads(value)["parents"]) > 1)


@RERUN_ON_EMULATOR_SKIP
def test_three_processes_under_churn_publish_every_change_once_in_order(
    churn_spanner: str, stack: EmbeddedStack, tmp_path: Path
) -> None:
    with group_of(stack, churn_spanner, tmp_path) as group:
        group.start_settled("a", "b", "c")
        events = group.write_and_wait(15, [])
    committed = group.writer.committed
    with group.diagnosing():
        assert len(committed) > 100
        assert_exactly_the_committed_changes(events, committed)
        assert len({e.value["uuid"] for e in events}) == len(events), "a change was published twice"
        assert_per_key_commit_order(events)
    readers = assert_no_token_read_twice_at_once(group)
    twice = {token[:16]: names for token, names in readers.items() if len(names) > 1}
    assert not twice, f"tokens queried more than once: {twice}"
    assert all(m.queries() for m in group.members), "a process read no partition"
    assert merges_recorded(group.kafka, group.prefix), "no merge was observed"
    last_commit = max(c.commit_micros for c in committed)
    assert_watermarks_cover_what_precedes_them(group.kafka, group.prefix, 6, last_commit)


@RERUN_ON_EMULATOR_SKIP
def test_a_process_killed_mid_churn_and_one_joining_later_lose_nothing(
    churn_spanner: str, stack: EmbeddedStack, tmp_path: Path
) -> None:
    with group_of(stack, churn_spanner, tmp_path) as group:
        group.start_settled("a", "b", "c")
        events = group.write_and_wait(
            30, [(6, lambda: kill_one_reading(group)), (15, lambda: group.start("d"))]
        )
        wait_for(group.settled, 120, "the group to share the shards again")
    victim = next(m for m in group.members if m.killed_at is not None)
    with group.diagnosing():
        assert_exactly_the_committed_changes(events, group.writer.committed)
    assert_no_change_twice(events)
    assert_a_change_sent_again_keeps_its_uuid(events)
    assert_per_key_commit_order(events, replays=True)
    readers = assert_no_token_read_twice_at_once(group)
    assert any(victim.name in names and len(set(names)) > 1 for names in readers.values()), (
        "no token of the killed process was taken over"
    )
    joined = group.members[-1]
    running = tokens_running_at_the_end(group, taken_by(joined, before=group.stopping_at))
    # Partitions end and their children land in any shard: when every partition of the shards the
    # joiner took had ended before it took them, it has nothing to read (seen once, in a clean-clone
    # run on 2026-11-28). A partition of its shards still RUNNING at the end was handed to it
    # running, and it had to resume it.
    assert joined.queries() or not running, (
        f"the process that joined read nothing, though {len(running)} partitions of its shards ran"
    )


def taken_by(member: ProducerProcess, before: float) -> set[int]:
    """Every shard ``member`` took before the group began to stop, as its log says (shards that
    move while the group stops are the stop's, which the checks leave out)."""
    return {shard for at, shards, taken in member.shard_moves() if taken and at < before for shard in shards}


def tokens_running_at_the_end(group: Group, shards: set[int]) -> list[str]:
    """Tokens of ``shards`` whose newest checkpoint record says their query was started and had
    not finished (a partition that waits for its parents is CREATED, not RUNNING)."""
    return [
        partition.token
        for partition in checkpointed_partitions(group.kafka, group.prefix)
        if partition.state == PartitionState.RUNNING and shard_of(partition.token, SHARDS) in shards
    ]


def event_ends(group: Group) -> dict[int, int]:
    """Event-topic partition → the offset after its last event (watermark records not counted)."""
    ends: dict[int, int] = {}
    for event in read_events(group.kafka, group.prefix, "Accounts"):
        ends[event.partition] = max(ends.get(event.partition, 0), event.offset + 1)
    return ends


@RERUN_ON_EMULATOR_SKIP
def test_a_process_frozen_past_its_session_writes_nothing_for_the_shards_it_lost(
    churn_spanner: str, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """SIGSTOP one of two while changes are written, until the other took its shards over and
    published everything; then SIGCONT: no event reaches Kafka after that (the broker refuses its
    fenced writers), and it stops with one line."""
    with group_of(stack, churn_spanner, tmp_path) as group:
        frozen, other = group.start_settled("frozen", "other")

        def freeze() -> None:
            frozen.process.send_signal(signal.SIGSTOP)
            frozen.killed_at = time.time()  # not live: it is to stop with an error

        group.write_and_wait(8, [(4, freeze)])
        wait_for(lambda: other.shards() == SHARDS, 120, "the other process to own every shard")
        events = group.write_and_wait(0, [])
        before = event_ends(group)
        frozen.process.send_signal(signal.SIGCONT)
        # Its stop can take two transaction timeouts (30 s each) when the broker's coordinator
        # drops the connection: a known slowness, seen in a clean-clone run on 2026-11-28.
        frozen.process.wait(120)
        time.sleep(3)  # what it had queued would have reached the broker by now
        after = event_ends(group)
    text = frozen.log.read_text()
    last = [line for line in text.splitlines() if " DEBUG " not in line][-1]
    assert frozen.process.returncode == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "were taken from this process" in last or "another producer took over" in last, last
    assert after == before, f"events written after the fence: {before} -> {after}"
    with group.diagnosing():
        assert_exactly_the_committed_changes(events, group.writer.committed)
