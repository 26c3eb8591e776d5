"""The checkpoints a shard's transaction carries as it commits: exactly-once onto Kafka.

Every message of a shard goes through its one transactional writer (producer.publish.transactions).
When the writer is about to commit, every message of the open transaction is staged — the
broker has it, the commit will make it visible — and this module adds to the transaction the
checkpoint records of the shard's running partitions as they will stand once it commits
(``AckTracker.checkpoint_if_committed``: staged events counted as acknowledged; held and unsent
ones still bound it). Events and the checkpoint that covers them become visible together, or —
an abort, a SIGKILL — neither does. A restart resumes each partition just after its committed
checkpoint (``Partition.resume_micros``), so a ``read_committed`` reader sees no change twice.

A partition's checkpoint in memory moves only once the record is delivered, that is once the
transaction committed: a commit that fails leaves it where the committed record says. These are
a running partition's only records, made in commit order, so the newest on Kafka is the highest
(``CheckpointStore.due`` asks for one that did not advance; a failed run's bounded by its failed
event, which stays pending).
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError, Message

from spanner_cdc.producer.changestream.partition_run import PartitionRunner
from spanner_cdc.producer.changestream.release import CommitOrderRelease
from spanner_cdc.producer.lineage.low_watermark import advanced_checkpoint
from spanner_cdc.producer.lineage.partitions import Partition, PartitionScheduler, PartitionState, shard_of
from spanner_cdc.producer.publish.checkpoints import CheckpointStore
from spanner_cdc.producer.publish.transactions import ClosingRecord, DeliveryCallback


@dataclass(frozen=True)
class TransactionCheckpoints:
    """``KafkaClient.close_transactions_with``'s function: a shard's closing checkpoint records."""

    scheduler: PartitionScheduler
    runner: PartitionRunner
    release: CommitOrderRelease
    checkpoints: CheckpointStore

    def __call__(self, shard: int) -> list[ClosingRecord]:
        records = []
        for token, run in list(self.runner.runs.items()):
            partition = self.scheduler.partitions.get(token)
            if partition is None or partition.state != PartitionState.RUNNING:
                continue
            if not self.scheduler.mine(token) or shard_of(token, self.scheduler.shards) != shard:
                continue
            if run.finish_staged:
                continue  # its FINISHED record is in this transaction or in one before
            due = token in self.checkpoints.due
            if not due and (run.tracker.failed is not None or run.tracker.fatal is not None):
                continue  # the run restarts from the committed checkpoint
            advanced = advanced_checkpoint(
                partition, run.tracker, self.release.oldest(run.tracker), if_committed=True
            )
            if advanced <= partition.checkpoint_micros and not due:
                continue
            self.checkpoints.not_due(token)
            topic, key, value, topic_partition = self.checkpoints.record(partition, advanced)
            records.append(ClosingRecord(topic, key, value, topic_partition, _moved(partition, advanced)))
        return records


def _moved(partition: Partition, checkpoint_micros: int) -> DeliveryCallback:
    """Once the transaction committed, the partition's checkpoint in memory is the record's."""

    def delivered(error: KafkaError | None, _message: Message | None) -> None:
        if error is None:
            partition.checkpoint_micros = max(partition.checkpoint_micros, checkpoint_micros)

    return delivered
