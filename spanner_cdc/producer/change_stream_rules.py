"""What Spanner accepts in a change-stream query (dialects, stream names, heartbeat intervals),
and which change streams the producer can read.

Kept apart from the query itself (``producer.spanner.query``, which needs the Spanner client's types) so
that option parsing can check these without the client library installed.
"""

from __future__ import annotations

import re

from spanner_cdc.producer.errors import SpannerSetupError

GOOGLE_STANDARD_SQL = "GOOGLE_STANDARD_SQL"
POSTGRESQL = "POSTGRESQL"
#: The stream name is spliced into SQL (a table-valued function name cannot be a parameter),
#: so only a plain identifier is accepted.
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
#: Spanner's documentation names 1 s as the shortest heartbeat interval, but Beam's low-latency
#: change-stream reader asks for 100 ms and the emulator answers it; a heartbeat interval is what
#: commit → ack waits for (docs/producer.md, Performance), so the shorter ones are allowed.
MIN_HEARTBEAT_MS, MAX_HEARTBEAT_MS = 100, 300_000


def validate_stream_name(name: str) -> str:
    """``name`` if it is a plain identifier; ValueError (an option error) otherwise."""
    if not IDENTIFIER.match(name):
        raise ValueError(
            f"change stream name {name!r} is not a valid identifier (letters, digits, underscore; "
            "not starting with a digit; at most 128 characters)"
        )
    return name


def refuse_partition_mode(stream: str, mode: str | None) -> None:
    """Streams created with ``partition_mode = 'MUTABLE_KEY_RANGE'`` move key ranges between
    partitions with records (partition start, end and event records) whose ordering rules the
    producer does not implement; reading them as usual could reorder or lose changes, so such a
    stream is refused at start."""
    if mode is not None and mode.strip("'\"").upper() == "MUTABLE_KEY_RANGE":
        raise SpannerSetupError(
            f"change stream {stream!r} has partition_mode = 'MUTABLE_KEY_RANGE', which the producer "
            "does not read; create a stream with partition_mode = 'IMMUTABLE_KEY_RANGE' "
            "(or without the option)"
        )
