# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled Avro steps, in C: one :class:`Step` per node of a writer schema, walked by the
reader over a message's bytes and by :class:`CompiledWriter` over a value.

``schemas.avro_tree`` turns a parsed writer schema into a tree of steps once per schema and
process; :class:`CompiledReader` then walks that tree over each message's bytes. Reading the
bytes by position (varints, lengths, UTF-8, floats) is what the consumer's tasks spent most of
their decoding time on in the generated-Python reader this replaces; in C it takes a quarter of
that time. The records are fastavro's, value for value,
and the errors the generated reader's, message for message (``tests/unit/schemas/test_avro_reader.py``):

- the message ends early: ``EOFError`` (a string or bytes announcing more than is left says how
  much);
- it says something impossible: ``ValueError`` (a varint longer than ten bytes, a negative
  length, a union branch that does not exist) or ``UnicodeDecodeError``;
- a logical type's converter (fastavro's own) raises what it raises.

Timestamps (``timestamp-micros``, ``timestamp-millis``) and dates are made here, in C, as
fastavro's converters make them (``datetime`` in UTC, ``date``): those converters are slow in
Python, and every event carries three timestamps. A step made ``as_number`` keeps the number
the bytes hold instead (micros, millis or days since the epoch), which is what an Arrow column
of the type stores: the consumer's tasks convert every event's timestamps to Arrow, where a
``datetime`` costs ten times an int.
Either way, a value outside the years 1-9999 is handed to fastavro's converter, so that its
error is fastavro's, word for word.

A varint is a 64-bit number: one of ten bytes whose last holds more than the 64th bit is refused
(``ValueError``), where fastavro drops the extra bits and the generated reader made a larger int,
which no Arrow column takes.

The same steps also read records straight into Arrow's buffers (:class:`ColumnsReader`): the
consumer's columnar gate reads what its rules need of each event that way, and the sinks read
its table's columns — which took a third of the time Arrow spent converting the records
.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.datetime cimport date_new, datetime_new, import_datetime
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_DecodeUTF8, PyUnicode_GET_LENGTH
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.math cimport isinf
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy, memset


cdef extern from "Python.h":
    # A dict with room for its keys from the start: a record's fields never make it grow.
    dict _PyDict_NewPresized(Py_ssize_t minused)
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL

from collections.abc import Mapping
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
    cdef bint int32  # an Avro int (a LONG or DAYS step): the writer refuses a value beyond 32 bits
    cdef dict defaults  # a record's field defaults, by name: what the writer writes for a missing field

    def __init__(
        self,
        int kind,
        convert=None,
        schema=None,
        Step child=None,
        tuple branches=(),
        bint as_number=False,
        bint int32=False,
    ):
        self.kind = kind
        self.as_number = as_number
        self.convert = convert
        self.schema = schema
        self.child = child
        self.names = ()
        self.steps = branches
        self.last_text = None
        self.int32 = int32
        self.defaults = {}

    def set_fields(self, tuple names, tuple steps, dict defaults=None):
        self.names = names
        self.steps = steps
        self.defaults = defaults or {}


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


cdef int next_byte(Cursor cursor) except -1:
    """The next byte (a boolean, a nullable's branch)."""
    if cursor.pos >= cursor.size:
        raise ends()
    cursor.pos += 1
    return cursor.data[cursor.pos - 1]


cdef bint is_present(Cursor cursor) except -1:
    """A nullable's branch (["null", X]: one byte, 0 or 2): does its value follow?"""
    cdef int byte = next_byte(cursor)
    if byte == 0 or byte == 2:
        return byte == 2
    raise ValueError(f"union branch {(byte >> 1) ^ -(byte & 1)} of 2")


