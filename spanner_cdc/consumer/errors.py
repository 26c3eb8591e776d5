"""Errors the ``consume`` command reports as one line (importable without Spark)."""

from __future__ import annotations


class ConsumerError(RuntimeError):
    """Kafka or the replica cannot be used, or the streaming query failed; the message says why."""


class ReplicaConnectionError(ConsumerError):
    """The replica database cannot be reached or opened."""


class BadMessageError(RuntimeError):
    """An undecodable message while the consumer is set to fail on them (``--on-bad-message fail``)."""
