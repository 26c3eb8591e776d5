"""A partition's life against scripted change-stream answers and the real broker: what the
producer does with query ends Spanner should never send, and restoring its checkpoints."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from spanner_cdc.producer.change_stream_rules import GOOGLE_STANDARD_SQL
from spanner_cdc.producer.changestream.actions import PartitionRun
from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.producer.lineage.acks import AckTracker
from spanner_cdc.producer.lineage.partitions import (
    ROOT,
    Partition,
    PartitionScheduler,
    PartitionState,
    shard_of,
)
from spanner_cdc.producer.main import wire_service
from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.publish.checkpoints import CheckpointStore
from spanner_cdc.producer.publish.kafka import KafkaClient
from spanner_cdc.producer.publish.publisher import EventPublisher, EventSender
from spanner_cdc.producer.service import ProducerService
from spanner_cdc.producer.shards.transaction_checkpoints import TransactionCheckpoints
from spanner_cdc.producer.spanner.catalog import CatalogContents, TableCatalog
from spanner_cdc.producer.spanner.query import ChangeStreamQuery
from spanner_cdc.schemas.events import EventBuilder
from spanner_cdc.schemas.records import (
    ChangeStreamRecord,
    ChildPartition,
    ChildPartitionsRecord,
    DataChangeRecord,
    HeartbeatRecord,
)
from spanner_cdc.schemas.timestamps import now_micros
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import unique_prefix
from testkit.producer_run import checkpointed_partitions, running, wait_until
from testkit.records import account_transfer_records
from tests.support.kafka_read import read_all, read_events

pytestmark = pytest.mark.integration
Rows = list[list[ChangeStreamRecord]]


class ScriptedSource:
    """Answers each partition's queries from a script: the n-th query of a token gets the n-th
    answer (the last one again once the script runs out)."""

    def __init__(self, script: dict[str | None, list[Rows]]) -> None:
        self.script = script
        self.queries: collections.Counter[str | None] = collections.Counter()

    def read(
        self, query: ChangeStreamQuery, token: str | None, start_micros: int
    ) -> Iterator[list[ChangeStreamRecord]]:
        answers = self.script[token]
        answer = answers[min(self.queries[token], len(answers) - 1)]
        self.queries[token] += 1
        yield from answer


def service_for(
    stack: EmbeddedStack,
    source: ScriptedSource,
    start: int,
    *,
    end: int | None = None,
    load_catalog: Callable[[], CatalogContents] = lambda: ({}, {}),
    checkpoint_interval: float = 1.0,
    scheduler: PartitionScheduler | None = None,
) -> ProducerService:
    config = ProducerConfig(
        project="p", instance="i", database="d", change_stream="S", kafka_bootstrap=stack.endpoint("kafka"),
        start_timestamp_micros=start, end_timestamp_micros=end, topic_prefix=unique_prefix("life"),
        progress=False, checkpoint_interval=checkpoint_interval,
    )  # fmt: skip
    kafka = KafkaClient(config.kafka_bootstrap, config.topic_prefix, {}, 1, -1)
    metrics = ProducerMetrics()
    catalog = TableCatalog(GOOGLE_STANDARD_SQL, load_catalog)
    publisher = EventPublisher(EventSender(kafka, metrics), catalog, EventBuilder(config.stream_name, "d"))
    return wire_service(
        config,
        source=source,
        dialect=GOOGLE_STANDARD_SQL,
        publisher=publisher,
        checkpoints=CheckpointStore(kafka),
        scheduler=scheduler or PartitionScheduler.starting_at(start),
        metrics=metrics,
    )


def children(start: int, token: str, parent: str) -> list[ChangeStreamRecord]:
    return [ChildPartitionsRecord(start, "00000001", (ChildPartition(token, (parent,)),))]


def a_finished_and_b_known(service: ProducerService) -> bool:
    partitions = service.scheduler.partitions
    return "B" in partitions and partitions["A"].state == PartitionState.FINISHED


def test_a_query_that_ends_early_without_children_is_retried_not_finished(stack: EmbeddedStack) -> None:
    start = now_micros() - 1_000_000
    source = ScriptedSource(
        {
            None: [[children(start, "A", ROOT)]],
            # A's first query ends normally, before any end timestamp, reporting no children.
            "A": [
                [[HeartbeatRecord(start + 10)]],
                [[HeartbeatRecord(start + 20)], children(start + 30, "B", "A")],
            ],
            "B": [[[HeartbeatRecord(start + 40)]]],
        }
    )
    service = service_for(stack, source, start)

    async def scenario() -> None:
        async with running(service):
            # B is known as soon as A's second answer names it; A finishes when that answer ends.
            await wait_until(service, lambda: a_finished_and_b_known(service), 30)

    asyncio.run(scenario())
    a = service.scheduler.partitions["A"]
    assert a.retries >= 1, "the early end was taken as the partition's finish"
    assert a.state == PartitionState.FINISHED
    assert source.queries["A"] == 2
    assert (
        service.metrics.registry.get_sample_value("spanner_cdc_producer_queries_ended_early_total") or 0
    ) >= 1


def test_a_change_being_published_holds_back_its_checkpoint_and_finish(stack: EmbeddedStack) -> None:
    """Publishing a change can wait (here on the catalog read its new table needs; in a chaos run
    on the ack of a new table's schema while the broker was frozen). The change used to leave the
    buffer before that wait, so it was neither held nor counted by the acks meanwhile: a checkpoint
    written then passed it, and the producer, SIGKILLed before the ack, lost the change (2 of
    18,485 in a chaos run)."""
    start = now_micros() - 1_000_000
    change = a_change_at(start + 100)
    source = ScriptedSource(
        {
            None: [[children(start, "A", ROOT)]],
            "A": [[[change], [HeartbeatRecord(start + 200)]]],
        }
    )
    loading, loaded = threading.Event(), threading.Event()

    def slow_catalog() -> CatalogContents:
        loading.set()
        loaded.wait(60)
        return {}, {}

    # A's query ends at the end timestamp (in the past), so A finishes once its change is acked.
    service = service_for(stack, source, start, end=start + 300, load_catalog=slow_catalog)
    seen_while_publishing: list[tuple[PartitionState, int]] = []

    async def watch() -> None:
        try:
            while not loading.is_set():
                await asyncio.sleep(0.05)
            # Several rounds of the checkpoint loop run while the publish waits.
            await asyncio.sleep(3 * service.config.checkpoint_interval)
            a = service.scheduler.partitions["A"]
            seen_while_publishing.append((a.state, a.checkpoint_micros))
        finally:
            loaded.set()

    async def scenario() -> None:
        await asyncio.wait_for(asyncio.gather(service.run(), watch()), 60)

    asyncio.run(scenario())
    assert seen_while_publishing == [(PartitionState.RUNNING, start + 99)], (
        "a checkpoint or the finish passed a change that was still being published"
    )
    assert service.scheduler.partitions["A"].state == PartitionState.FINISHED
    events = read_events(stack.endpoint("kafka"), service.config.topic_prefix, change.table_name)
    assert [event.value["sort_keys"][0] for event in events] == [start + 100]


class ResumingSource(ScriptedSource):
    """The script, less what was committed before the query's start: as Spanner answers."""

    def read(
        self, query: ChangeStreamQuery, token: str | None, start_micros: int
    ) -> Iterator[list[ChangeStreamRecord]]:
        for records in super().read(query, token, start_micros):
            yield [
                record
                for record in records
                if not isinstance(record, DataChangeRecord) or record.commit_timestamp_micros >= start_micros
            ]


def test_a_run_that_fails_after_publishing_sends_nothing_twice(stack: EmbeddedStack) -> None:
    """A run can fail — a Spanner error, a stall, an early end — while its events are still in
    the open transaction, which commits them anyway. Its retry resumed from the checkpoint before
    them and sent them again: 582 changes twice on Kafka in a chaos run, where the emulator's
    freeze failed many runs at once. The retry now waits for what the run sent and resumes
    after what that delivered."""
    start = now_micros() - 1_000_000
    change = a_change_at(start + 100)
    source = ResumingSource(
        {
            None: [[children(start, "A", ROOT)]],
            "A": [
                [[change], [HeartbeatRecord(start + 200)]],  # ends early: no children
                [[change], [HeartbeatRecord(start + 200)], children(start + 300, "B", "A")],
            ],
            "B": [[[HeartbeatRecord(start + 400)]]],
        }
    )
    service = service_for(stack, source, start)

    async def scenario() -> None:
        async with running(service):
            await wait_until(service, lambda: a_finished_and_b_known(service), 30)

    asyncio.run(scenario())
    assert source.queries["A"] == 2
    events = read_events(stack.endpoint("kafka"), service.config.topic_prefix, change.table_name)
    assert [event.value["sort_keys"][0] for event in events] == [start + 100]


def test_nothing_of_a_shard_starts_while_it_is_handed_back(stack: EmbeddedStack) -> None:
    """A shard's handover awaits (its queries' ends, a flush, its checkpoints). A partition of it
    that became runnable meanwhile — another process's records arrived, a sibling finished — was
    started, and wrote through the shard's writer after the handover had closed it: a CI run's
    producer stopped with "shard 1 of ... is not this process's"."""
    start = now_micros() - 1_000_000
    token = next(f"X{n}" for n in itertools.count() if shard_of(f"X{n}", 2) == 1)
    change = a_change_at(start + 100)
    source = ScriptedSource({token: [[[change], [HeartbeatRecord(start + 200)]]]})
    root = Partition(ROOT, (), start, PartitionState.FINISHED, children=(token,))
    scheduler = PartitionScheduler(
        {ROOT: root, token: Partition(token, (ROOT,), start)}, shards=2, owned={0, 1}
    )
    service = service_for(stack, source, start, scheduler=scheduler)

    async def scenario() -> None:
        kafka = service.publisher.kafka
        await kafka.ensure_checkpoint_topic(2)
        await asyncio.gather(kafka.take_over(0), kafka.take_over(1))
        handover = asyncio.create_task(service.handover.give_back_shards([1]))
        await asyncio.sleep(0)  # the handover is under way
        service._records_seen([])  # what the follower does when other processes' records arrive
        await handover
        await asyncio.sleep(1)

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert source.queries[token] == 0, "a partition of the shard being handed back was started"
    assert not service.stopped


class HeldRootSource(ScriptedSource):
    """The root's query names its children, then stays open until ``release`` is set."""

    def __init__(self, script: dict[str | None, list[Rows]]) -> None:
        super().__init__(script)
        self.release = threading.Event()

    def read(
        self, query: ChangeStreamQuery, token: str | None, start_micros: int
    ) -> Iterator[list[ChangeStreamRecord]]:
        yield from super().read(query, token, start_micros)
        if token is None:
            self.release.wait(60)


def test_children_are_never_restored_without_their_parent(stack: EmbeddedStack) -> None:
    """A process killed after its children's record was committed and before the root's first
    one restored children of a parent it had never heard of, and waited for it forever. The
    periodic checkpoints are off here: only the children's write can carry the parent."""
    start = now_micros() - 1_000_000
    source = HeldRootSource({None: [[children(start, "A", ROOT)]], "A": [[[HeartbeatRecord(start + 10)]]]})
    service = service_for(stack, source, start, checkpoint_interval=3600)
    seen: list[set[str]] = []

    async def scenario() -> None:
        async with running(service):
            try:
                while not seen or "A" not in seen[-1]:
                    records = await asyncio.to_thread(
                        checkpointed_partitions, stack.endpoint("kafka"), service.config.topic_prefix
                    )
                    seen.append({p.token for p in records})
                    await asyncio.sleep(0.1)
            finally:
                source.release.set()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert ROOT in seen[-1], f"the children's record was durable without the root's: {seen[-1]}"


def test_checkpoints_produced_in_one_batch_are_all_restored(stack: EmbeddedStack) -> None:
    """Every record of one batch is restored, not only its first (ListOffsets' end is after
    the batch's last record)."""
    prefix = unique_prefix("ckpt")
    partitions = [
        Partition(f"token-{n:02d}", (ROOT,), 1_000, PartitionState.RUNNING, checkpoint_micros=2_000 + n)
        for n in range(20)
    ]

    async def write() -> None:
        kafka = KafkaClient(stack.endpoint("kafka"), prefix, {}, 1, -1)
        async with kafka.serving():
            await CheckpointStore(kafka).write(partitions)

    asyncio.run(write())
    restored = checkpointed_partitions(stack.endpoint("kafka"), prefix)
    states: dict[str, Any] = {p.token: p.to_json() for p in restored}
    assert states == {p.token: p.to_json() for p in partitions}


def test_a_restore_waits_for_a_transaction_another_writer_left_open(stack: EmbeddedStack) -> None:
    """A writer the producer does not fence left a transaction open on the checkpoint topic (a
    first run had named its transactional id after a metadata answer without partitions): a
    ``read_committed`` restore stopped at its first record, so every checkpoint committed after
    it was hidden, partitions resumed from older ones, and a chaos run sent 2,779 changes twice.
    The restore now waits until what was open when it asked has ended."""
    bootstrap = stack.endpoint("kafka")
    prefix = unique_prefix("open")
    store = CheckpointStore(KafkaClient(bootstrap, prefix, {}, 1, -1))
    asyncio.run(store.kafka.ensure_checkpoint_topic(1))

    def writer(name: str, partition: Partition) -> Producer:
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{prefix}.{name}"})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(store.topic, json.dumps(partition.to_json()).encode(), b"A", partition=0)
        producer.flush(10)
        return producer

    stray = writer("stray", Partition("A", (ROOT,), 10))
    writer(
        "later", Partition("A", (ROOT,), 10, PartitionState.RUNNING, checkpoint_micros=20)
    ).commit_transaction(30)
    threading.Timer(2.0, stray.abort_transaction, (30,)).start()
    restored = {partition.token: partition for partition in store.read()}
    assert restored["A"].checkpoint_micros == 20


def test_a_split_is_recorded_in_lineage_order(stack: EmbeddedStack) -> None:
    """A parent's children are registered while its query reads on, and it finishes in the
    transaction of its last records; the checkpoint topic must still tell a restart the
    lineage in order: the children's records no later than their parent's FINISHED one, and
    nothing of a child's own before it — a child starts only once its parent's finish committed."""
    start = now_micros() - 1_000_000
    end = start + 300
    change = a_change_at(start + 100)
    source = ScriptedSource(
        {
            None: [[children(start + 10, "A", ROOT), children(start + 10, "B", ROOT)]],
            "A": [[[change], [HeartbeatRecord(start + 200)]]],
            "B": [[[HeartbeatRecord(start + 200)]]],
        }
    )
    service = service_for(stack, source, start, end=end)
    asyncio.run(asyncio.wait_for(service.run(), 60))

    bootstrap, prefix = stack.endpoint("kafka"), service.config.topic_prefix
    written = [
        Partition.from_json(json.loads(value))
        for _, _, _, value in sorted(read_all(bootstrap, Topics(prefix).checkpoints))
        if value is not None
    ]
    at = {(p.token, p.state): n for n, p in enumerate(written)}  # the last of each
    root_finished = at[ROOT, PartitionState.FINISHED]
    assert at["A", PartitionState.CREATED] < root_finished
    assert at["B", PartitionState.CREATED] < root_finished
    first_own = min(n for n, p in enumerate(written) if p.token != ROOT and p.state != PartitionState.CREATED)
    assert first_own > root_finished, [(p.token, p.state.value) for p in written]
    newest = {p.token: (p.state, p.checkpoint_micros) for p in written}
    assert newest == dict.fromkeys((ROOT, "A", "B"), (PartitionState.FINISHED, end))
    events = read_events(bootstrap, prefix, change.table_name)
    assert [event.value["sort_keys"][0] for event in events] == [start + 100]


def test_a_transaction_carrying_a_finished_record_carries_no_running_record_of_it(
    stack: EmbeddedStack,
) -> None:
    """A partition's FINISHED record goes out in the transaction of its last events, whose
    commit adds the running record of every checkpoint it moves. One of the same partition after
    the FINISHED record would be the newest record of the token: a restart would read the
    partition again, and the other processes of a group would wait for its finish for ever."""
    start = now_micros() - 1_000_000
    service = service_for(stack, ScriptedSource({}), start)
    partition = Partition(
        "A", (ROOT,), start, PartitionState.RUNNING, checkpoint_micros=start, watermark_micros=start + 50
    )
    service.scheduler.partitions["A"] = partition
    run = service.runner.runs["A"] = PartitionRun(partition, AckTracker())
    closing = TransactionCheckpoints(service.scheduler, service.runner, service.release, service.checkpoints)
    assert [record.key for record in closing(0)] == [b"A"]  # its checkpoint moves with the commit

    run.stage_finish()  # what the writer does as the transaction carrying the record commits
    service.checkpoints.make_due("A")
    assert closing(0) == []


def a_change_at(commit_micros: int) -> DataChangeRecord:
    """The first recorded transfer, committed at ``commit_micros``."""
    return DataChangeRecord.from_json(account_transfer_records()[0])._replace(
        commit_timestamp_micros=commit_micros
    )
