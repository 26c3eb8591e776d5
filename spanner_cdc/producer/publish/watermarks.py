"""Publishing the safe low watermark on every partition of every event topic (schemas.watermark).

The service says how far it is safe (every change committed at or before it was read from
Spanner, released and acknowledged by Kafka); this module only puts that value on Kafka, when
it moved, and waits for the broker to acknowledge every copy before the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from spanner_cdc.common.schema_registry import watermark_subject
from spanner_cdc.producer.publish.framing import Framing, SingleObjectFraming
from spanner_cdc.producer.publish.kafka import KafkaClient
from spanner_cdc.schemas.json_events import watermark_document
from spanner_cdc.schemas.watermark import KIND_HEADER, WATERMARK_KIND, WATERMARK_WRITER, Watermark

log = logging.getLogger(__name__)
#: How often the broker's topic list is read again (new topics also trigger a read).
TOPIC_REFRESH_SECONDS = 60.0
FLUSH_SECONDS = 30.0


class WatermarkEmitter:
    """Writes watermark records through a Kafka client of its own.

    Not through the events' client: writing a round means producing and then flushing on a
    worker thread, and a flush serves delivery reports on the thread that calls it, while the
    events' reports must run on the event loop (producer.publish.kafka). Order needs no shared client: a
    watermark is produced only after every event it covers was acknowledged, so it lands at a
    higher offset whichever client writes it.
    """

    def __init__(
        self,
        kafka: KafkaClient,
        stream_name: str,
        framing: Framing | None = None,
        json_events: bool = False,
    ) -> None:
        self.kafka = kafka
        self.stream_name = stream_name
        self.framing: Framing = framing or SingleObjectFraming()
        #: JSON documents, as the events on the same topics (schemas.json_events).
        self.json_events = json_events
        #: Topic → the header in front of its watermark records (producer.publish.framing).
        self._headers: dict[str, bytes] = {}
        self._client = Producer({**kafka.client_settings, "acks": "all", "linger.ms": "5"})
        #: The last watermark every partition acknowledged; None before the first.
        self.published_micros: int | None = None
        self._topics: dict[str, int] = {}
        self._topics_read_at = float("-inf")
        self._schema_published = False

    async def publish(self, safe_micros: int | None) -> bool:
        """Publish ``safe_micros`` if it is ahead of the last published value; True if it was.

        Watermarks only move forward on Kafka: a lower value (a partition restarted from its
        checkpoint) is true but says nothing new, so it is not written.
        """
        last = self.published_micros
        if safe_micros is None or (last is not None and safe_micros <= last):
            return False
        topics = await self._event_topics()
        if not topics:
            return False
        if not self._schema_published:
            await self.kafka.ensure_schema(WATERMARK_WRITER)
            self._schema_published = True
        watermark = Watermark(self.stream_name, safe_micros, topics)
        emitted_at = int(time.time() * 1000)
        if self.json_events:
            values = dict.fromkeys(topics, watermark_document(watermark, emitted_at))
        else:
            values = {topic: watermark.encode(emitted_at, await self._header(topic)) for topic in topics}
        await asyncio.to_thread(self._write, values, topics)
        self.published_micros = safe_micros
        return True

    async def _header(self, topic: str) -> bytes:
        header = self._headers.get(topic)
        if header is None:
            header = self._headers[topic] = await self.framing.header(
                watermark_subject(topic), WATERMARK_WRITER
            )
        return header

    def _write(self, values: dict[str, bytes], topics: dict[str, int]) -> None:
        """One copy per partition, waiting for every acknowledgement (on a worker thread)."""
        failures: list[str] = []

        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                failures.append(error.str())

        for topic, partitions in sorted(topics.items()):
            for partition in range(partitions):
                self._client.produce(
                    topic,
                    value=values[topic],
                    key=None,
                    partition=partition,
                    headers={KIND_HEADER: WATERMARK_KIND},
                    on_delivery=delivered,
                )
        if self._client.flush(FLUSH_SECONDS) or failures:
            raise KafkaException(failures[0] if failures else "watermark records not acknowledged in time")

    async def _event_topics(self) -> dict[str, int]:
        known = self.kafka.created_event_topics()
        stale = time.monotonic() - self._topics_read_at > TOPIC_REFRESH_SECONDS
        if stale or not known <= self._topics.keys():
            self._topics = await self.kafka.event_topics()
            self._topics_read_at = time.monotonic()
        return self._topics


async def publish_periodically(
    emitter: WatermarkEmitter, safe_watermark: Callable[[], Awaitable[int | None]], interval: float
) -> None:
    """The service's background task; a failed round is logged and retried next interval."""
    while True:
        try:
            await emitter.publish(await safe_watermark())
        except Exception as exc:  # the next round tries again; events are unaffected
            log.warning("publishing the watermark failed (%s); retrying in %.1fs", exc, interval)
        await asyncio.sleep(interval)