cdef Py_ssize_t read_size(Cursor cursor) except -1:
    """A string's or bytes' length, checked against what is left."""
    cdef int64_t size = read_long(cursor)
    if size < 0:
        raise ValueError(f"a negative length ({size})")
    if size > cursor.size - cursor.pos:
        raise EOFError(f"expected {size} bytes, {cursor.size - cursor.pos} left")
    return <Py_ssize_t>size


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
        return read(step.child, cursor) if is_present(cursor) else None
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
    elif is_calendar(kind):
        number = read_long(cursor)
        if in_calendar(kind, number):
            return number if step.as_number else calendar_value(kind, number)
        value = number  # outside the years 1-9999: fastavro's converter, below, says why
    elif kind == STRING or kind == BYTES:
        number = read_size(cursor)
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
        value = next_byte(cursor) != 0
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


cdef inline bint is_calendar(int kind):
    """A timestamp or date (read as the number written: :func:`in_calendar`)."""
    return kind == UTC_MICROS or kind == UTC_MILLIS or kind == DAYS


cdef int check_calendar(int kind, int64_t number) except -1:
    """``ValueError`` for a timestamp or date outside the years 1-9999, where the record reader
    fails (it hands the number to fastavro's converter, which raises ``OverflowError`` or
    ``ValueError``); nothing for a number of another kind."""
    if is_calendar(kind) and not in_calendar(kind, number):
        raise ValueError(f"{number} is not a time or date in the years 1-9999")
    return 0


cdef bint is_contract_decimal(Step step):
    """The contract's decimal(38, 9) (NUMERIC), whose converter cannot fail on its bytes."""
    return step.kind == BYTES and step.schema.get("precision") == 38 and step.schema.get("scale") == 9


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


cdef Py_ssize_t block_items(Cursor cursor, int64_t count) except -1:
    """How many items to read of a block of an array or map whose ``count`` was just read. A
    negative count is followed by the block's size in bytes, which is read and not needed. Every
    item takes at least a byte (schema_check), so a count larger than the bytes left ends in an
    error before it is used up: it is capped there."""
    cdef uint64_t announced
    if count < 0:
        announced = <uint64_t>(-(count + 1)) + 1  # -count, also for the smallest int64
        read_long(cursor)
    else:
        announced = <uint64_t>count
    return <Py_ssize_t>min(announced, <uint64_t>(cursor.size - cursor.pos + 1))


cdef object read_repeated(Step step, Cursor cursor):
    """Blocks of items (:func:`block_items`) until a zero count."""
    cdef bint is_array = step.kind == ARRAY
    cdef list items = []
    cdef dict entries = {}
    cdef int64_t count = read_long(cursor)
    cdef Py_ssize_t i
    while count:
        for i in range(block_items(cursor, count)):
            if is_array:
                items.append(read(step.child, cursor))
            else:
                key = read(_KEY, cursor)
                entries[key] = read(step.child, cursor)
        count = read_long(cursor)
    return items if is_array else entries


cdef Step _KEY = Step(STRING)


# Columns: the same steps, walked into Arrow buffers instead of Python values.

#: pyarrow, imported by the first :class:`ColumnsReader` (every use of it here comes after one is
#: made): the producer imports this module for its records and has no pyarrow.
pa = None

cdef enum Layout:
    SKIPPED  # a field the columns do not hold: its bytes passed over (skip)
    FIXED  # little-endian numbers of ``width`` bytes
    BITS  # booleans, one bit each
    VARIABLE  # strings and bytes: int32 offsets and the bytes
    LIST  # int32 offsets and one child column
    STRUCT  # one child column per field
    DECIMAL  # Avro's big-endian two's complement, as Arrow's 16 little-endian bytes
    BRANCHES  # a union: the branch taken (int8) and one child column per branch (:func:`column_of`)


