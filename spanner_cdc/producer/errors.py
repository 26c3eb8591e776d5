"""The producer's errors. Retryable ones restart a partition's query from its checkpoint
(``producer.retry``); the others end the producer with their message as the one line shown."""

from __future__ import annotations

from spanner_cdc.errors import RetryableError, SpannerCdcError


class ProducerError(SpannerCdcError):
    """The producer cannot go on (a partition query failed for good, or a task crashed)."""


class SpannerSetupError(SpannerCdcError):
    """The database or change stream cannot be used."""


class KafkaSetupError(SpannerCdcError):
    """The broker cannot be reached or refuses a topic."""


class KafkaClientLostError(SpannerCdcError):
    """Kafka's client reported a fatal error: it will deliver nothing more, so retrying through
    it would loop. The producer stops; a new run (a new client) resumes from the checkpoints."""


class CheckpointError(SpannerCdcError):
    """The checkpoint topic holds a record that is not a partition's state: the producer cannot
    know where that partition stands, so it does not guess (which could skip changes)."""


class QueryStalledError(RetryableError):
    """No record and no heartbeat for longer than the stall limit."""


class DeliveryFailedError(RetryableError):
    """Kafka did not acknowledge an event of this partition run."""


class QueryEndedEarlyError(RetryableError):
    """A partition query ended normally before the end timestamp without reporting children.

    Spanner ends a partition's query after its child partitions record (or at the end
    timestamp); an end without either would leave the children unknown and never read, so it is
    retried from the checkpoint instead of finishing the partition (Debezium's #2523, Beam's
    #40232).
    """


class ShardNotOwnedError(SpannerCdcError):
    """Something was to be written for a shard of the checkpoint topic this process does not own
    (a ``--group`` handed it to another process): a defect of the handover, never retried."""


class GroupMembershipLostError(SpannerCdcError):
    """This process of a ``--group`` lost its shards without handing them over (its session with
    the consumer group expired: it was paused or cut off for longer than the session timeout).
    Another process has taken them; this one stops rather than write for them."""
