"""The columns reader (``avro_steps.ColumnsReader``): a message's record straight into Arrow
columns, equal to what Arrow makes of the record reader's record of the same bytes, and refusing
a value its column cannot hold rather than storing another one."""

from __future__ import annotations

import json
import random
from decimal import Context, Decimal
from typing import Any

import pyarrow as pa
import pytest

from spanner_cdc.consumer.decode.change_rows import event_type
from spanner_cdc.consumer.decode.events import gate_type
from spanner_cdc.consumer.decode.gate import parsed_schema
from spanner_cdc.consumer.decode.table_version import TableVersion
from spanner_cdc.schemas.avro_steps import ColumnsReader
from spanner_cdc.schemas.events import EventBuilder
from spanner_cdc.schemas.table import PAYLOAD_TYPE_NAME
from spanner_cdc.schemas.wire import HEADER_LENGTH, WriterSchema, encode
from testkit.records import STREAM_NAME
from tests.unit.schemas.test_avro_reader import typed
from tests.unit.schemas.test_avro_writer import GOOGLE_SQL, POSTGRESQL, RECORDS, _record

pytestmark = pytest.mark.unit
#: Two fields of an event: a reader of them passes over every other.
NARROW = pa.struct([("uuid", pa.string()), ("object", pa.string())])


def events_by_writer(dialect: tuple[str, ...]) -> list[tuple[WriterSchema, list[bytes]]]:
    """Encoded events of generated records of every column type, by writer schema."""
    rng = random.Random(20261129)
    builder = EventBuilder(STREAM_NAME, "bank")
    found: dict[str, tuple[WriterSchema, list[bytes]]] = {}
    for index in range(RECORDS):
        for event in builder.build(_record(rng, index, dialect), "token-1", rng.randint(0, 2**41)):
            writer = parsed_schema(json.dumps(event.table.event_schema))
            found.setdefault(writer.schema_json, (writer, []))[1].append(encode(writer, event.value))
    return list(found.values())


def read_both(writer: WriterSchema, messages: list[bytes]) -> tuple[pa.StructArray, pa.StructArray]:
    """The messages read by the columns reader, and the record reader's records of them converted by Arrow."""
    records = [writer.column_reader(message, HEADER_LENGTH)[0] for message in messages]
    version = TableVersion.from_writer(writer, records[0]["source_metadata"]["primary_keys"])
    arrow_type = event_type(pa.struct([(c.field, c.type.arrow) for c in version.columns]))
    columns = ColumnsReader(writer.column_reader, arrow_type)(messages, [HEADER_LENGTH] * len(messages))
    return columns, pa.array(records, type=arrow_type)


@pytest.mark.parametrize("dialect", [GOOGLE_SQL, POSTGRESQL], ids=["googlesql", "postgresql"])
def test_every_column_type_reads_as_arrow_converts_the_gate_s_records(dialect: tuple[str, ...]) -> None:
    """Every column type (arrays with null elements, NaN, ±Infinity, NUMERIC 38/9, DATE,
    TIMESTAMP, odd text), every capture and mod type: the same type, the same values and nulls
    (old values absent, columns null), valid Arrow."""
    found = events_by_writer(dialect)
    for writer, messages in found:
        columns, converted = read_both(writer, messages)
        columns.validate(full=True)
        assert columns.type == converted.type
        assert typed(columns.to_pylist()) == typed(converted.to_pylist())
    assert sum(len(messages) for _, messages in found) > RECORDS


def one_column_event(avro_type: Any, value: Any) -> tuple[WriterSchema, bytes]:
    """An event like the generated ones whose payload is one column ``c`` of ``avro_type``,
    holding ``value`` (in its Avro primitive form): its writer schema and its bytes."""
    writer, [message, *_] = events_by_writer(("INT64",))[0]
    schema = json.loads(writer.schema_json)
    payload_record(schema)["fields"] = [{"name": "c", "type": ["null", avro_type]}]
    record = writer.column_reader(message, HEADER_LENGTH)[0]
    record["payload"] = {"c": value}
    record["source_metadata"]["old_values"] = None
    one_column = WriterSchema.from_schema(schema)
    return one_column, encode(one_column, record)


def payload_record(schema: Any) -> Any:
    """The payload record's definition, wherever the schema gives it (first use defines it)."""
    if isinstance(schema, list):
        return next(filter(None, map(payload_record, schema)), None)
    if not isinstance(schema, dict):
        return None
    if schema.get("type") == "record" and schema["name"] == PAYLOAD_TYPE_NAME:
        return schema
    inner = [field["type"] for field in schema.get("fields", [])]
    return payload_record(inner) if inner else None


def columns_of(writer: WriterSchema, arrow_type: pa.DataType, messages: list[bytes]) -> pa.StructArray:
    return ColumnsReader(writer.column_reader, event_type(pa.struct([("c", arrow_type)])))(
        messages, [HEADER_LENGTH] * len(messages)
    )


#: Decimal arithmetic that rounds none of the values below.
EXACT = Context(prec=50)
NUMERIC = {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 9}


