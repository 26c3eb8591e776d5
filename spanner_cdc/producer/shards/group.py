"""Membership of the producers' Kafka consumer group: which shards of the checkpoint topic this
process owns (``--group``; docs/scale-out.md).

Kafka's consumer-group protocol decides, not this code: every process of the group subscribes a
consumer (group ``_spanner-cdc.{prefix}.producers.{name}``) to the checkpoint topic, and the
partitions the group assigns it are the shards it owns. A process that stops heartbeating for
the session timeout leaves the group and its shards go to the others. The assignor is
``cooperative-sticky``: a process that joins takes shards from the others without the rest
stopping (an eager assignor revokes every shard of every member at each join, measured).

The consumer is polled on a worker thread, where librdkafka calls the rebalance callbacks;
each is handed to the event loop and waited for, so a revoked shard moves on only after its
owner committed what it wrote for it and its checkpoints (:class:`ShardOwner`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, TopicPartition

from spanner_cdc.common.blocking import loop_on_thread_until
from spanner_cdc.producer.errors import KafkaSetupError
from spanner_cdc.producer.publish.kafka import KafkaClient

log = logging.getLogger(__name__)
#: How long the poll waits; the group's heartbeats run on librdkafka's own thread meanwhile.
POLL_SECONDS = 0.2
#: The longest a shard's handover may take on the event loop before the poll thread gives up.
HANDOVER_SECONDS = 120.0
#: Errors the group's consumer reports that no retry mends: the process stops on them.
_REFUSALS = frozenset({KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED})


class ShardOwner(Protocol):
    """What the process does when the group moves shards (producer.shards.handover)."""

    def take_shards(self, shards: list[int]) -> Coroutine[Any, Any, None]: ...

    def give_back_shards(self, shards: list[int]) -> Coroutine[Any, Any, None]: ...

    def shards_lost(self, shards: list[int]) -> None: ...


class ShardGroup:
    """One process's membership: joins at :meth:`run`, leaves (handing its shards back) at stop."""

    def __init__(self, kafka: KafkaClient, name: str, session_timeout_seconds: float) -> None:
        self.kafka = kafka
        self.name = name
        self.session_ms = int(session_timeout_seconds * 1000)

    async def run(self, owner: ShardOwner, stop: asyncio.Event) -> None:
        """Be a member until ``stop``; then leave, which revokes (and hands back) every shard."""
        loop = asyncio.get_running_loop()
        group_id = self.kafka.topics.group_id(self.name)
        consumer = self.kafka.consumer(
            group_id,
            **{
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": self.session_ms,
                "heartbeat.interval.ms": max(100, self.session_ms // 5),
            },
        )

        def on_loop(
            handover: Callable[[list[int]], Coroutine[Any, Any, None]], partitions: list[TopicPartition]
        ) -> None:
            shards = sorted(p.partition for p in partitions)
            if shards:
                asyncio.run_coroutine_threadsafe(handover(shards), loop).result(HANDOVER_SECONDS)

        def lost(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
            shards = sorted(p.partition for p in partitions)
            if shards:
                loop.call_soon_threadsafe(owner.shards_lost, shards)

        consumer.subscribe(
            [self.kafka.topics.checkpoints],
            on_assign=lambda _c, partitions: on_loop(owner.take_shards, partitions),
            on_revoke=lambda _c, partitions: on_loop(owner.give_back_shards, partitions),
            on_lost=lost,
        )

        def poll() -> None:
            """One poll; its records are the follower's (CheckpointStore.follow): only the
            callbacks and the errors matter. Without the group's ACLs the group never assigns
            a shard, so the process would wait for ever: it stops naming them instead."""
            message = consumer.poll(POLL_SECONDS)
            error = message.error() if message is not None else None
            if error is None:
                return
            if error.fatal() or error.code() in _REFUSALS:
                raise KafkaSetupError(
                    f"the producer group {group_id}: {error.name()} ({error.str()}); its principal needs "
                    f"Describe and Read on the group and on topic {self.kafka.topics.checkpoints} "
                    "(docs/security.md)"
                )
            log.warning("the producer group %s: %s", group_id, error.str())

        log.info("joining the producer group %s (%d shards)", self.name, self.kafka.shards)
        try:
            await loop_on_thread_until(poll, stop)
        finally:
            # Leaving the group revokes every shard, so on_revoke hands each back first: on a
            # thread, as the callbacks wait for the event loop.
            await asyncio.to_thread(consumer.close)
