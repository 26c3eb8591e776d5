"""The producer's checkpoints: one compacted record per partition token on
``_spanner-cdc.{prefix}.checkpoints``.

A record is the partition's lineage and state (``Partition.to_json``): written when a partition
is discovered (before its parent may finish), as its acknowledged position advances, and when it
finishes. A new run restores the newest record of every token. The end of the topic is found
through ``common.kafka_offsets`` (``read_to_end``): the embedded broker under-reports ListOffsets (the
base offset of the last batch + 1), and a reader that trusted it restored older states for the
tokens of the last batch, re-reading finished partitions.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from contextlib import closing

from confluent_kafka import KafkaException

from spanner_cdc.producer.errors import CheckpointError, DeliveryFailedError
from spanner_cdc.producer.kafka import KafkaClient
from spanner_cdc.producer.partitions import Partition


class CheckpointStore:
    def __init__(self, kafka: KafkaClient) -> None:
        self.kafka = kafka
        self.topic = kafka.topics.checkpoints

    async def write(self, partitions: Iterable[Partition]) -> None:
        """Write each partition's state and wait until Kafka acknowledged all of them (their
        transaction committed). Not acknowledged: DeliveryFailedError, which a partition retries
        from its checkpoint; the client failed for good: KafkaClientLostError."""
        await self.kafka.ensure_topic(self.topic, compacted=True)
        futures = [
            self.kafka.produce_acknowledged(
                self.topic, partition.token.encode(), json.dumps(partition.to_json()).encode()
            )
            for partition in partitions
        ]
        try:
            await asyncio.gather(*futures)
        except KafkaException as exc:  # a lost client raised KafkaClientLostError (kafka.refusal)
            raise DeliveryFailedError(f"checkpoints not acknowledged: {exc.args[0].str()}") from None

    def read(self, timeout: float = 30.0) -> list[Partition]:
        """The newest state of every partition token (blocking: call before the loop runs work)."""
        metadata = self.kafka.admin.list_topics(timeout=timeout)
        if self.topic not in metadata.topics:
            return []
        newest: dict[str, Partition] = {}
        with closing(self.kafka.read_topic(self.topic, timeout)) as records:
            for offset, key, value in records:
                if value is not None:
                    partition = self._parse(offset, key, value)
                    newest[partition.token] = partition
        return list(newest.values())

    def _parse(self, offset: int, key: bytes | None, value: bytes) -> Partition:
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
