"""The compiled Avro reader (``schemas.avro_reader``) reads what fastavro reads, value for value,
and fails where fastavro fails, the same way (``truncated`` or ``corrupt``)."""

from __future__ import annotations

import io
import json
import math
import random
from typing import Any

import fastavro
import pytest

from spanner_cdc.consumer.decode.gate import parsed_schema
from spanner_cdc.schemas.avro_reader import compile_reader
from spanner_cdc.schemas.errors import ContractError, DecodeError
from spanner_cdc.schemas.events import EventBuilder
from spanner_cdc.schemas.watermark import WATERMARK_WRITER, Watermark
from spanner_cdc.schemas.wire import HEADER_LENGTH, WriterSchema, encode, read_body, without_logical_types
from testkit.records import STREAM_NAME
from tests.unit.schemas.test_avro_writer import GOOGLE_SQL, POSTGRESQL, RECORDS, _record

pytestmark = pytest.mark.unit
#: The logical types the column reader reads as the number written (and uuid, which no reader of
#: this project turns into ``UUID``).
_NUMBERS = ("timestamp-micros", "timestamp-millis", "date", "uuid")


def typed(value: Any) -> Any:
    """``value`` with every leaf tagged by its type (``True == 1`` in Python) and NaN made
    comparable (``nan != nan``), so ``==`` says the two readers made the same values."""
    if isinstance(value, dict):
        return {name: typed(item) for name, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    if isinstance(value, float) and math.isnan(value):
        return ("float", "NaN")
    return (type(value).__name__, value)


def fastavro_read(writer: WriterSchema, message: bytes) -> tuple[Any, int]:
    body = io.BytesIO(message)
    body.seek(HEADER_LENGTH)
    return fastavro.schemaless_reader(body, writer.reading, None), body.tell()


def messages(dialect: tuple[str, ...], records: int) -> list[tuple[WriterSchema, bytes]]:
    """Events and keys of generated records of every column type, encoded."""
    rng = random.Random(20261126)
    builder = EventBuilder(STREAM_NAME, "bank")
    found = []
    for index in range(records):
        for event in builder.build(_record(rng, index, dialect), "token-1", rng.randint(0, 2**41)):
            for schema, value in (
                (event.table.event_schema, event.value),
                (event.table.key_schema, event.key),
            ):
                writer = parsed_schema(json.dumps(schema))
                found.append((writer, encode(writer, value)))
    return found


@pytest.mark.parametrize("dialect", [GOOGLE_SQL, POSTGRESQL], ids=["googlesql", "postgresql"])
def test_generated_events_decode_exactly_as_fastavro_does(dialect: tuple[str, ...]) -> None:
    """Every column type (arrays with null elements, NaN, ±Infinity, NUMERIC 38/9 as Decimal,
    DATE, TIMESTAMP as datetime, odd names), every capture and mod type, keys too."""
    found = messages(dialect, RECORDS)
    for writer, message in found:
        value, end = writer.reader(message, HEADER_LENGTH)
        expected, expected_end = fastavro_read(writer, message)
        assert (typed(value), end) == (typed(expected), expected_end)
    assert len(found) > RECORDS * 2


@pytest.mark.parametrize("dialect", [GOOGLE_SQL, POSTGRESQL], ids=["googlesql", "postgresql"])
def test_the_column_reader_reads_dates_and_timestamps_as_the_numbers_written(
    dialect: tuple[str, ...],
) -> None:
    """The consumer's reader: every value as fastavro reads it, but each timestamp and date as
    fastavro reads the same bytes without the logical type — the number written."""
    numbers_seen = 0
    for writer, message in messages(dialect, RECORDS):
        value, end = writer.column_reader(message, HEADER_LENGTH)
        body = io.BytesIO(message)
        body.seek(HEADER_LENGTH)
        expected = fastavro.schemaless_reader(
            body, fastavro.parse_schema(without_logical_types(json.loads(writer.schema_json), _NUMBERS)), None
        )
        assert (typed(value), end) == (typed(expected), body.tell())
        numbers_seen += isinstance(value.get("read_timestamp"), int)
    assert numbers_seen > RECORDS


def test_a_watermark_decodes_as_fastavro_does() -> None:
    message = Watermark(STREAM_NAME, 1_795_000_000_000_001, {"a": 3, "b": 1}).encode(1_795_000_000_123)
    assert WATERMARK_WRITER.reader(message, HEADER_LENGTH) == fastavro_read(WATERMARK_WRITER, message)


def test_every_cut_short_message_is_truncated() -> None:
    """fastavro fails on each too (with EOFError, or IndexError where a string is cut short,
    which the quarantine used to call corrupt); the compiled reader says truncated every time."""
    for writer, message in messages(GOOGLE_SQL, 3):
        for cut in range(HEADER_LENGTH, len(message)):
            with pytest.raises((EOFError, IndexError)):
                fastavro_read(writer, message[:cut])
            with pytest.raises(DecodeError) as refused:
                read_body(writer, message[:cut], HEADER_LENGTH)
            assert refused.value.reason == "truncated"


def test_damaged_messages_never_decode_to_something_fastavro_does_not() -> None:
    """Random bytes changed: what the compiled reader accepts, fastavro reads to the same values;
    what it refuses is quarantined as truncated or corrupt, never an exception of another kind.
    (Where fastavro is lenient with garbage — a negative union index counted from the end, an
    over-long varint — the compiled reader refuses: the module docstring.)"""
    rng = random.Random(7)
    accepted = refused = 0
    for writer, message in messages(POSTGRESQL, 40):
        for _ in range(5):
            damaged = bytearray(message)
            for _ in range(rng.randint(1, 3)):
                damaged[rng.randrange(HEADER_LENGTH, len(damaged))] = rng.randrange(256)
            try:
                value = read_body(writer, bytes(damaged), HEADER_LENGTH)
            except DecodeError as exc:
                assert exc.reason in ("truncated", "corrupt")
                refused += 1
                continue
            expected, end = fastavro_read(writer, bytes(damaged))
            assert (typed(value), end) == (typed(expected), len(damaged))
            accepted += 1
    assert accepted > 0 and refused > 0


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x80" * 11, "corrupt"),  # a varint of eleven bytes
        (b"\x03", "corrupt"),  # a negative string length
        (b"\x02\xff", "corrupt"),  # not UTF-8
        (b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f", "truncated"),  # 2**62 bytes announced
        (b"\xfe" + b"\xff" * 8 + b"\x03", "corrupt"),  # a length of more than 64 bits
    ],
)
def test_impossible_bodies_are_refused_with_their_reason(body: bytes, reason: str) -> None:
    writer = WriterSchema.from_schema(
        {"type": "record", "name": "r", "fields": [{"name": "s", "type": "string"}]}
    )
    with pytest.raises(DecodeError) as refused:
        read_body(writer, writer.header + body, HEADER_LENGTH)
    assert refused.value.reason == reason


