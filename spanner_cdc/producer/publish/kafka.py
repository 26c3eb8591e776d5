"""A thin wrapper over the producer's Kafka clients: settings, topics, and producing with acks.

Delivery reports are served by :meth:`KafkaClient.poll` on the event loop's thread, so the
callbacks may touch asyncio objects and per-partition trackers without locks. Every message is
sent in a Kafka transaction and reported delivered once that committed (producer.publish.transactions),
by the transactional writer of the shard it belongs to: one writer for a producer on its own,
one per owned shard of the checkpoint topic for a process of a ``--group`` (producer.shards.group).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from contextlib import asynccontextmanager, closing
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from spanner_cdc.common.blocking import call_with_deadline
from spanner_cdc.common.kafka_offsets import READER_SETTINGS, read_to_end
from spanner_cdc.producer.errors import KafkaClientLostError, KafkaSetupError, ShardNotOwnedError
from spanner_cdc.producer.publish.transactions import (
    FAILURES_ONLY,
    PARTITION_BY_KEY,
    TRANSACTION_SECONDS,
    ClosingRecord,
    DeliveryCallback,
    StagedCallback,
    TransactionalWriter,
    client_lost,
    lost_for_good,
)
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.wire import WriterSchema

log = logging.getLogger(__name__)
#: Where librdkafka's logs of every client of the producer go: they join ours instead of raw stderr.
CLIENT_LOG = logging.getLogger("librdkafka")
#: The same for the producer's readers (:meth:`KafkaClient.consumer`), which share the user's
#: ``--kafka-config`` with its writers and so are handed the writers' tuning too.
READER_LOG = logging.getLogger("librdkafka.readers")


def _not_a_reader_setting(record: logging.LogRecord) -> bool:
    """False for librdkafka's warning that a reader ignores a producer setting of the shared
    ``--kafka-config`` (``linger.ms``, ``message.timeout.ms``…): one line per setting and reader
    on every start, about settings that were never meant for it."""
    return "is a producer property and will be ignored by this consumer" not in record.getMessage()


READER_LOG.addFilter(_not_a_reader_setting)
#: librdkafka settings the ordering and delivery guarantees depend on; users may not override them.
GUARANTEED_SETTINGS = {
    "enable.idempotence": "true",  # implied by transactional.id, which each writer sets
    "acks": "all",
    "max.in.flight.requests.per.connection": "5",
    "partitioner": "murmur2_random",
}
TUNED_DEFAULTS = {
    "compression.type": "lz4",
    "linger.ms": "20",
    "batch.size": "1000000",
    "queue.buffering.max.messages": "500000",
    "queue.buffering.max.kbytes": "1048576",
}
#: librdkafka's ``message.max.bytes`` when the settings name none.
LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000
#: What a topic's ``max.message.bytes`` must leave beyond the messages: the broker applies it to
#: a batch as stored, with its framing and what compression adds to data it cannot shrink
#: (lz4: under 0.4 %), where librdkafka's own limit counts a message's key and value.
BATCH_FRAMING_BYTES = 1024
#: How long a flush at shutdown or a handover waits for Kafka's acknowledgements.
FLUSH_TIMEOUT_SECONDS = 60.0
#: How long a checkpoint topic just created may show no partitions in the broker's metadata.
TOPIC_METADATA_SECONDS = 30.0
#: How long to wait before asking the metadata again.
METADATA_RETRY_SECONDS = 0.1


def topic_limit_for(message_bytes: int) -> int:
    """The ``max.message.bytes`` a topic needs to accept every batch of a writer whose
    ``message.max.bytes`` is ``message_bytes``: a batch holds at most ``batch.size`` bytes of
    messages, or one message, and the writers keep ``batch.size`` at or below ``message_bytes``."""
    return message_bytes + message_bytes // 64 + BATCH_FRAMING_BYTES


def messages_fitting(topic_limit: int) -> int:
    """The largest messages a topic of ``max.message.bytes`` ``topic_limit`` accepts in any batch."""
    return max(0, (topic_limit - BATCH_FRAMING_BYTES) * 64 // 65)


def refusal(error: KafkaError) -> Exception:
    """What a refused message raises, produced or awaited: KafkaClientLostError when the client
    is :func:`lost_for_good` (the producer stops with its line), else the client's error."""
    return KafkaClientLostError(client_lost(error)) if lost_for_good(error) else KafkaException(error)


