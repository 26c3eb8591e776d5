"""Driving a ``ProducerService`` from a test or a benchmark: run it in the background for a
block, and wait for a condition on its state."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from spanner_cdc.producer.errors import ProducerError
from spanner_cdc.producer.lineage.partitions import Partition
from spanner_cdc.producer.publish.checkpoints import CheckpointStore
from spanner_cdc.producer.publish.kafka import KafkaClient
from spanner_cdc.producer.service import ProducerService


@contextlib.asynccontextmanager
async def running(service: ProducerService) -> AsyncIterator[ProducerService]:
    """Run in the background for the duration of the block, then stop and wait (re-raising the
    service's own failure)."""
    task = asyncio.create_task(service.run())
    try:
        yield service
    finally:
        service.request_stop()
        await task


def checkpointed_partitions(bootstrap: str, prefix: str) -> list[Partition]:
    """The producer's partition table as its checkpoint topic holds it (each token's newest record)."""
    return CheckpointStore(
        KafkaClient(bootstrap, prefix, {}, topic_partitions=1, replication_factor=-1)
    ).read()


async def wait_until(service: ProducerService, condition: Callable[[], bool], timeout: float) -> None:
    """Poll ``condition`` every 0.1 s; ProducerError if the service stopped first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if service.stopped:
            raise ProducerError("producer stopped before the condition was reached")
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.1)