def test_a_long_is_64_bits_and_no_more() -> None:
    """A ten-byte varint's last byte holds the 64th bit: the largest and smallest longs read as
    fastavro reads them; more bits are refused (fastavro drops them; the reader before the C steps
    made an int that no Arrow int64 column takes, which failed the task instead of quarantining)."""
    schema = fastavro.parse_schema({"type": "record", "name": "r", "fields": [{"name": "n", "type": "long"}]})
    read = compile_reader(schema)
    for body, number in ((b"\xfe" + b"\xff" * 8 + b"\x01", 2**63 - 1), (b"\xff" * 9 + b"\x01", -(2**63))):
        assert (
            read(body, 0)
            == ({"n": number}, 10)
            == (fastavro.schemaless_reader(io.BytesIO(body), schema, None), 10)
        )
    with pytest.raises(ValueError, match="more than 64 bits"):
        read(b"\xfe" + b"\xff" * 8 + b"\x03", 0)


@pytest.mark.parametrize("calendar_numbers", [False, True], ids=["values", "numbers"])
@pytest.mark.parametrize(
    ("avro_type", "logical_type", "first", "last"),
    [
        ("long", "timestamp-micros", -62_135_596_800_000_000, 253_402_300_799_999_999),
        ("long", "timestamp-millis", -62_135_596_800_000, 253_402_300_799_999),
        ("int", "date", -719_162, 2_932_896),
    ],
)
def test_dates_and_timestamps_are_fastavro_s_in_range_and_out_of_it(
    avro_type: str, logical_type: str, first: int, last: int, calendar_numbers: bool
) -> None:
    """The C steps make timestamps and dates themselves (years 1-9999, the range of Python's
    datetime) and leave every other value to fastavro's converter: the values, their types and
    time zone, and the errors word for word are fastavro's, at the edges and around them. With
    ``calendar_numbers`` a value fastavro reads is the number written; what it refuses, the
    column reader refuses in the same words."""
    schema = fastavro.parse_schema(
        {
            "type": "record",
            "name": "r",
            "fields": [{"name": "t", "type": {"type": avro_type, "logicalType": logical_type}}],
        }
    )
    plain = fastavro.parse_schema({"type": "record", "name": "r", "fields": [{"name": "t", "type": "long"}]})
    read = compile_reader(schema, calendar_numbers=calendar_numbers)
    rng = random.Random(7)
    numbers = [first, first - 1, last, last + 1, 0, -1, 1, 2**63 - 1, -(2**63)]
    numbers += [rng.randint(first, last) for _ in range(2_000)] + [
        rng.randint(-(2**63), 2**63 - 1) for _ in range(200)
    ]
    for number in numbers:
        written = io.BytesIO()
        fastavro.schemaless_writer(written, plain, {"t": number})
        body = written.getvalue()
        ours = _verdict(lambda body=body: read(body, 0)[0])
        theirs = _verdict(lambda body=body: fastavro.schemaless_reader(io.BytesIO(body), schema, None))
        if calendar_numbers and len(theirs) == 3:
            theirs = ({"t": number}, int, None)
        assert ours == theirs, number


def _verdict(decode: Any) -> tuple[Any, ...]:
    try:
        record = decode()
    except (ValueError, OverflowError) as exc:
        return type(exc), str(exc)
    return record, type(record["t"]), getattr(record["t"], "tzinfo", None)


def test_a_huge_item_count_ends_at_the_end_of_the_message() -> None:
    """An array announcing 2**62 items of a type that takes at least a byte each (schema_check
    allows no other) ends where the bytes end, at once."""
    writer = WriterSchema.from_schema(
        {"type": "record", "name": "r", "fields": [{"name": "a", "type": {"type": "array", "items": "long"}}]}
    )
    with pytest.raises(DecodeError) as refused:
        read_body(
            writer, writer.header + b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f" + b"\x02" * 20, HEADER_LENGTH
        )
    assert refused.value.reason == "truncated"


def test_types_the_contract_never_writes_are_refused_when_compiled() -> None:
    for kind in ({"type": "enum", "name": "e", "symbols": ["A"]}, {"type": "fixed", "name": "f", "size": 2}):
        schema = fastavro.parse_schema(
            {"type": "record", "name": "r", "fields": [{"name": "x", "type": kind}]}
        )
        with pytest.raises(ContractError):
            compile_reader(schema)
