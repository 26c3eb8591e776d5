"""Commit timestamps as the contract carries them: integer microseconds since the Unix epoch.

Spanner returns TIMESTAMPs as RFC 3339 text (JSON, the PostgreSQL dialect) or as datetimes
(the Python client); Avro carries ``timestamp-micros`` longs; people read RFC 3339. Every
conversion between those forms is here, so the rounding and range rules are the same everywhere.
"""

from __future__ import annotations

import datetime as dt
import re
import time

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_NAIVE_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
MICROS_PER_SECOND = 1_000_000
SECONDS_PER_DAY = 86_400
_TIMESTAMP_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})\Z",
    re.ASCII,  # digits are 0-9 only, as RFC 3339 says
)


#: The canonical form's length: ``2022-09-27T12:30:00.123456Z``, what Spanner sends.
_CANONICAL_LENGTH = 27


def parse_timestamp_micros(text: str) -> int:
    """RFC 3339 text → microseconds since the epoch.

    Spanner TIMESTAMP allows nanoseconds; the contract is timestamp-micros, so a value with a
    non-zero sub-microsecond part is an error rather than a silent truncation.

    The canonical form takes ``datetime.fromisoformat`` (C, about a tenth of the general
    parser's time; every event carries two or more timestamps), once its fixed characters are
    checked: ``fromisoformat`` also reads forms RFC 3339 does not have (week dates, any
    separator), which must not slip through. Whatever it refuses goes to the general parser,
    which says what is wrong.
    """
    if (
        isinstance(text, str)
        and len(text) == _CANONICAL_LENGTH
        and text.isascii()
        and text[4] == text[7] == "-"
        and text[10] in "Tt "
        and text[13] == text[16] == ":"
        and text[19] == "."
        and text[26] == "Z"
    ):
        try:
            return micros_from_datetime(dt.datetime.fromisoformat(text))
        except ValueError:
            pass
    return _parse_rfc3339(text)


def _parse_rfc3339(text: str) -> int:
    match = _TIMESTAMP_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError("not an RFC 3339 timestamp")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    fraction = (fraction or "").ljust(9, "0")
    if fraction[6:] != "000":
        raise ValueError("sub-microsecond precision does not fit timestamp-micros")
    days = dt.date(int(year), int(month), int(day)).toordinal() - _EPOCH_ORDINAL
    if int(hour) > 23 or int(minute) > 59 or int(second) > 59:
        raise ValueError("time of day out of range")
    offset = 0
    if zone not in ("Z", "z"):
        sign = -1 if zone[0] == "-" else 1
        offset = sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    seconds = days * SECONDS_PER_DAY + int(hour) * 3600 + int(minute) * 60 + int(second) - offset
    return seconds * MICROS_PER_SECOND + int(fraction[:6])


def format_timestamp_micros(micros: int) -> str:
    """Microseconds since the epoch → RFC 3339 text with six fractional digits (inverse above).

    ``isoformat`` of a naive UTC datetime: C, pads the year to four digits (strftime's %Y does
    not on every platform), and is about twice as fast as an f-string with strftime — a cost
    every event pays once per timestamp it carries."""
    return (_NAIVE_EPOCH + dt.timedelta(microseconds=micros)).isoformat(timespec="microseconds") + "Z"


def micros_from_datetime(value: dt.datetime) -> int:
    """An aware datetime → microseconds since the epoch, exactly (no float on the way). From the
    difference's normalised parts (days, seconds in a day, microseconds), a third of the time of
    dividing by a one-microsecond timedelta — the consumer's gate does it for every event."""
    since = value - EPOCH
    return (since.days * SECONDS_PER_DAY + since.seconds) * MICROS_PER_SECOND + since.microseconds


def datetime_from_micros(micros: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=micros)


def timestamp_micros(value: dt.datetime | str | int) -> int:
    """A TIMESTAMP in any form a client or the contract hands over → microseconds."""
    if isinstance(value, dt.datetime):
        return micros_from_datetime(value)
    if isinstance(value, int):
        return value
    return parse_timestamp_micros(value)


def days_since_epoch(iso_date: str) -> int:
    """``YYYY-MM-DD`` → Avro ``date`` (days since 1970-01-01)."""
    return dt.date.fromisoformat(iso_date).toordinal() - _EPOCH_ORDINAL


def date_from_days(days: int) -> dt.date:
    return dt.date.fromordinal(days + _EPOCH_ORDINAL)


def now_micros() -> int:
    return time.time_ns() // 1000


def seconds_behind(micros: int) -> float:
    """How far ``micros`` lies behind the wall clock, in seconds (never negative): lag gauges."""
    return max(0.0, time.time() - micros / MICROS_PER_SECOND)


def clock_text(micros: int) -> str:
    """``HH:MM:SS.mmm`` (UTC) of a commit timestamp, for progress lines."""
    return datetime_from_micros(micros).strftime("%H:%M:%S.%f")[:-3]
