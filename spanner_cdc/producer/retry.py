"""The producer's one retry rule: which failures restart a partition's query, and how soon.

A failure is retried when it says so (:class:`spanner_cdc.errors.RetryableError`: a stalled
query, a failed delivery, a query that ended without children) or when it is one of the Spanner
client's transient gRPC errors. Anything else ends the producer with one line. Retries restart
from the partition's checkpoint, so a retry can repeat events (same uuid) but never skip any.
"""

from __future__ import annotations

from google.api_core import exceptions as google_exceptions

from spanner_cdc.errors import RetryableError

#: gRPC failures of the Spanner client that pass on their own.
TRANSIENT_SPANNER_ERRORS: tuple[type[Exception], ...] = (
    google_exceptions.ServiceUnavailable,
    google_exceptions.Aborted,
    google_exceptions.DeadlineExceeded,
    google_exceptions.ResourceExhausted,
    google_exceptions.InternalServerError,
)
MAX_BACKOFF_SECONDS = 30.0


def is_retryable(error: BaseException) -> bool:
    return isinstance(error, (RetryableError, *TRANSIENT_SPANNER_ERRORS))


def backoff_seconds(attempt: int) -> float:
    """1 s, 2 s, 4 s, … up to 30 s for the ``attempt``-th retry (1-based)."""
    return min(MAX_BACKOFF_SECONDS, 0.5 * float(2 ** min(attempt, 6)))
