# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled Avro reader's steps, in C: one :class:`Step` per node of a writer schema.

``schemas.avro_reader`` turns a parsed writer schema into a tree of steps once per schema and
process; :class:`CompiledReader` then walks that tree over each message's bytes. Reading the
bytes by position (varints, lengths, UTF-8, floats) is what the consumer's tasks spent most of
their decoding time on in the generated-Python reader this replaces; in C it takes a quarter of
that time (docs/consumer.md, Performance, run 14). The records are fastavro's, value for value,
and the errors the generated reader's, message for message (``tests/unit/test_avro_reader.py``):

- the message ends early: ``EOFError`` (a string or bytes announcing more than is left says how
  much);
- it says something impossible: ``ValueError`` (a varint longer than ten bytes, a negative
  length, a union branch that does not exist) or ``UnicodeDecodeError``;
- a logical type's converter (fastavro's own) raises what it raises.

Timestamps (``timestamp-micros``, ``timestamp-millis``) and dates are made here, in C, as
fastavro's converters make them (``datetime`` in UTC, ``date``): those converters cost some
0.7 µs a value, and every event carries three timestamps. A step made ``as_number`` keeps the
number the bytes hold instead (micros, millis or days since the epoch), which is what an Arrow
column of the type stores: the consumer's tasks convert every event's timestamps to Arrow, and
a ``datetime`` costs 0.32 µs a value there against 0.03 for an int (docs/consumer.md, run 20).
Either way, a value outside the years 1-9999 is handed to fastavro's converter, so that its
error is fastavro's, word for word.

A varint is a 64-bit number: one of ten bytes whose last holds more than the 64th bit is refused
(``ValueError``), where fastavro drops the extra bits and the generated reader made a larger int,
which no Arrow column takes.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.datetime cimport date_new, datetime_new, import_datetime
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_DecodeUTF8, PyUnicode_GET_LENGTH
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy


cdef extern from "Python.h":
    # A dict with room for its keys from the start: a record's fields never make it grow.
    dict _PyDict_NewPresized(Py_ssize_t minused)
    bint PyUnicode_IS_COMPACT_ASCII(object o)

from datetime import timezone

import_datetime()


cpdef enum Kind:
    NULL_VALUE  # Avro null
    BOOLEAN
    LONG  # int and long: the same varint
    FLOAT
    DOUBLE
    STRING
    BYTES
    RECORD
    NULLABLE  # ["null", X]: one byte, 0 or 2
    UNION
    ARRAY
    MAP
    UTC_MICROS  # long timestamp-micros: a datetime in UTC
    UTC_MILLIS  # long timestamp-millis
    DAYS  # int date: days since 1970-01-01


cdef enum:
    LONGEST_VARINT = 10  # bytes of a 64-bit zig-zag varint

cdef int64_t MICROS_PER_DAY = 86_400_000_000
cdef int64_t FIRST_DAY = -719_162  # 0001-01-01, in days since 1970-01-01: Python's first date
cdef int64_t LAST_DAY = 2_932_896  # 9999-12-31: its last
cdef int64_t FIRST_MICRO = FIRST_DAY * MICROS_PER_DAY  # its first microsecond (a whole millisecond)
cdef int64_t LAST_MICRO = (LAST_DAY + 1) * MICROS_PER_DAY - 1
cdef object UTC = timezone.utc  # the tzinfo of fastavro's timestamps


cdef class Step:
    """One node of a schema. A record's fields are set after its step exists, so that a named
    record can be referred to before its definition is complete."""

    cdef int kind
    cdef bint as_number  # a timestamp or date kept as the number written (the module docstring); other kinds ignore it
    cdef object convert  # fastavro's logical-type converter, or None
    cdef object schema  # the node's schema, the converter's second argument
    cdef Step child  # a nullable's value, an array's item, a map's value
    cdef tuple names
    cdef tuple steps  # a record's fields or a union's branches
    cdef str last_text  # a string step's last value, handed out again while the bytes repeat

    def __init__(
        self, int kind, convert=None, schema=None, Step child=None, tuple branches=(), bint as_number=False
    ):
        self.kind = kind
        self.as_number = as_number
        self.convert = convert
        self.schema = schema
        self.child = child
        self.names = ()
        self.steps = branches
        self.last_text = None

    def set_fields(self, tuple names, tuple steps):
        self.names = names
        self.steps = steps


