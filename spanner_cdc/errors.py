"""The root of every error this project raises on purpose.

Every layer raises subclasses of :class:`SpannerCdcError` for what it means to report, so the
command line catches one class and prints its message as the one line a user sees. Whether a
failure is worth trying again is a property of the error (:class:`RetryableError`), not a list
kept by each caller; ``spanner_cdc.producer.retry`` adds the client libraries' transient errors
in the one place that decides.
"""

from __future__ import annotations

from typing import ClassVar

#: Process exit codes: a usage mistake (bad option or configuration) and any other failure.
EXIT_USAGE = 2
EXIT_FAILURE = 1


class SpannerCdcError(Exception):
    """A failure with a message fit for the user: one line, no traceback."""

    exit_code: ClassVar[int] = EXIT_FAILURE


class RetryableError(SpannerCdcError):
    """A failure that may pass: the work is started again (from its checkpoint) after a backoff."""


class UsageError(SpannerCdcError):
    """The user's options or configuration cannot be used."""

    exit_code: ClassVar[int] = EXIT_USAGE