@cython.final
cdef class Buffer:
    """Bytes that grow by doubling, handed to Arrow once complete."""

    cdef char* data
    cdef Py_ssize_t size
    cdef Py_ssize_t capacity

    def __dealloc__(self):
        free(self.data)

    cdef char* extend(self, Py_ssize_t extra, bint zeroed=False) except NULL:
        """Room for ``extra`` more bytes at the end, which now count as written (zeroed if asked:
        most are written over at once, and clearing a few bytes is a call of its own)."""
        cdef Py_ssize_t needed = self.size + extra
        cdef Py_ssize_t capacity
        cdef char* grown
        if needed > self.capacity or self.data == NULL:  # a first extend of 0 returns a pointer too
            capacity = max(needed, 2 * self.capacity, 256)
            grown = <char*>realloc(self.data, capacity)
            if grown == NULL:
                raise MemoryError()
            self.data = grown
            self.capacity = capacity
        cdef char* start = self.data + self.size
        if zeroed:
            memset(start, 0, extra)
        self.size = needed
        return start

    cdef object arrow(self):
        return pa.py_buffer(PyBytes_FromStringAndSize(self.data, self.size))


@cython.final
cdef class Column:
    """One Arrow array being built from the values a step reads, one row per :meth:`append`."""

    cdef Step step  # what the bytes hold here (a nullable's step: its branch is read first)
    cdef Step value_step  # the step of the value itself (a nullable's child)
    cdef object arrow_type
    cdef int layout
    cdef int width
    cdef Py_ssize_t length
    cdef Py_ssize_t null_count
    cdef Buffer validity
    cdef Buffer values
    cdef Buffer offsets
    cdef list children  # a struct's columns, one per Avro field; a list's item column

    cdef void start_offsets(self):
        self.offsets = Buffer()
        self.offsets.extend(4, zeroed=True)  # the first offset, 0

    cdef int set_valid(self, bint valid) except -1:
        if self.length % 8 == 0:
            self.validity.extend(1, zeroed=True)
        if valid:
            self.validity.data[self.length >> 3] |= 1 << (self.length & 7)
        else:
            self.null_count += 1
        return 0

    cdef int end_offset(self, Py_ssize_t offset) except -1:
        if offset > 0x7FFFFFFF:
            raise OverflowError("more than 2 GiB in one column of one batch")
        (<int32_t*>self.offsets.extend(4))[0] = <int32_t>offset
        return 0

    cdef int append_null(self) except -1:
        cdef Column child
        if self.layout == SKIPPED:
            return 0
        self.set_valid(False)
        if self.layout == FIXED or self.layout == DECIMAL:
            self.values.extend(self.width, zeroed=True)
        elif self.layout == BITS:
            if self.length % 8 == 0:
                self.values.extend(1, zeroed=True)
        elif self.layout == VARIABLE:
            self.end_offset(self.values.size)
        elif self.layout == LIST:
            self.end_offset((<Column>self.children[0]).length)
        else:  # a struct's fields, a union's branches
            if self.layout == BRANCHES:
                self.values.extend(1, zeroed=True)
            for child in self.children:
                child.append_null()
        self.length += 1
        return 0

    cdef int append(self, Cursor cursor) except -1:
        if self.layout == SKIPPED:
            return skip(self.step, cursor)
        if self.step.kind == NULLABLE and not is_present(cursor):
            return self.append_null()
        self.set_valid(True)
        self.append_value(cursor)
        self.length += 1
        return 0

    cdef int append_value(self, Cursor cursor) except -1:
        cdef Column child
        cdef int64_t number
        cdef uint64_t bits
        cdef Py_ssize_t size
        cdef int kind = self.value_step.kind
        cdef Py_ssize_t i
        if self.layout == STRUCT:
            for child in self.children:
                child.append(cursor)
        elif self.layout == BRANCHES:
            number = read_long(cursor)
            if number < 0 or number >= len(self.children):
                raise ValueError(f"union branch {number} of {len(self.children)}")
            self.values.extend(1)[0] = <char>number
            for i in range(len(self.children)):
                child = <Column>self.children[i]
                if i == number:
                    child.append(cursor)
                else:
                    child.append_null()
        elif self.layout == LIST:
            read_items(self, cursor)
            self.end_offset((<Column>self.children[0]).length)
        elif self.layout == VARIABLE:
            size = read_size(cursor)
            if kind == STRING:
                check_text(cursor.data + cursor.pos, size)
            memcpy(self.values.extend(size), cursor.data + cursor.pos, size)
            cursor.pos += size
            self.end_offset(self.values.size)
        elif self.layout == DECIMAL:
            size = read_size(cursor)
            write_decimal(self.values.extend(16), cursor.data + cursor.pos, size)
            cursor.pos += size
        elif self.layout == BITS:
            if self.length % 8 == 0:
                self.values.extend(1, zeroed=True)
            if next_byte(cursor):
                self.values.data[self.length >> 3] |= 1 << (self.length & 7)
        elif kind == DOUBLE or kind == FLOAT:
            bits = little_endian(cursor, self.width)
            memcpy(self.values.extend(self.width), &bits, self.width)
        else:  # longs, timestamps and dates: the number written
            number = read_long(cursor)
            check_calendar(kind, number)
            if self.width == 4:
                if number < -0x80000000 or number > 0x7FFFFFFF:
                    raise OverflowError(f"{number} does not fit a 32-bit column")
                (<int32_t*>self.values.extend(4))[0] = <int32_t>number
            else:
                (<int64_t*>self.values.extend(8))[0] = number
        return 0

    cdef object arrow(self):
        validity = self.validity.arrow() if self.null_count else None
        if self.layout == STRUCT or self.layout == BRANCHES:
            return pa.Array.from_buffers(
                self.arrow_type, self.length, [validity], self.null_count, children=self.struct_children()
            )
        if self.layout == LIST:
            return pa.Array.from_buffers(
                self.arrow_type,
                self.length,
                [validity, self.offsets.arrow()],
                self.null_count,
                children=[(<Column>self.children[0]).arrow()],
            )
        if self.layout == VARIABLE:
            buffers = [validity, self.offsets.arrow(), self.values.arrow()]
        else:
            buffers = [validity, self.values.arrow()]
        return pa.Array.from_buffers(self.arrow_type, self.length, buffers, self.null_count)

    cdef list struct_children(self):
        """The struct type's fields in its order; a field the Avro record lacks is all null (a
        union's: ``branch``, then its branches by their position)."""
        built = {}
        cdef Column child
        if self.layout == BRANCHES:
            built[UNION_BRANCH] = pa.Array.from_buffers(pa.int8(), self.length, [None, self.values.arrow()])
            names = [str(i) for i in range(len(self.children))]
        else:
            names = self.value_step.names
        for name, child in zip(names, self.children):
            if child.layout != SKIPPED:
                built[name] = child.arrow()
        return [built[field.name] if field.name in built else pa.nulls(self.length, field.type) for field in self.arrow_type]