@pytest.mark.parametrize(
    ("unscaled", "fits"),
    [(10**38 - 1, True), (-(10**38) + 1, True), (0, True), (-1, True), (10**38, False), (-(10**38), False),
     (2**127 - 1, False), (-(2**127), False), (2**130, False)],
)  # fmt: skip
def test_a_decimal_of_38_digits_or_fewer_is_read_and_a_longer_one_refused(unscaled: int, fits: bool) -> None:
    """Arrow's decimal128(38, 9) holds at most 38 digits; the reader refuses more (OverflowError),
    as Arrow refuses the ``Decimal`` the gate makes of such bytes, instead of wrapping around."""
    writer, message = one_column_event(
        NUMERIC, unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)
    )
    if not fits:
        with pytest.raises(OverflowError):
            columns_of(writer, pa.decimal128(38, 9), [message])
        with pytest.raises(pa.ArrowInvalid):
            pa.array([Decimal(unscaled).scaleb(-9, EXACT)], pa.decimal128(38, 9))
        return
    read = columns_of(writer, pa.decimal128(38, 9), [message]).field("payload").field("c")
    assert read.to_pylist() == [Decimal(unscaled).scaleb(-9, EXACT)]


def test_a_long_beyond_a_32_bit_column_is_refused() -> None:
    writer, fits = one_column_event("int", 2**31 - 1)
    _, too_large = one_column_event("long", -(2**31) - 1)  # the same bytes as an int: a varint
    assert columns_of(writer, pa.int32(), [fits]).field("payload").field("c").to_pylist() == [2**31 - 1]
    with pytest.raises(OverflowError):
        columns_of(writer, pa.int32(), [fits, too_large])


@pytest.mark.parametrize(
    ("avro_type", "arrow_type"),
    [({"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 2}, pa.decimal128(38, 9)),
     ("long", pa.string()), ("bytes", pa.string()), ({"type": "array", "items": "long"}, pa.int64())],
)  # fmt: skip
def test_a_type_the_values_do_not_make_is_refused_when_the_reader_is_made(
    avro_type: Any, arrow_type: pa.DataType
) -> None:
    with pytest.raises(TypeError):
        columns_of(one_column_event(avro_type, None)[0], arrow_type, [])


def test_a_message_that_does_not_end_with_its_record_is_refused() -> None:
    writer, message = one_column_event("long", 7)
    with pytest.raises(ValueError, match="1 bytes left"):
        columns_of(writer, pa.int64(), [message + b"\x00"])
    with pytest.raises(EOFError):
        columns_of(writer, pa.int64(), [message[:-1]])


def test_the_error_for_a_message_says_which_message_it_was() -> None:
    writer, message = one_column_event("long", 7)
    with pytest.raises(EOFError) as raised:
        columns_of(writer, pa.int64(), [message, message, message[:-1], message])
    assert getattr(raised.value, "message_index", None) == 2


def test_a_text_column_reads_as_the_bytes_a_batch_merged_it_into() -> None:
    """A column Spanner changed from STRING to BYTES is BYTES in a batch that has both
    (table_version.merged): the text's UTF-8, as Arrow makes of the gate's string."""
    writer, message = one_column_event("string", "ünï 日本")
    read = columns_of(writer, pa.binary(), [message]).field("payload").field("c")
    assert read.equals(pa.array(["ünï 日本"], pa.binary()))


@pytest.mark.parametrize("dialect", [GOOGLE_SQL, POSTGRESQL], ids=["googlesql", "postgresql"])
def test_a_message_the_record_reader_refuses_is_refused_also_where_its_fields_are_passed_over(
    dialect: tuple[str, ...],
) -> None:
    """Messages of every column type with bytes changed at random: the columns reader fails on
    exactly those the record reader fails on, reading two fields only (the rest passed over),
    what the gate reads, and what the sinks take (the sort keys passed over) — invalid
    UTF-8, a time out of the years 1-9999, a union branch that does not exist, bytes left over
    (consumer.decode.events reads every event with it)."""
    rng = random.Random(11)
    refused = 0
    for writer, messages in events_by_writer(dialect):
        version = TableVersion.from_writer(
            writer, writer.column_reader(messages[0], HEADER_LENGTH)[0]["source_metadata"]["primary_keys"]
        )
        full = ColumnsReader(
            writer.column_reader, event_type(pa.struct([(c.field, c.type.arrow) for c in version.columns]))
        )
        gate = ColumnsReader(writer.column_reader, gate_type(writer))
        narrow = ColumnsReader(writer.column_reader, NARROW)
        for message in messages[:150]:
            spoilt = bytearray(message)
            for _ in range(rng.randint(1, 3)):
                spoilt[rng.randrange(HEADER_LENGTH, len(spoilt))] = rng.randrange(256)
            try:
                _, end = writer.column_reader(bytes(spoilt), HEADER_LENGTH)
                fails = end != len(spoilt)
            except (EOFError, ValueError, ArithmeticError):
                fails = True
            refused += fails
            for reader, may_overflow in ((narrow, False), (gate, True), (full, True)):
                try:
                    reader([bytes(spoilt)], [HEADER_LENGTH])
                    assert not fails, "read what the record reader refuses"
                except OverflowError:
                    assert may_overflow or fails
                except (EOFError, ValueError):
                    assert fails, "refused what the record reader reads"
    assert refused > 100
