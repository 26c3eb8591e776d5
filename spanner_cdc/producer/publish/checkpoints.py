"""The producer's checkpoints: one compacted record per partition token on
``_spanner-cdc.{prefix}.checkpoints``.

A record is the partition's lineage and state (``Partition.to_json``): written when a partition
is discovered (before its parent may finish), as its acknowledged position advances, and when it
finishes. A running partition's records are made only as its shard's transaction commits
(producer.shards.transaction_checkpoints), so the newest is always the highest: a record made earlier
and sent behind a commit in flight would be committed after that commit's newer one. A new run
restores the newest committed record of every token (``read_to_end``, as a ``read_committed``
reader: a record of an aborted transaction is never restored).

With ``--group`` the topic has one partition per shard (a token's records are in shard
``shard_of(token)``), and every process follows all of them for as long as it runs
(:meth:`CheckpointStore.follow`): that is how it learns that another process's partition
finished, registered a child, or how far it has published (producer.lineage.partitions).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import closing

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from spanner_cdc.common.blocking import loop_on_thread_until
from spanner_cdc.common.kafka_offsets import end_offsets
from spanner_cdc.producer.errors import CheckpointError, DeliveryFailedError
from spanner_cdc.producer.lineage.partitions import Partition, shard_of
from spanner_cdc.producer.publish.kafka import KafkaClient

log = logging.getLogger(__name__)
#: How long the follower's consumer waits for records before it looks whether to stop.
FOLLOW_POLL_SECONDS = 0.1
#: How long a restore waits for a transaction left open on the topic to end: a little over
#: librdkafka's default ``transaction.timeout.ms`` (60 s), after which the broker aborts it.
OPEN_TRANSACTION_WAIT_SECONDS = 70.0
#: How often it looks again.
OPEN_TRANSACTION_POLL_SECONDS = 0.2


class CheckpointStore:
    def __init__(self, kafka: KafkaClient) -> None:
        self.kafka = kafka
        self.topic = kafka.topics.checkpoints
        #: Running partitions whose record the next commit of their shard carries whether or
        #: not their checkpoint advanced (producer.shards.transaction_checkpoints).
        self.due: set[str] = set()

    def make_due(self, token: str) -> None:
        """The next commit of ``token``'s shard carries its record."""
        self.due.add(token)

    def not_due(self, token: str) -> None:
        self.due.discard(token)

    async def write(self, partitions: Iterable[Partition], writer_shard: int | None = None) -> None:
        """Write each partition's state to its shard and wait until its transaction committed —
        through the writer of ``writer_shard`` (a parent's, for the children it registers),
        else of each partition's own shard. Not acknowledged: DeliveryFailedError, which a
        partition retries from its checkpoint; the client failed for good: KafkaClientLostError."""
        await self.kafka.ensure_topics([self.topic], compacted=True, partitions=self.kafka.shards)
        await self.send(partitions, writer_shard)

    def send(
        self,
        partitions: Iterable[Partition],
        writer_shard: int | None = None,
        *,
        on_staged: Callable[[], None] | None = None,
    ) -> asyncio.Future[None]:
        """:meth:`write` for a topic that exists (the producer creates it as it starts): each
        record is produced now, in this order, into its writer's open transaction (or the next,
        while a commit runs), so a record sent later through the same writer never commits
        before it; ``on_staged`` runs as the transaction that carries a record is about to
        commit. The future resolves, or fails as :meth:`write` does, once that committed."""
        shards = self.kafka.shards
        commits = asyncio.gather(
            *(
                self.kafka.produce_acknowledged(
                    self.topic,
                    partition.token.encode(),
                    json.dumps(partition.to_json()).encode(),
                    shard=shard_of(partition.token, shards) if writer_shard is None else writer_shard,
                    partition=shard_of(partition.token, shards),
                    on_staged=on_staged,
                )
                for partition in partitions
            )
        )
        return asyncio.ensure_future(_acknowledged(commits))

    def record(self, partition: Partition, checkpoint_micros: int) -> tuple[str, bytes, bytes, int]:
        """(topic, key, value, topic partition) of ``partition``'s record with the given
        checkpoint, in its shard: for a transaction to carry (producer.shards.transaction_checkpoints)."""
        state = {**partition.to_json(), "checkpoint_micros": checkpoint_micros}
        return (
            self.topic,
            partition.token.encode(),
            json.dumps(state).encode(),
            shard_of(partition.token, self.kafka.shards),
        )

    def read(self, timeout: float = 30.0) -> list[Partition]:
        """The newest state of every partition token (blocking: call before the loop runs work),
        once no transaction open when asked hides records (:meth:`_wait_for_open_transactions`)."""
        metadata = self.kafka.admin.list_topics(timeout=timeout)
        if self.topic not in metadata.topics:
            return []
        self._wait_for_open_transactions(sorted(metadata.topics[self.topic].partitions), timeout)
        newest: dict[str, Partition] = {}
        with closing(self.kafka.read_topic(self.topic, timeout)) as records:
            for offset, key, value in records:
                if value is not None:
                    partition = self.parse(offset, key, value)
                    newest[partition.token] = partition
        return list(newest.values())

    def _wait_for_open_transactions(self, shards: list[int], timeout: float) -> None:
        """Until every transaction open on the topic when asked has ended, for at most
        OPEN_TRANSACTION_WAIT_SECONDS. A ``read_committed`` reader stops at the first record of
        an open transaction: one this process did not fence (another shard's writer, a writer
        under another transactional id) hides every record committed after it, and a restore
        then resumes partitions from checkpoints older than their committed events."""
        places = [(self.topic, shard) for shard in shards]
        prefix = self.kafka.topics.prefix
        written = self.kafka.consumer(f"{prefix}.reader", **{"isolation.level": "read_uncommitted"})
        committed = self.kafka.consumer(f"{prefix}.reader")
        try:
            ends = end_offsets(written, places, timeout)
            deadline = time.monotonic() + OPEN_TRANSACTION_WAIT_SECONDS
            waiting = False
            while any(end_offsets(committed, places, timeout)[p] < ends[p] for p in places):
                if time.monotonic() >= deadline:
                    log.warning(
                        "%s: a transaction is still open after %.0f s; restoring the checkpoints "
                        "committed before it (a restart may then send some changes twice)",
                        self.topic,
                        OPEN_TRANSACTION_WAIT_SECONDS,
                    )
                    return
                if not waiting:
                    log.info(
                        "%s: waiting up to %.0f s for a transaction another writer left open",
                        self.topic,
                        OPEN_TRANSACTION_WAIT_SECONDS,
                    )
                    waiting = True
                time.sleep(OPEN_TRANSACTION_POLL_SECONDS)
        finally:
            written.close()
            committed.close()

    async def follow(self, on_records: Callable[[list[Partition]], None], stop: asyncio.Event) -> None:
        """Hand every record of every shard, from the first on and in the order of each shard,
        to ``on_records`` on the event loop, until ``stop``. A consumer on a worker thread,
        assigned every shard, reading committed records only."""
        loop = asyncio.get_running_loop()
        consumer = self.kafka.consumer(f"{self.kafka.topics.prefix}.follower")
        consumer.assign(
            [TopicPartition(self.topic, shard, OFFSET_BEGINNING) for shard in range(self.kafka.shards)]
        )

        def hand_over() -> None:
            records = [
                self.parse(message.offset() or 0, message.key(), value)
                for message in consumer.consume(1000, FOLLOW_POLL_SECONDS)
                if message.error() is None and (value := message.value()) is not None
            ]
            if records:
                loop.call_soon_threadsafe(on_records, records)

        try:  # a record that is not a checkpoint ends the producer (CheckpointError)
            await loop_on_thread_until(hand_over, stop)
        finally:
            consumer.close()

    def parse(self, offset: int, key: bytes | None, value: bytes) -> Partition:
        try:
            partition = Partition.from_json(json.loads(value))
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(
                f"{self.topic} offset {offset} is not a checkpoint record ({exc}); the producer will not "
                "guess where that partition stands: restore the topic, or start afresh with a new "
                "--topic-prefix and a --start-timestamp"
            ) from None
        if key is not None and key != partition.token.encode():
            raise CheckpointError(
                f"{self.topic} offset {offset}: the record's key is not its token {partition.token[:16]!r}"
            )
        return partition


async def _acknowledged(commits: Awaitable[object]) -> None:
    try:
        await commits
    except KafkaException as exc:  # a lost client raised KafkaClientLostError (kafka.refusal)
        raise DeliveryFailedError(f"checkpoints not acknowledged: {exc.args[0].str()}") from None