cdef int skip(Step step, Cursor cursor) except -1:
    """Past what ``step`` reads, making nothing of it (a field the columns do not hold)."""
    cdef int kind = step.kind
    cdef int64_t count
    cdef Py_ssize_t i, size
    if kind == RECORD:
        for i in range(len(step.steps)):
            skip(<Step>step.steps[i], cursor)
    elif kind == NULLABLE:
        if is_present(cursor):
            skip(step.child, cursor)
    elif kind == UNION:
        count = read_long(cursor)
        if count < 0 or count >= len(step.steps):
            raise ValueError(f"union branch {count} of {len(step.steps)}")
        skip(<Step>step.steps[count], cursor)
    elif kind == ARRAY or kind == MAP:
        count = read_long(cursor)
        while count:
            for i in range(block_items(cursor, count)):
                if kind == MAP:
                    skip(_KEY, cursor)
                skip(step.child, cursor)
            count = read_long(cursor)
    elif kind == STRING or kind == BYTES:
        size = read_size(cursor)
        if kind == STRING:
            check_text(cursor.data + cursor.pos, size)
        cursor.pos += size
    elif kind == DOUBLE:
        little_endian(cursor, 8)
    elif kind == FLOAT:
        little_endian(cursor, 4)
    elif kind == BOOLEAN:
        next_byte(cursor)
    elif kind != NULL_VALUE:  # longs, timestamps and dates
        check_calendar(kind, read_long(cursor))
    return 0


