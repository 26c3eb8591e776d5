"""One asyncio task per partition this process reads, started as the lineage allows.

A partition starts once the scheduler offers it (``PartitionScheduler.runnable``, or
``resumable`` after a restart or a takeover), never twice, and never while its shard is being
handed back to the group (:attr:`PartitionTasks.leaving`). A task that fails for good stops
the producer with its one line (``on_failure``); ``after_launch`` runs after every round of
starts (the supervisor stops there once everything finished at the end timestamp).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from spanner_cdc.errors import SpannerCdcError
from spanner_cdc.producer.changestream.partition_run import PartitionRunner
from spanner_cdc.producer.errors import ProducerError
from spanner_cdc.producer.lineage.partitions import Partition, PartitionScheduler, PartitionState, shard_of


class PartitionTasks:
    def __init__(
        self,
        scheduler: PartitionScheduler,
        runner: PartitionRunner,
        on_failure: Callable[[SpannerCdcError], None],
        after_launch: Callable[[], None],
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.on_failure = on_failure
        self.after_launch = after_launch
        self.tasks: dict[str, asyncio.Task[None]] = {}
        #: Shards being handed back: nothing of theirs starts, nor is checkpointed but by the
        #: handover, from its first step on (their writers go at its end).
        self.leaving: set[int] = set()

    def launch_resumable(self) -> None:
        """The partitions this process was reading when it stopped or took their shard over."""
        for partition in self.scheduler.resumable():
            self.launch(partition)

    def launch_runnable(self) -> None:
        for partition in self.scheduler.runnable():
            self.launch(partition)
        self.after_launch()

    def launch(self, partition: Partition) -> None:
        leaving = shard_of(partition.token, self.scheduler.shards) in self.leaving
        if partition.token in self.tasks or leaving:
            return
        if partition.state == PartitionState.CREATED:
            partition.state = PartitionState.RUNNING  # claimed: runnable() will not offer it again
        task = asyncio.create_task(
            self.runner.run(partition, self.launch_runnable), name=f"partition {partition.token[:12]}"
        )
        self.tasks[partition.token] = task
        task.add_done_callback(self._done)

    def watch(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task whose failure stops the producer with its one line."""
        task = asyncio.create_task(work)
        task.add_done_callback(self._done)
        return task

    async def stop(self, shards: set[int] | None = None) -> None:
        """Cancel the tasks of ``shards``' partitions (None: all) and wait for them to end."""
        stopping = [
            task
            for token, task in self.tasks.items()
            if shards is None or shard_of(token, self.scheduler.shards) in shards
        ]
        for task in stopping:
            task.cancel()
        await asyncio.gather(*stopping, return_exceptions=True)
        self.tasks = {token: task for token, task in self.tasks.items() if task not in stopping}

    def _done(self, task: asyncio.Task[None]) -> None:
        """A partition's task (or a watched one) ended: a failure stops the producer."""
        if task.cancelled():
            return
        self.tasks = {token: t for token, t in self.tasks.items() if t is not task}
        error = task.exception()
        if error is not None:
            self.on_failure(error if isinstance(error, SpannerCdcError) else ProducerError(repr(error)))