cdef class CompiledReader:
    """``reader(message, position)`` → (the value read from ``position`` on, the position after
    it), the :data:`schemas.avro_reader.Reader` contract."""

    cdef Step top

    def __init__(self, Step top):
        self.top = top

    def __call__(self, bytes data not None, Py_ssize_t pos):
        cdef Cursor cursor = Cursor.__new__(Cursor)
        cursor.data = <const unsigned char*>PyBytes_AS_STRING(data)
        cursor.size = PyBytes_GET_SIZE(data)
        if pos < 0 or pos > cursor.size:
            raise ends()
        cursor.pos = pos
        value = read(self.top, cursor)
        return value, cursor.pos


cdef class Cursor:
    cdef const unsigned char* data
    cdef Py_ssize_t size
    cdef Py_ssize_t pos


cdef object ends():
    return EOFError("the message ends before the record does")


cdef int64_t read_long(Cursor cursor) except? -1:
    """A zig-zag varint of at most ten bytes, the tenth holding the 64th bit only."""
    cdef uint64_t number = 0
    cdef int shift = 0
    cdef unsigned char byte
    while True:
        if cursor.pos >= cursor.size:
            raise ends()
        byte = cursor.data[cursor.pos]
        cursor.pos += 1
        if shift == 7 * (LONGEST_VARINT - 1):
            if byte & 0x80:
                raise ValueError(f"a varint longer than {LONGEST_VARINT} bytes")
            if byte > 1:
                raise ValueError("a varint of more than 64 bits")
        number |= (<uint64_t>(byte & 0x7F)) << shift
        if not byte & 0x80:
            return <int64_t>(number >> 1) ^ -<int64_t>(number & 1)
        shift += 7


cdef uint64_t little_endian(Cursor cursor, int width) except? 0:
    cdef uint64_t bits = 0
    cdef int i
    if cursor.size - cursor.pos < width:
        raise ends()
    for i in range(width):
        bits |= (<uint64_t>cursor.data[cursor.pos + i]) << (8 * i)
    cursor.pos += width
    return bits


cdef object read(Step step, Cursor cursor):
    cdef int kind = step.kind
    cdef object value
    cdef Py_ssize_t i
    cdef int64_t number
    cdef unsigned char byte
    cdef uint64_t bits
    cdef uint32_t narrow
    cdef double double_value
    cdef float float_value
    cdef dict record
    if kind == RECORD:
        record = _PyDict_NewPresized(len(step.names))
        for i in range(len(step.names)):
            record[step.names[i]] = read(<Step>step.steps[i], cursor)
        return record
    if kind == NULLABLE:
        if cursor.pos >= cursor.size:
            raise ends()
        byte = cursor.data[cursor.pos]
        cursor.pos += 1
        if byte == 0:
            return None
        if byte == 2:
            return read(step.child, cursor)
        raise ValueError(f"union branch {(byte >> 1) ^ -(byte & 1)} of 2")
    if kind == UNION:
        number = read_long(cursor)
        if number < 0 or number >= len(step.steps):
            raise ValueError(f"union branch {number} of {len(step.steps)}")
        return read(<Step>step.steps[number], cursor)
    if kind == ARRAY or kind == MAP:
        return read_repeated(step, cursor)
    if kind == LONG:
        if cursor.pos < cursor.size and cursor.data[cursor.pos] < 0x80:
            byte = cursor.data[cursor.pos]
            cursor.pos += 1
            value = (byte >> 1) ^ -(byte & 1)
        else:
            value = read_long(cursor)
    elif kind == UTC_MICROS or kind == UTC_MILLIS or kind == DAYS:
        number = read_long(cursor)
        if in_calendar(kind, number):
            return number if step.as_number else calendar_value(kind, number)
        value = number  # outside the years 1-9999: fastavro's converter, below, says why
    elif kind == STRING or kind == BYTES:
        number = read_long(cursor)
        if number < 0:
            raise ValueError(f"a negative length ({number})")
        if number > cursor.size - cursor.pos:
            raise EOFError(f"expected {number} bytes, {cursor.size - cursor.pos} left")
        if kind == STRING:
            value = read_text(step, <const char*>cursor.data + cursor.pos, number)
        else:
            value = PyBytes_FromStringAndSize(<const char*>cursor.data + cursor.pos, number)
        cursor.pos += number
    elif kind == DOUBLE:
        bits = little_endian(cursor, 8)
        memcpy(&double_value, &bits, 8)
        value = double_value
    elif kind == FLOAT:
        narrow = <uint32_t>little_endian(cursor, 4)
        memcpy(&float_value, &narrow, 4)
        value = float_value
    elif kind == BOOLEAN:
        if cursor.pos >= cursor.size:
            raise ends()
        value = cursor.data[cursor.pos] != 0
        cursor.pos += 1
    else:  # NULL_VALUE
        value = None
    if step.convert is not None:
        value = step.convert(value, step.schema, None)
    return value