cdef int check_text(const unsigned char* utf8, Py_ssize_t size) except -1:
    """``UnicodeDecodeError`` where the record reader's decoding of these bytes raises it: ASCII
    is looked at byte by byte, anything else decoded (and dropped) by Python as that reader does."""
    cdef Py_ssize_t i
    for i in range(size):
        if utf8[i] & 0x80:
            PyUnicode_DecodeUTF8(<const char*>utf8, size, NULL)
            return 0
    return 0


cdef int read_items(Column column, Cursor cursor) except -1:
    """An array's blocks of items into its item column (as :func:`read_repeated` reads them)."""
    cdef Column items = <Column>column.children[0]
    cdef int64_t count = read_long(cursor)
    cdef Py_ssize_t i
    while count:
        for i in range(block_items(cursor, count)):
            items.append(cursor)
        count = read_long(cursor)
    return 0


#: 10^38, the first unscaled value a decimal128(38, ...) cannot hold, as its two 64-bit halves.
cdef int64_t DECIMAL_LIMIT_HIGH = 0x4B3B4CA85A86C47A
cdef uint64_t DECIMAL_LIMIT_LOW = 0x098A224000000000


cdef int write_decimal(char* target, const unsigned char* big_endian, Py_ssize_t size) except -1:
    """Avro's decimal bytes (an unscaled two's complement integer, big-endian, any length) as
    Arrow's decimal128: 16 bytes, little-endian. A value of 38 digits or more is refused
    (``OverflowError``), as Arrow refuses the ``Decimal`` fastavro makes of it."""
    cdef Py_ssize_t i
    cdef unsigned char fill = 0xFF if size and big_endian[0] & 0x80 else 0
    cdef uint64_t low
    cdef int64_t high
    if size > 16:
        raise OverflowError(f"a decimal of {size} bytes")
    memset(target, fill, 16)
    for i in range(size):
        target[i] = big_endian[size - 1 - i]
    memcpy(&low, target, 8)
    memcpy(&high, target + 8, 8)
    if high < 0:  # compare the magnitude: -(high:low)
        high = ~high
        low = ~low + 1
        if low == 0:
            high += 1
    if high > DECIMAL_LIMIT_HIGH or (high == DECIMAL_LIMIT_HIGH and low >= DECIMAL_LIMIT_LOW):
        raise OverflowError("a decimal of more than 38 digits")
    return 0


cdef Column column_of(Step step, object arrow_type):
    """The column that holds what ``step`` reads as ``arrow_type`` (None: a field not held);
    ``TypeError`` when that type is not the one the step's values make."""
    cdef Column column = Column.__new__(Column)
    cdef Step value = step.child if step.kind == NULLABLE else step
    cdef int kind = value.kind
    column.step = step
    column.value_step = value
    column.arrow_type = arrow_type
    column.validity = Buffer()
    column.values = Buffer()
    if arrow_type is None:
        column.layout = SKIPPED
        check_skippable(step, set())
        return column
    if kind == UNION and pa.types.is_struct(arrow_type) and arrow_type.get_field_index(UNION_BRANCH) == 0:
        if len(value.steps) > 127:
            raise TypeError(f"a union of {len(value.steps)} branches")
        column.layout = BRANCHES
        column.children = [
            column_of(<Step>value.steps[i], _field_type(arrow_type, str(i))) for i in range(len(value.steps))
        ]
    elif kind == RECORD and pa.types.is_struct(arrow_type):
        column.layout = STRUCT
        column.children = [
            column_of(<Step>value.steps[i], _field_type(arrow_type, name)) for i, name in enumerate(value.names)
        ]
    elif kind == ARRAY and pa.types.is_list(arrow_type):
        column.layout = LIST
        column.start_offsets()
        column.children = [column_of(value.child, arrow_type.value_type)]
    elif value.convert is not None and kind == BYTES:
        if arrow_type != pa.decimal128(38, 9) or not is_contract_decimal(value):
            raise TypeError(f"decimal {value.schema!r} as {arrow_type}")
        column.layout = DECIMAL
        column.width = 16
    elif value.convert is not None and not is_calendar(kind):
        raise TypeError(f"a logical type as {arrow_type}")
    elif (kind == STRING and arrow_type in (pa.string(), pa.binary())) or (kind == BYTES and arrow_type == pa.binary()):
        column.layout = VARIABLE
        column.start_offsets()
    elif kind == BOOLEAN and arrow_type == pa.bool_():
        column.layout = BITS
    else:
        column.layout = FIXED
        column.width = _number_width(kind, arrow_type)
    return column


