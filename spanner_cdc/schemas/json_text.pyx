# cython: language_level=3, boundscheck=False, wraparound=False
"""JSON text → the values ``json.loads`` makes of it, faster: change records nest their mods'
keys and values as JSON text, which the reader threads parse for every row.

orjson parses those small documents several times faster than the standard library, and
returns the same values but in two cases. What it refuses and ``json.loads`` reads — ``NaN``
and ``Infinity`` tokens, lone surrogates, numbers beyond a double's range — and invalid JSON
are read by ``json.loads``, which raises ``json.JSONDecodeError`` as before. An integer beyond
64 bits it makes a float, where ``json.loads`` keeps the int: a document with a float of at
least 2**63 in magnitude is read again by ``json.loads``.

Compiled: the look for such a float walks every value of every mod, and as Python it cost
more than orjson's parse itself.
"""

import json

import orjson

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError

#: Integers orjson keeps exact lie in [-2**63, 2**64); a float beyond ±2**63 may have been one.
cdef double _EXACT_BOUND = 2.0 ** 63


cpdef object parse_json(str text):
    try:
        value = _loads(text)
    except _JSONDecodeError:
        return json.loads(text)
    if type(value) is dict or type(value) is list:
        return json.loads(text) if _holds_a_large_float(value) else value
    if type(value) is float and not _exact(value):
        return json.loads(text)
    return value


cdef inline bint _exact(double number):
    return -_EXACT_BOUND < number < _EXACT_BOUND


cdef bint _holds_a_large_float(object container):
    cdef object item
    if type(container) is dict:
        for item in (<dict>container).values():
            if _is_or_holds_a_large_float(item):
                return True
    else:
        for item in <list>container:
            if _is_or_holds_a_large_float(item):
                return True
    return False


cdef inline bint _is_or_holds_a_large_float(object item):
    if type(item) is float:
        return not _exact(item)
    return (type(item) is dict or type(item) is list) and _holds_a_large_float(item)
