# cython: language_level=3, boundscheck=False, wraparound=False
"""Spanner's undecoded wire values (protobuf ``Value``s) of one type → their change-record JSON
form, in C: a STRUCT a dict by field name, an ARRAY a list, JSON parsed
(``schemas.json_text``), INT64 an int, BOOL a bool, STRING and TIMESTAMP their text; every
other type its wire form (``snapshot_read.json_value``). Nulls stay None at every level.

A reader thread converts every change-stream row this way, under the interpreter lock the event
loop needs too. The converter of a type is built once per query (:func:`converter`), and the
walk of a change record (STRUCTs and ARRAYs of STRING, TIMESTAMP, BOOL, INT64 and JSON) calls
no Python function of ours but the JSON parser.
"""

from google.cloud.spanner_v1 import TypeCode

from spanner_cdc.producer.spanner.snapshot_read import json_value
from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.json_text import parse_json


cdef class Converter:
    """Any type's wire form: what ``json_value`` makes of it."""

    def __call__(self, value):
        return self.convert(value)

    cdef object convert(self, object value):
        return json_value(value)


# A null comes as ``null_value``, whose ``string_value`` reads "" and ``bool_value`` False: the
# converters below ask whether it is null only when the value read could be one.

cdef class _Text(Converter):
    """A type Spanner sends as text: STRING and TIMESTAMP as they are, the others parsed."""

    cdef object convert(self, object value):
        cdef str text = value.string_value
        if text or not value.HasField("null_value"):
            return self.parse(text)
        return None

    cdef object parse(self, str text):
        return text


cdef class _Json(_Text):
    cdef object parse(self, str text):
        return parse_json(text)


cdef class _Int64(_Text):
    cdef object parse(self, str text):
        return int(text)


cdef class _Bool(Converter):
    cdef object convert(self, object value):
        if value.bool_value:
            return True
        return None if value.HasField("null_value") else False


cdef class _Array(Converter):
    cdef Converter _item

    def __init__(self, Converter item):
        self._item = item

    cdef object convert(self, object value):
        values = value.list_value.values
        if not values and value.HasField("null_value"):
            return None
        return [self._item.convert(element) for element in values]


cdef class _Struct(Converter):
    cdef tuple _names
    cdef tuple _fields

    def __init__(self, tuple names, tuple fields):
        self._names, self._fields = names, fields

    cdef object convert(self, object value):
        cdef dict out = {}
        cdef Py_ssize_t index = 0
        values = value.list_value.values
        if not values and value.HasField("null_value"):
            return None
        if len(values) != len(self._names):
            raise ContractError(
                f"a STRUCT of {len(values)} values where its type names {len(self._names)}"
            )
        for item in values:
            out[self._names[index]] = (<Converter>self._fields[index]).convert(item)
            index += 1
        return out


def converter(spanner_type):
    """The converter of ``spanner_type`` (a ``Type`` proto, proto-plus or raw)."""
    code = TypeCode(int(spanner_type.code))
    if code == TypeCode.ARRAY:
        return _Array(converter(spanner_type.array_element_type))
    if code == TypeCode.STRUCT:
        fields = spanner_type.struct_type.fields
        return _Struct(tuple(field.name for field in fields), tuple(converter(field.type_) for field in fields))
    if code == TypeCode.JSON:
        return _Json()
    if code == TypeCode.INT64:
        return _Int64()
    if code == TypeCode.BOOL:
        return _Bool()
    if code == TypeCode.STRING or code == TypeCode.TIMESTAMP:
        return _Text()
    return Converter()