#: The field of a union's struct (:func:`column_of`) that holds the branch each value took.
UNION_BRANCH = "branch"


cdef int check_skippable(Step step, set seen) except -1:
    """``TypeError`` unless passing over what ``step`` reads (:func:`skip`) fails exactly where
    the record reader fails: its logical types must be ones whose converters cannot fail on what
    the bytes hold (timestamps and dates, checked here; the contract's decimal(38, 9))."""
    cdef Step child
    if id(step) in seen:
        return 0
    seen.add(id(step))
    if step.convert is not None and not is_calendar(step.kind) and not is_contract_decimal(step):
        raise TypeError(f"a logical type passed over: {step.schema!r}")
    for child in (step.child,) + step.steps if step.child is not None else step.steps:
        check_skippable(child, seen)
    return 0


cdef object _field_type(object struct_type, str name):
    index = struct_type.get_field_index(name)
    return None if index < 0 else struct_type.field(index).type


cdef int _number_width(int kind, object arrow_type) except -1:
    if kind == DOUBLE and arrow_type == pa.float64():
        return 8
    if kind == FLOAT and arrow_type == pa.float32():
        return 4
    if kind == LONG and arrow_type == pa.int64():
        return 8
    if kind == LONG and arrow_type == pa.int32():
        return 4
    if kind == UTC_MICROS and arrow_type == pa.timestamp("us", tz="UTC"):
        return 8
    if kind == UTC_MILLIS and arrow_type == pa.timestamp("ms", tz="UTC"):
        return 8
    if kind == DAYS and arrow_type == pa.date32():
        return 4
    raise TypeError(f"Avro kind {kind} as {arrow_type}")


cdef class ColumnsReader:
    """``reader(messages, starts)`` → one Arrow struct array of ``arrow_type``, a row per message:
    the record each message holds from its start on, read by the steps of the compiled reader
    it is made from (a writer schema's, timestamps and dates as numbers: ``column_reader``)
    straight into Arrow's buffers, with no Python value made on the way (fields the type does
    not name are passed over; fields the record lacks are null; a union is a struct of the
    ``branch`` taken and one field per branch, named by its position). The values equal the ones
    Arrow makes of that reader's records, and it fails wherever that reader fails, in the
    fields it passes over too (invalid UTF-8, a time or date outside the years 1-9999, a union
    branch that does not exist, bytes left over: the consumer's columnar gate reads with it
    first); it also fails on a value the type cannot hold (a long beyond a 32-bit column, a
    decimal of 38 digits or more: ``OverflowError``). What it raises for a message carries
    ``message_index``, that message's place in ``messages``. ``TypeError`` when the type is not one the
    schema's values make, or the schema has a logical type whose converter could fail where
    it is passed over (anything but timestamps, dates and the contract's decimal(38, 9))."""

    cdef Step top
    cdef object arrow_type

    def __init__(self, CompiledReader reader not None, arrow_type):
        global pa
        if pa is None:
            import pyarrow
            pa = pyarrow
        if reader.top.kind != RECORD or not pa.types.is_struct(arrow_type):
            raise TypeError("a record read as a struct")
        column_of(reader.top, arrow_type)  # refuses a type the steps cannot make now, not at the first read
        self.top = reader.top
        self.arrow_type = arrow_type

    def __call__(self, list messages not None, list starts not None):
        cdef Column column = column_of(self.top, self.arrow_type)
        cdef Cursor cursor = Cursor.__new__(Cursor)
        cdef bytes message
        cdef Py_ssize_t i
        for i in range(len(messages)):
            message = <bytes?>messages[i]
            cursor.data = <const unsigned char*>PyBytes_AS_STRING(message)
            cursor.size = PyBytes_GET_SIZE(message)
            cursor.pos = <Py_ssize_t?>starts[i]
            try:
                if cursor.pos < 0 or cursor.pos > cursor.size:
                    raise ends()
                column.append(cursor)
                if cursor.pos != cursor.size:
                    raise ValueError(f"{cursor.size - cursor.pos} bytes left after the record")
            except Exception as exc:
                exc.message_index = i
                raise
        return column.arrow()