cdef str read_text(Step step, const char* utf8, Py_ssize_t size):
    """The string of ``size`` bytes at ``utf8``. Most of an event's strings repeat from one event
    to the next (table, stream, change type, schema key, ...): when they are the ASCII bytes of
    the step's last string, that string is handed out again, not a copy made."""
    cdef str last = step.last_text
    if (
        last is not None
        and PyUnicode_IS_COMPACT_ASCII(last)
        and PyUnicode_GET_LENGTH(last) == size
        and memcmp(PyUnicode_DATA(last), utf8, size) == 0
    ):
        return last
    text = PyUnicode_DecodeUTF8(utf8, size, NULL)
    step.last_text = text
    return text


cdef bint in_calendar(int kind, int64_t number):
    """Does ``number`` (days, millis or micros since the epoch) fall in the years 1-9999?"""
    if kind == DAYS:
        return FIRST_DAY <= number <= LAST_DAY
    if kind == UTC_MILLIS:
        return FIRST_MICRO // 1000 <= number <= LAST_MICRO // 1000
    return FIRST_MICRO <= number <= LAST_MICRO


cdef object calendar_value(int kind, int64_t number):
    """The ``date`` or UTC ``datetime`` that ``number`` (:func:`in_calendar`) stands for, equal
    to what fastavro's converter makes of it."""
    cdef int64_t micros, days, rest
    cdef int year, month, day
    if kind == DAYS:
        civil_date(number, &year, &month, &day)
        return date_new(year, month, day)
    micros = number * 1000 if kind == UTC_MILLIS else number
    days = micros // MICROS_PER_DAY  # floor division: Cython keeps Python's semantics here
    rest = micros - days * MICROS_PER_DAY
    civil_date(days, &year, &month, &day)
    return datetime_new(
        year,
        month,
        day,
        <int>(rest // 3_600_000_000),
        <int>(rest // 60_000_000 % 60),
        <int>(rest // 1_000_000 % 60),
        <int>(rest % 1_000_000),
        UTC,
    )


cdef void civil_date(int64_t days, int* year, int* month, int* day):
    """Days since 1970-01-01 → the proleptic Gregorian date (Howard Hinnant's
    ``civil_from_days``, in eras of 400 years)."""
    cdef int64_t shifted = days + 719_468  # days since 0000-03-01
    cdef int64_t era = shifted // 146_097
    cdef int64_t of_era = shifted - era * 146_097
    cdef int64_t year_of_era = (of_era - of_era // 1_460 + of_era // 36_524 - of_era // 146_096) // 365
    cdef int64_t of_year = of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    cdef int64_t shifted_month = (5 * of_year + 2) // 153
    day[0] = <int>(of_year - (153 * shifted_month + 2) // 5 + 1)
    month[0] = <int>(shifted_month + 3 if shifted_month < 10 else shifted_month - 9)
    year[0] = <int>(year_of_era + era * 400 + (1 if month[0] <= 2 else 0))


cdef object read_repeated(Step step, Cursor cursor):
    """Blocks of items until a zero count; a negative count is followed by the block's size in
    bytes, which is read and not needed. Every item takes at least a byte (schema_check), so a
    count larger than the bytes left ends in an error before it is used up: it is capped there."""
    cdef bint is_array = step.kind == ARRAY
    cdef list items = []
    cdef dict entries = {}
    cdef int64_t count = read_long(cursor)
    cdef uint64_t announced
    cdef Py_ssize_t i
    while count:
        if count < 0:
            announced = <uint64_t>(-(count + 1)) + 1  # -count, also for the smallest int64
            read_long(cursor)
        else:
            announced = <uint64_t>count
        for i in range(<Py_ssize_t>min(announced, <uint64_t>(cursor.size - cursor.pos + 1))):
            if is_array:
                items.append(read(step.child, cursor))
            else:
                key = read(_KEY, cursor)
                entries[key] = read(step.child, cursor)
        count = read_long(cursor)
    return items if is_array else entries


cdef Step _KEY = Step(STRING)
