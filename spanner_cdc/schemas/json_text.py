"""JSON text → the values ``json.loads`` makes of it, faster: change records nest their mods'
keys and values as JSON text, which the reader threads parse for every row.

orjson parses those small documents several times faster than the standard library, and
returns the same values but in two cases. What it refuses and ``json.loads`` reads — ``NaN``
and ``Infinity`` tokens, lone surrogates, numbers beyond a double's range — and invalid JSON
are read by ``json.loads``, which raises ``json.JSONDecodeError`` as before. An integer beyond
64 bits it makes a float, where ``json.loads`` keeps the int: a document with a float of at
least 2**63 in magnitude is read again by ``json.loads``.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

#: Integers orjson keeps exact lie in [-2**63, 2**64); a float beyond ±2**63 may have been one.
_EXACT_BOUND = 2.0**63


def parse_json(text: str) -> Any:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
    kind = type(value)
    if kind is dict or kind is list:
        return json.loads(text) if _holds_a_large_float(value) else value
    return json.loads(text) if kind is float and not -_EXACT_BOUND < value < _EXACT_BOUND else value


def _holds_a_large_float(container: Any) -> bool:
    """Explicit loops: this runs for every JSON value of every mod, and ``any()`` over a
    generator took about twice as long."""
    for item in container.values() if type(container) is dict else container:
        kind = type(item)
        if kind is float:
            if not -_EXACT_BOUND < item < _EXACT_BOUND:
                return True
        elif (kind is dict or kind is list) and _holds_a_large_float(item):
            return True
    return False
