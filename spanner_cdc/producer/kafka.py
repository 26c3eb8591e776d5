"""A thin wrapper over the producer's Kafka clients: settings, topics, and producing with acks.

Delivery reports are served by :meth:`KafkaClient.poll` on the event loop's thread, so the
callbacks may touch asyncio objects and per-partition trackers without locks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Generator, Sequence
from contextlib import closing
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from spanner_cdc.common.blocking import call_with_deadline
from spanner_cdc.common.kafka_offsets import SHORT_FETCH_WAIT, read_to_end
from spanner_cdc.producer.errors import KafkaClientLostError, KafkaSetupError
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.wire import WriterSchema

log = logging.getLogger(__name__)
#: librdkafka settings the ordering and delivery guarantees depend on; users may not override them.
GUARANTEED_SETTINGS = {
    "enable.idempotence": "true",
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
DeliveryCallback = Callable[[KafkaError | None, Message], None]


def lost_for_good(error: KafkaError) -> bool:
    """Whether the producer's client will deliver nothing more: a fatal error, or fenced.

    Measured on the embedded broker: when a delivery timed out (the broker stopped answering for
    longer than ``message.timeout.ms``) the idempotent client asks for a new producer epoch, as
    it must after a timeout, the broker answers PRODUCER_FENCED, and from then on every message
    fails the same way at once — not flagged fatal, so a retry through the client would loop
    (docs/facts.md).
    """
    return error.fatal() or error.code() in (KafkaError.PRODUCER_FENCED, KafkaError._FENCED)


def client_lost(error: KafkaError) -> str:
    """The one line for a client :func:`lost_for_good` (see KafkaClientLostError)."""
    return (
        f"Kafka's client failed for good ({error.str()}): run the producer again, it resumes from "
        "its checkpoints"
    )


def refusal(error: KafkaError) -> Exception:
    """What a refused message raises, produced or awaited: KafkaClientLostError when the client
    is :func:`lost_for_good` (the producer stops with its line), else the client's error."""
    return KafkaClientLostError(client_lost(error)) if lost_for_good(error) else KafkaException(error)


class KafkaClient:
    """One idempotent producer and an admin client for one topic prefix."""

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
            "logger": logging.getLogger("librdkafka"),  # its logs join ours instead of raw stderr
            **extra_settings,
        }
        self.producer = Producer({**TUNED_DEFAULTS, **self.client_settings, **GUARANTEED_SETTINGS})
        self.admin = AdminClient(self.client_settings)
        self.topics = Topics(prefix)
        self.topic_partitions = topic_partitions
        self.replication_factor = replication_factor
        self._created: set[str] = set()
        self._schemas: dict[int, asyncio.Future[None]] = {}

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

    async def ensure_topics(self, topics: Sequence[str], compacted: bool = False) -> None:
        """Create the topics not created or found yet, in one request (one existing is fine)."""
        missing = sorted(set(topics) - self._created)
        if not missing:
            return
        partitions = 1 if compacted else self.topic_partitions
        config = {"cleanup.policy": "compact"} if compacted else {}
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

    async def ensure_schema(self, writer: WriterSchema) -> None:
        """Publish ``writer`` to the schemas topic once and wait for the broker's ack.

        Events are produced only after this returns, so a reader never meets a fingerprint it
        cannot resolve.
        """
        pending = self._schemas.get(writer.fingerprint)
        if pending is None:
            pending = self._schemas[writer.fingerprint] = self.produce_acknowledged(
                self.topics.schemas, writer.fingerprint_hex.encode(), writer.schema_json.encode()
            )
        await asyncio.shield(pending)

    def read_topic(self, topic: str, timeout: float) -> Generator[tuple[int, bytes | None, bytes | None]]:
        """(offset, key, value) of every record now in ``topic``, one at a time (blocking: for
        start-up, before the loop runs work). Call with ``contextlib.closing`` so the consumer is
        closed also when the caller stops early. KafkaSetupError when the broker hands over
        nothing for ``timeout`` seconds."""
        consumer = Consumer(
            {
                **SHORT_FETCH_WAIT,
                **self.client_settings,
                "group.id": f"{self.topics.prefix}.reader",
                "enable.auto.commit": False,
            }
        )
        try:
            with closing(read_to_end(consumer, topic, {}, timeout=timeout)) as messages:
                for _partition, offset, key, value in messages:
                    yield offset, key, value
        except TimeoutError as exc:
            raise KafkaSetupError(f"cannot read {topic}: {exc}") from None
        finally:
            consumer.close()

    # --- producing --------------------------------------------------------------------------

    def produce_acknowledged(self, topic: str, key: bytes, value: bytes) -> asyncio.Future[None]:
        """Produce one message; the future resolves on the broker's acknowledgement."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settle(error: KafkaError | None, _message: Message) -> None:
            if future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(refusal(error))

        self.produce(topic, key, value, settle)
        return future

    def produce(self, topic: str, key: bytes, value: bytes | None, on_delivery: DeliveryCallback) -> None:
        """Queue one message; when the local queue is full, serve delivery reports until it is not."""
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                return
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException as exc:
                raise refusal(exc.args[0]) from None

    def poll(self) -> int:
        """Serve delivery reports now (on the calling thread, which must be the loop's)."""
        served: int = self.producer.poll(0)
        return served

    async def run_poller(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.poll()
            await asyncio.sleep(0.005)

    async def flush(self, timeout: float) -> int:
        """Wait for outstanding messages; returns how many are still undelivered."""
        deadline = time.monotonic() + timeout
        while len(self.producer) and time.monotonic() < deadline:
            self.poll()
            await asyncio.sleep(0.01)
        return len(self.producer)
