"""Errors the ``consume`` command reports as one line (importable without Spark)."""

from __future__ import annotations

from spanner_cdc.errors import SpannerCdcError


class ConsumerError(SpannerCdcError):
    """Kafka or the replica cannot be used, or the streaming query failed; the message says why."""


class ReplicaConnectionError(ConsumerError):
    """The replica database cannot be reached or opened."""


class BadMessageError(SpannerCdcError):
    """An undecodable message while the consumer is set to fail on them (``--on-bad-message fail``)."""


class ReplicaConflictError(ConsumerError):
    """Another transaction changed the same rows first (a stream consumed twice at once)."""


class ReplicaQueryError(ConsumerError):
    """The replica database refused a statement (a constraint, a type, a missing table)."""


class ChangelogShortfallError(ConsumerError):
    """The changelog's tasks wrote other row counts than the batch kept: the batch is not
    committed (its next attempt writes it again) rather than committed with changes missing."""