# Writing: the same steps, walked over a value into Avro's binary encoding.

cdef int64_t INT_MIN = -(2**31)
cdef int64_t INT_MAX = 2**31 - 1


@cython.final
cdef class CompiledWriter:
    """``writer(header, value)`` → ``header`` followed by the Avro body of ``value``, the
    :data:`schemas.avro_writer.Writer` contract. Values must be in Avro's primitive forms (ints
    for timestamps and dates, bytes for decimals, text for JSON): a logical type is written as
    its primitive. For such values the bytes are fastavro's. A value the schema cannot hold is
    refused, never written: a long or int out of range or a value no union branch takes
    (``ValueError``), a value of another type (``TypeError``), a record without a field that has
    no default (``KeyError``). A record is a mapping by field name, or a tuple of all its fields'
    values in order (not as a branch of a union other than ``["null", record]``: there a tuple
    is an array)."""

    cdef Step top

    def __init__(self, Step top not None):
        self.top = top

    def __call__(self, bytes header not None, value):
        cdef Buffer out = Buffer.__new__(Buffer)
        cdef Py_ssize_t size = PyBytes_GET_SIZE(header)
        out.extend(512)  # room for a typical event at once: most need no second allocation
        out.size = 0
        memcpy(out.extend(size), PyBytes_AS_STRING(header), size)
        write(self.top, value, out)
        return PyBytes_FromStringAndSize(out.data, out.size)


cdef int write(Step step, object value, Buffer out) except -1:
    cdef int kind = step.kind
    cdef Py_ssize_t i
    if kind == RECORD:
        return write_record(step, value, out)
    if kind == NULLABLE:
        if value is None:
            out.extend(1)[0] = 0
            return 0
        out.extend(1)[0] = 2
        return write(step.child, value, out)
    if kind == UNION:
        for i in range(len(step.steps)):
            if takes(<Step>step.steps[i], value):
                write_varint(i, out)
                return write(<Step>step.steps[i], value, out)
        raise ValueError(f"{value!r} matches no branch of the union")
    if kind == ARRAY or kind == MAP:
        return write_repeated(step, value, out)
    if kind == LONG or is_calendar(kind):
        return write_long(value, step.int32, out)
    if kind == STRING:
        return write_text(value, out)
    if kind == BYTES:
        return write_bytes(value, out)
    if kind == DOUBLE:
        return write_little_endian(double_bits(value), 8, out)
    if kind == FLOAT:
        return write_little_endian(float_bits(value), 4, out)
    if kind == BOOLEAN:
        out.extend(1)[0] = 1 if value else 0
        return 0
    if value is not None:  # NULL_VALUE
        raise ValueError(f"{value!r} is not null")
    return 0


cdef int write_record(Step step, object value, Buffer out) except -1:
    """A record given by field name (a mapping), or as a tuple of every field's value in the
    schema's order: the event builder's form, which spares a dict per record."""
    cdef Py_ssize_t i
    cdef Py_ssize_t count = len(step.names)
    cdef object name, item
    cdef bint is_dict = type(value) is dict
    if type(value) is tuple:
        if len(<tuple>value) != count:
            raise ValueError(f"a record of {count} fields given as {len(<tuple>value)} values")
        for i in range(count):
            write(<Step>step.steps[i], (<tuple>value)[i], out)
        return 0
    for i in range(len(step.names)):
        name = step.names[i]
        item = (<dict>value).get(name, _MISSING) if is_dict else value.get(name, _MISSING)
        if item is _MISSING:
            if name not in step.defaults:
                raise KeyError(name)
            item = step.defaults[name]
        write(<Step>step.steps[i], item, out)
    return 0


