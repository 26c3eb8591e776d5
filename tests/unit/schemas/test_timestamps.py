"""RFC 3339 text → microseconds: the canonical form's fast path agrees with the general parser,
and both refuse what RFC 3339 does not allow; a datetime → its microseconds, exactly."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from spanner_cdc.schemas.timestamps import (
    EPOCH,
    datetime_from_micros,
    format_timestamp_micros,
    micros_from_datetime,
    parse_timestamp_micros,
)

pytestmark = pytest.mark.unit
FIRST = parse_timestamp_micros("0001-01-01T00:00:00Z")
LAST = parse_timestamp_micros("9999-12-31T23:59:59.999999Z")


def test_canonical_text_round_trips_over_the_whole_range() -> None:
    rng = random.Random(7)
    for micros in [FIRST, LAST, 0, -1, 1, *(rng.randint(FIRST, LAST) for _ in range(5_000))]:
        text = format_timestamp_micros(micros)
        assert len(text) == 27
        assert parse_timestamp_micros(text) == micros, text
        assert parse_timestamp_micros(text.replace("T", " ")) == micros


def test_a_datetime_is_its_microseconds_exactly_over_the_whole_range() -> None:
    """Before the epoch too (a negative difference's days are negative, its seconds are not),
    and in another time zone."""
    rng = random.Random(11)
    ahead = dt.timezone(dt.timedelta(hours=5, minutes=30))
    for micros in [FIRST, LAST, 0, -1, 1, *(rng.randint(FIRST, LAST) for _ in range(5_000))]:
        value = datetime_from_micros(micros)
        assert micros_from_datetime(value) == micros == (value - EPOCH) // dt.timedelta(microseconds=1)
        if FIRST + 6 * 3_600_000_000 < micros < LAST - 6 * 3_600_000_000:
            assert micros_from_datetime(value.astimezone(ahead)) == micros


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("2022-09-27T12:30:00.123456Z", 1_664_281_800_123_456),
        ("2022-09-27t12:30:00.123456z", 1_664_281_800_123_456),
        ("2022-09-27T14:30:00.123456+02:00", 1_664_281_800_123_456),
        ("2022-09-27T12:30:00.123456000Z", 1_664_281_800_123_456),
        ("2022-09-27T12:30:00.1Z", 1_664_281_800_100_000),
        ("2022-09-27T12:30:00Z", 1_664_281_800_000_000),
    ],
)
def test_other_rfc3339_forms(text: str, micros: int) -> None:
    assert parse_timestamp_micros(text) == micros


@pytest.mark.parametrize(
    "text",
    [
        "2022-09-27X12:30:00.123456Z",  # fromisoformat takes any separator
        "2022-W39-2T12:30:00.12345Z",  # and week dates
        "2022-09-27T24:00:00.000000Z",
        "2022-09-27T23:59:60.000000Z",
        "2022-02-30T00:00:00.000000Z",
        "2022-09-27T12:30:00.12345aZ",
        "2022-09-27T12:30:00.\uff11\uff12\uff13\uff14\uff15\uff16Z",  # fullwidth digits: not ASCII ones
        "2022-09-27T12:30:00.123456789Z",
        "2022-09-27T12:30:00.123456",
    ],
)
def test_malformed_text_is_refused_by_both_paths(text: str) -> None:
    with pytest.raises(ValueError):
        parse_timestamp_micros(text)
