"""What Spanner accepts in a change-stream query: dialects, stream names, heartbeat intervals.

Kept apart from the query itself (``producer.query``, which needs the Spanner client's types) so
that option parsing can check these without the client library installed.
"""

from __future__ import annotations

import re

GOOGLE_STANDARD_SQL = "GOOGLE_STANDARD_SQL"
POSTGRESQL = "POSTGRESQL"
#: The stream name is spliced into SQL (a table-valued function name cannot be a parameter),
#: so only a plain identifier is accepted.
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
MIN_HEARTBEAT_MS, MAX_HEARTBEAT_MS = 1_000, 300_000


def validate_stream_name(name: str) -> str:
    """``name`` if it is a plain identifier; ValueError (an option error) otherwise."""
    if not IDENTIFIER.match(name):
        raise ValueError(
            f"change stream name {name!r} is not a valid identifier (letters, digits, underscore; "
            "not starting with a digit; at most 128 characters)"
        )
    return name