cdef object _MISSING = object()


cdef bint takes(Step branch, object value) except -1:
    """Whether a union branch takes ``value``, as fastavro decides it (the first that does is
    written)."""
    cdef int kind = branch.kind
    if kind == NULL_VALUE:
        return value is None
    if kind == BOOLEAN:
        return isinstance(value, bool)
    if kind == LONG or is_calendar(kind):
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == FLOAT or kind == DOUBLE:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == STRING:
        return isinstance(value, str)
    if kind == BYTES:
        return isinstance(value, bytes)
    if kind == ARRAY:
        return isinstance(value, (list, tuple))
    return isinstance(value, Mapping)  # RECORD, MAP


cdef int write_repeated(Step step, object value, Buffer out) except -1:
    """An array's or map's items as one block of ``len(value)`` items, then the empty block."""
    cdef object key, item
    if value:
        write_varint(len(value), out)
        if step.kind == ARRAY:
            for item in value:
                write(step.child, item, out)
        else:
            for key, item in value.items():
                write_text(key, out)
                write(step.child, item, out)
    out.extend(1)[0] = 0
    return 0


cdef int write_long(object value, bint int32, Buffer out) except -1:
    cdef int64_t number
    if type(value) is not int and not isinstance(value, int):  # a float is not taken, even a whole one
        raise TypeError(f"{value!r:.100} is not an integer")
    try:
        number = value
    except OverflowError:
        raise ValueError(f"{value} is out of the range of an Avro {'int' if int32 else 'long'}") from None
    if int32 and not INT_MIN <= number <= INT_MAX:
        raise ValueError(f"{value} is out of the range of an Avro int")
    return write_varint(number, out)


cdef int write_varint(int64_t value, Buffer out) except -1:
    """Zig-zag, seven bits a byte, low bits first."""
    cdef uint64_t number = (<uint64_t>value << 1) ^ <uint64_t>(value >> 63)
    cdef char* target = out.extend(LONGEST_VARINT)
    cdef int length = 0
    while number > 0x7F:
        target[length] = <char>((number & 0x7F) | 0x80)
        number >>= 7
        length += 1
    target[length] = <char>number
    out.size -= LONGEST_VARINT - length - 1
    return 0


cdef int write_text(object value, Buffer out) except -1:
    cdef Py_ssize_t size
    cdef const char* utf8
    if not isinstance(value, str):
        raise TypeError(f"{value!r:.100} is not a string")
    utf8 = PyUnicode_AsUTF8AndSize(value, &size)  # surrogates: UnicodeEncodeError, as str.encode
    write_varint(size, out)
    memcpy(out.extend(size), utf8, size)
    return 0


cdef int write_bytes(object value, Buffer out) except -1:
    cdef bytes data = value if type(value) is bytes else bytes(memoryview(value))
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    write_varint(size, out)
    memcpy(out.extend(size), PyBytes_AS_STRING(data), size)
    return 0


cdef uint64_t double_bits(object value) except? 0:
    cdef double number = value
    cdef uint64_t bits
    memcpy(&bits, &number, 8)
    return bits


cdef uint64_t float_bits(object value) except? 0:
    cdef double number = value
    cdef float narrow = <float>number
    cdef uint32_t bits
    if isinf(narrow) and not isinf(number):
        raise OverflowError("float too large to pack with f format")  # struct's refusal, word for word
    memcpy(&bits, &narrow, 4)
    return bits


cdef int write_little_endian(uint64_t bits, int width, Buffer out) except -1:
    cdef char* target = out.extend(width)
    cdef int i
    for i in range(width):
        target[i] = <char>((bits >> (8 * i)) & 0xFF)
    return 0
