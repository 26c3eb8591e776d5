# cython: language_level=3, boundscheck=False, wraparound=False
"""Change-record JSON values → Avro values, a row at a time, in C for the common forms.

A table version converts every mod's keys, new and old values, and every backfill and polled
row (``TableSchema.convert_row``). The Python converters (``schemas.spanner_types.converter``)
define what each Spanner type accepts and the error each refusal raises; this module takes the
forms Spanner sends — a ``str`` STRING, INT64 as plain decimal text, a UTC TIMESTAMP
``YYYY-MM-DDTHH:MM:SS[.f…]Z``, a JSON number FLOAT64, a JSON boolean — and hands
every other value, and every other type, to the column's Python converter. So a value either
takes a path whose result the Python converter would give too, or the Python converter itself:
the two cannot disagree (``tests/unit/schemas/test_row_values.py`` compares them).
"""

from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.object cimport PyObject

#: How a column's values are read here; OTHER: always by its Python converter.
OTHER = 0
STRING = 1
INT64 = 2
TIMESTAMP = 3
FLOAT = 4
BOOL = 5

cdef enum:
    #: Plain decimal digits this many or fewer cannot leave the INT64 range.
    SAFE_INT64_DIGITS = 18
    #: ``YYYY-MM-DDTHH:MM:SSZ``; with a fraction of nine digits, ten more.
    SHORTEST_TIMESTAMP_LENGTH = 20
    LONGEST_TIMESTAMP_LENGTH = 30
    SECONDS_PER_DAY = 86400
    MICROS_PER_SECOND = 1000000


cdef class _Column:
    cdef readonly str avro_name
    cdef readonly int kind
    cdef readonly object convert

    def __init__(self, str avro_name, int kind, object convert):
        self.avro_name = avro_name
        self.kind = kind
        self.convert = convert


cdef class RowConverter:
    """Converts a row — a mapping of column name to change-record JSON value — to a dict of
    Avro values by field name; a name that is not a column goes to ``unknown`` (which raises)."""

    cdef dict _columns
    cdef object _unknown

    def __init__(self, columns, unknown):
        """``columns``: (name, avro_name, kind, Python converter) for every column."""
        self._columns = {name: _Column(avro_name, kind, convert) for name, avro_name, kind, convert in columns}
        self._unknown = unknown

    def convert(self, values):
        cdef dict out = {}
        for name, value in values.items():
            self._put(out, name, value)
        return out

    def convert_columns(self, names, values):
        """``convert`` of the row whose column ``names`` hold ``values`` (two sequences of one
        length, a row read from a table), without the mapping in between."""
        cdef dict out = {}
        for name, value in zip(names, values, strict=True):
            self._put(out, name, value)
        return out

    cdef inline int _put(self, dict out, object name, object value) except -1:
        cdef PyObject* found = PyDict_GetItem(self._columns, name)
        if found is NULL:
            self._unknown(name)
            raise KeyError(name)  # ``unknown`` raises; this keeps the contract if it did not
        cdef _Column column = <_Column>found
        PyDict_SetItem(out, column.avro_name, _value(column, value))
        return 0


cdef object _value(_Column column, object value):
    if value is None:
        return None
    cdef int kind = column.kind
    cdef object fast
    if kind == STRING:
        if type(value) is str:
            return value
    elif kind == INT64:
        if type(value) is str:
            fast = _int64(<str>value)
            if fast is not None:
                return fast
    elif kind == TIMESTAMP:
        if type(value) is str:
            fast = _timestamp_micros(<str>value)
            if fast is not None:
                return fast
    elif kind == FLOAT:
        if type(value) is float:
            return value
    elif kind == BOOL:
        if type(value) is bool:
            return value
    return column.convert(value)


cdef object _int64(str text):
    """Plain decimal text (an optional ``-``, up to 18 ASCII digits) as an int; None otherwise."""
    cdef Py_ssize_t length = len(text)
    cdef Py_ssize_t start = 0
    cdef Py_ssize_t i
    cdef Py_UCS4 ch
    cdef long long number = 0
    if length > 0 and text[0] == u'-':
        start = 1
    if length - start < 1 or length - start > SAFE_INT64_DIGITS:
        return None
    for i in range(start, length):
        ch = text[i]
        if ch < 48 or ch > 57:  # not '0'-'9'
            return None
        number = number * 10 + (<int>ch - 48)
    return -number if start else number


cdef int _digits(str text, Py_ssize_t start, Py_ssize_t count) except -2:
    """``count`` ASCII digits from ``start`` as a number; -1 if any is not one."""
    cdef int number = 0
    cdef Py_ssize_t i
    cdef Py_UCS4 ch
    for i in range(start, start + count):
        ch = text[i]
        if ch < 48 or ch > 57:  # not '0'-'9'
            return -1
        number = number * 10 + (<int>ch - 48)
    return number


cdef int _days_in_month(int year, int month):
    if month == 2:
        return 29 if (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)) else 28
    return 30 if month in (4, 6, 9, 11) else 31


cdef long long _days_since_epoch(int year, int month, int day):
    """Days from 1970-01-01 to a proleptic Gregorian date (H. Hinnant's days_from_civil)."""
    cdef long long y = year - (1 if month <= 2 else 0)
    cdef long long era = (y if y >= 0 else y - 399) // 400
    cdef long long year_of_era = y - era * 400
    cdef long long day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    cdef long long day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


cdef object _timestamp_micros(str text):
    """``YYYY-MM-DDTHH:MM:SSZ`` with no fraction or a fraction of 1-9 digits (Spanner writes as
    few as the value needs: a tenth of commit timestamps end in a zero, left out) as
    microseconds since the epoch; None for any other text, digits past the sixth that are not
    zeros (the Python converter's error), or a date or time of day out of range."""
    cdef Py_ssize_t length = len(text)
    if length < SHORTEST_TIMESTAMP_LENGTH or length > LONGEST_TIMESTAMP_LENGTH or text[length - 1] != u'Z':
        return None
    if text[4] != u'-' or text[7] != u'-' or text[10] != u'T' or text[13] != u':' or text[16] != u':':
        return None
    cdef int fraction = 0
    cdef Py_ssize_t digits = length - SHORTEST_TIMESTAMP_LENGTH - 1  # after the '.'
    if length > SHORTEST_TIMESTAMP_LENGTH:
        if text[19] != u'.' or digits < 1:
            return None
        fraction = _digits(text, 20, min(digits, 6))
        if fraction < 0 or (digits > 6 and _digits(text, 26, digits - 6) != 0):
            return None
        for _ in range(digits, 6):
            fraction *= 10
    cdef int year = _digits(text, 0, 4)
    cdef int month = _digits(text, 5, 2)
    cdef int day = _digits(text, 8, 2)
    cdef int hour = _digits(text, 11, 2)
    cdef int minute = _digits(text, 14, 2)
    cdef int second = _digits(text, 17, 2)
    if year < 1 or month < 1 or month > 12 or day < 1 or day > _days_in_month(year, month):
        return None
    if hour < 0 or hour > 23 or minute < 0 or minute > 59 or second < 0 or second > 59:
        return None
    cdef long long seconds = (
        _days_since_epoch(year, month, day) * SECONDS_PER_DAY + hour * 3600 + minute * 60 + second
    )
    return seconds * MICROS_PER_SECOND + fraction