class KafkaClient:
    """The transactional writers of the shards this process owns, and an admin client, for one
    topic prefix. ``shards`` is the checkpoint topic's partition count (1 for a producer on its
    own), known once the topic was created or found (:meth:`ensure_checkpoint_topic`)."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        extra_settings: dict[str, str],
        topic_partitions: int,
        replication_factor: int,
    ) -> None:
        overridden = sorted(set(extra_settings) & set(GUARANTEED_SETTINGS))
        if overridden:
            raise KafkaSetupError(
                f"--kafka-config may not set {', '.join(overridden)}: ordering depends on them"
            )
        self.client_settings: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "logger": CLIENT_LOG,
            **extra_settings,
        }
        self.topics = Topics(prefix)
        self.shards = 1
        #: Shard → its writer, for the shards this process owns.
        self.writers: dict[int, TransactionalWriter] = {}
        self.admin = AdminClient(self.client_settings)
        self.topic_partitions = topic_partitions
        self.replication_factor = replication_factor
        #: The largest message the writers send (librdkafka's ``message.max.bytes``): the
        #: settings' own, lowered to the limit of the prefix's topics (:meth:`fit_to_topics`).
        self.message_max_bytes = int(
            self.client_settings.get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES)
        )
        self._created: set[str] = set()
        self._schemas: dict[int, asyncio.Future[None]] = {}
        self._closing: Callable[[int], list[ClosingRecord]] | None = None
        #: Somebody awaits a message's commit (:meth:`produce_acknowledged`): the poller commits
        #: at its next turn instead of at the end of the interval.
        self._commit_awaited = False

    # --- topics and schemas ---------------------------------------------------------------

    async def check_reachable(self, timeout: float) -> set[str]:
        """The topics on the broker now (the answer that shows it is reachable)."""
        try:
            metadata = await call_with_deadline(lambda: self.admin.list_topics(timeout=timeout), timeout + 5)
            return set(metadata.topics)
        except KafkaException as exc:
            raise KafkaSetupError(
                f"Kafka at {self.client_settings['bootstrap.servers']} does not answer: {exc.args[0].str()}"
            ) from None

    async def fit_to_topics(self, existing: set[str], timeout: float) -> None:
        """Lower :attr:`message_max_bytes` to the smallest ``max.message.bytes`` of the prefix's
        topics in ``existing``; call before the first writer is made.

        librdkafka refuses a message over its own limit as it is produced, and the sender then
        writes the event's dead letter (EventSender.too_large); it also keeps every batch under
        that limit. The broker applies its topic's limit to a whole batch inside the
        transaction, which can then only abort: an event over it — or a batch of small ones —
        stopped the producer, and every restart again. Topics the producer creates take its
        limit (:meth:`ensure_topics`); topics made otherwise, or by a run with a higher
        limit, are read here. Without the right to read their configuration (``DescribeConfigs``)
        the settings' limit stays, and a warning says so."""
        topics = sorted(t for t in existing if self.topics.is_event_topic(t) or t in self.topics.control)
        if not topics:
            return
        try:
            futures = self.admin.describe_configs(
                [ConfigResource(ResourceType.TOPIC, topic) for topic in topics], request_timeout=timeout
            )
            limits = {
                resource.name: int((await asyncio.wrap_future(future))["max.message.bytes"].value)
                for resource, future in futures.items()
            }
        except KafkaException as exc:
            log.warning(
                "cannot read the size limit of topic prefix %s's topics (%s): messages up to %d bytes are "
                "sent, and one over a topic's own limit stops the producer; allow DescribeConfigs on them "
                "(docs/security.md), or set message.max.bytes (--kafka-config) to their limit",
                self.topics.prefix,
                exc.args[0].str(),
                self.message_max_bytes,
            )
            return
        topic = min(limits, key=limits.__getitem__)
        if limits[topic] < topic_limit_for(self.message_max_bytes):
            fitting = messages_fitting(limits[topic])
            log.info(
                "messages of up to %d bytes, not %d: topic %s accepts batches of %d bytes",
                fitting,
                self.message_max_bytes,
                topic,
                limits[topic],
            )
            self.message_max_bytes = fitting

    async def event_topics(self, timeout: float = 10.0) -> dict[str, int]:
        """Every event topic of the prefix on the broker, with its partition count.

        Topics created by an earlier run count too: a watermark is a promise about all of them.
        """
        metadata = await call_with_deadline(lambda: self.admin.list_topics(timeout=timeout), timeout + 5)
        return {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if self.topics.is_event_topic(name)
        }

    def created_event_topics(self) -> set[str]:
        """The event topics this client created or found while producing."""
        return {topic for topic in self._created if self.topics.is_event_topic(topic)}

    async def ensure_topic(self, topic: str, compacted: bool = False) -> None:
        await self.ensure_topics([topic], compacted)

    async def ensure_topics(
        self, topics: Sequence[str], compacted: bool = False, partitions: int | None = None
    ) -> None:
        """Create the topics not created or found yet, in one request (one existing is fine);
        compacted ones have one partition unless ``partitions`` says otherwise. Each accepts
        messages as large as the writers send (``max.message.bytes``), whatever the broker's
        default: see :meth:`fit_to_topics`."""
        missing = sorted(set(topics) - self._created)
        if not missing:
            return
        partitions = partitions or (1 if compacted else self.topic_partitions)
        config = {"max.message.bytes": str(topic_limit_for(self.message_max_bytes))}
        if compacted:
            config["cleanup.policy"] = "compact"
        futures = self.admin.create_topics(
            [NewTopic(topic, partitions, self.replication_factor, config=config) for topic in missing],
            operation_timeout=30,
        )
        for topic in missing:
            try:
                await asyncio.wrap_future(futures[topic])
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise KafkaSetupError(f"cannot create topic {topic}: {error.str()}") from None
            self._created.add(topic)

    async def ensure_checkpoint_topic(self, shards: int) -> int:
        """Create the checkpoint topic with ``shards`` partitions, or find it; the shards it has
        (fixed when it was created: a token's shard is its key's hash modulo their number).

        Right after its creation, a loaded broker may answer with the topic and none of its
        partitions; that count is never taken, since it names the writers' transactional ids
        (``Topics.writer_transactional_id``): a first run that took it wrote as a writer later
        runs did not fence, its open transaction held back every read of the checkpoints for
        ``transaction.timeout.ms``, and restarts meanwhile resumed from stale checkpoints."""
        topic = self.topics.checkpoints
        await self.ensure_topics([topic], compacted=True, partitions=shards)
        deadline = time.monotonic() + TOPIC_METADATA_SECONDS
        while True:
            metadata = await call_with_deadline(lambda: self.admin.list_topics(topic, timeout=10), 15)
            found = metadata.topics.get(topic)
            if found is not None and found.error is None and found.partitions:
                self.shards = len(found.partitions)
                return self.shards
            if time.monotonic() >= deadline:
                reason = "not found" if found is None or found.error is None else found.error.str()
                raise KafkaSetupError(f"{topic}: the broker shows none of its partitions ({reason})")
            await asyncio.sleep(METADATA_RETRY_SECONDS)

    async def ensure_schema(self, writer: WriterSchema, shard: int | None = None) -> None:
        """Publish ``writer`` to the schemas topic once (through ``shard``'s writer, or any
        this process holds) and wait for the broker's ack.

        Events are produced only after this returns, so a reader never meets a fingerprint it
        cannot resolve. A publication that failed (its transaction aborted) is tried again.
        """
        pending = self._schemas.get(writer.fingerprint)
        if pending is None or (pending.done() and pending.exception() is not None):
            pending = self._schemas[writer.fingerprint] = self.produce_acknowledged(
                self.topics.schemas, writer.fingerprint_hex.encode(), writer.schema_json.encode(), shard=shard
            )
        await asyncio.shield(pending)

    def consumer(self, group_id: str, **settings: Any) -> Consumer:
        """A consumer of this broker that reads the project's topics' committed records
        (common.kafka_offsets' READER_SETTINGS), commits no offsets, in group ``group_id``;
        ``settings`` add to it."""
        return Consumer(
            {
                **READER_SETTINGS,
                **self.client_settings,
                "logger": READER_LOG,
                "group.id": group_id,
                "enable.auto.commit": False,
                **settings,
            }
        )

    def read_topic(self, topic: str, timeout: float) -> Generator[tuple[int, bytes | None, bytes | None]]:
        """(offset, key, value) of every record now in ``topic``, one at a time (blocking: for
        start-up, before the loop runs work). Call with ``contextlib.closing`` so the consumer is
        closed also when the caller stops early. KafkaSetupError when the broker hands over
        nothing for ``timeout`` seconds."""
        consumer = self.consumer(f"{self.topics.prefix}.reader")
        try:
            with closing(read_to_end(consumer, topic, {}, timeout=timeout)) as messages:
                for _partition, offset, key, value in messages:
                    yield offset, key, value
        except TimeoutError as exc:
            raise KafkaSetupError(f"cannot read {topic}: {exc}") from None
        finally:
            consumer.close()

    # --- producing --------------------------------------------------------------------------

    def produce_acknowledged(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        *,
        shard: int | None = None,
        partition: int = PARTITION_BY_KEY,
        on_staged: StagedCallback | None = None,
    ) -> asyncio.Future[None]:
        """Produce one message (``on_staged`` as for :meth:`produce`); the future resolves once
        its transaction committed, which the poller starts at its next turn: what awaits it — a
        table's writer schemas before its first event, the checkpoints that register a
        partition's children or end it — is on the way of every event behind it, where an
        interval's wait would be paid at each step."""
        self.commit_soon()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settle(error: KafkaError | None, _message: Message | None) -> None:
            if future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(refusal(error))

        self.produce(topic, key, value, settle, shard=shard, partition=partition, on_staged=on_staged)
        return future

    def commit_soon(self) -> None:
        """Ask the poller to commit the open transactions at its next turn, not at the end of
        the interval: something waits for what they hold and has nothing more to send."""
        self._commit_awaited = True

    def produce(
        self,
        topic: str,
        key: bytes,
        value: bytes | None,
        on_delivery: DeliveryCallback,
        *,
        shard: int | None = None,
        partition: int = PARTITION_BY_KEY,
        on_staged: StagedCallback | None = None,
    ) -> None:
        """Queue one message through ``shard``'s writer (None: any this process holds);
        ``on_staged`` runs when the broker took it into the open transaction, ``on_delivery``
        once that committed (or failed)."""
        self.writer(shard).produce(topic, key, value, on_delivery, partition, on_staged=on_staged)

    def writer(self, shard: int | None) -> TransactionalWriter:
        """The writer of ``shard``, which this process must own (None: any it holds)."""
        if shard is None and self.writers:
            return next(iter(self.writers.values()))
        shard = shard or 0
        writer = self.writers.get(shard)
        if writer is None and self.shards == 1:  # a client used without take_over (tests, benchmarks)
            writer = self.writers[shard] = self._new_writer(shard)
        if writer is None:
            raise ShardNotOwnedError(f"shard {shard} of {self.topics.checkpoints} is not this process's")
        return writer

    def close_transactions_with(self, closing: Callable[[int], list[ClosingRecord]]) -> None:
        """Every shard's transactions carry, as they commit, the records ``closing(shard)``
        makes then (the producer's checkpoints of what the transaction delivers)."""
        self._closing = closing
        for shard, writer in self.writers.items():
            writer.closing = functools.partial(closing, shard)

    def _new_writer(self, shard: int) -> TransactionalWriter:
        records = None if self._closing is None else functools.partial(self._closing, shard)
        settings = {**TUNED_DEFAULTS, **self.client_settings}
        return TransactionalWriter(
            Producer(
                {
                    **settings,
                    "message.max.bytes": self.message_max_bytes,
                    "batch.size": min(int(settings["batch.size"]), self.message_max_bytes),
                    **GUARANTEED_SETTINGS,
                    **FAILURES_ONLY,
                    "transactional.id": self.topics.writer_transactional_id(shard, self.shards),
                }
            ),
            records,
        )

    async def take_over(self, shard: int = 0) -> None:
        """Become ``shard``'s one writer: the process that wrote for it before is fenced from
        now on (its open transaction aborted, whatever it sends later refused)."""
        writer = self.writers.get(shard) or self._new_writer(shard)
        await writer.take_over()
        self.writers[shard] = writer

    async def hand_back(self, shard: int) -> None:
        """Commit what ``shard``'s writer sent and close it: another process takes it over."""
        writer = self.writers.pop(shard, None)
        if writer is not None:
            await writer.commit()

    def drop(self, shard: int) -> None:
        """Forget ``shard``'s writer without committing: it was fenced, or is about to be."""
        self.writers.pop(shard, None)

    def poll(self) -> int:
        """Serve delivery reports now (on the calling thread, which must be the loop's)."""
        return sum(writer.poll() for writer in list(self.writers.values()))

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """While the block runs, serve delivery reports and commit the open transactions every
        TRANSACTION_SECONDS — at once when a commit is awaited; on leaving it, commit once more.
        Nothing sent is acknowledged without it: an acknowledgement is a delivery report of a
        committed transaction."""
        stop = asyncio.Event()
        poller = asyncio.create_task(self._serve(stop))
        try:
            yield
        finally:
            stop.set()
            await poller

    async def _serve(self, stop: asyncio.Event) -> None:
        committed_at = time.monotonic()
        while not stop.is_set():
            self.poll()
            if self._commit_awaited or time.monotonic() - committed_at >= TRANSACTION_SECONDS:
                self._commit_awaited = False  # one asked for meanwhile is another commit
                await self._commit_all()
                committed_at = time.monotonic()
            await asyncio.sleep(0.005)
        await self._commit_all()

    async def _commit_all(self, deadline: float | None = None) -> int:
        """Commit every writer's open transaction, together; how many messages failed."""
        failed = await asyncio.gather(*(w.commit(deadline) for w in list(self.writers.values())))
        return sum(failed)

    async def commit_checkpoints(self, shards: set[int]) -> int:
        """Commit the open transactions of ``shards``' writers with their checkpoint records, also
        those with nothing else to commit; how many messages failed. KafkaClientLostError when a
        writer can deliver nothing any more."""
        writers = [w for shard, w in list(self.writers.items()) if shard in shards]
        failed = await asyncio.gather(*(w.commit(checkpoints=True) for w in writers))
        for writer in writers:
            if writer.lost is not None:
                raise KafkaClientLostError(client_lost(writer.lost))
        return sum(failed)

    async def flush(self, timeout: float) -> int:
        """Commit what was sent so far, waiting at most about ``timeout`` seconds for Kafka's
        acknowledgements (and the commit's own timeout); returns how many messages failed."""
        return await self._commit_all(deadline=time.monotonic() + timeout)
