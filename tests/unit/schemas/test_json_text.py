"""Change records' JSON text reads as ``json.loads`` reads it, also where orjson refuses."""

from __future__ import annotations

import json
import math

import pytest

from spanner_cdc.schemas.json_text import parse_json

TEXTS = [
    '{"Id":"a1","Balance":"12345"}',
    '{"f":1.5e-7,"g":-0.0,"h":18446744073709551615,"i":-9223372036854775808,"j":[null,true,false]}',
    '{"name":"\\u00e9t\\u00e9 \\ud83d\\ude00","empty":{},"nested":{"a":[1,[2,{"b":"c"}]]}}',
    '{"dup":1,"dup":2}',
    # What orjson refuses: the standard library's reading stands.
    '{"big":123456789012345678901234567890}',
    '{"a":["x",{"b":[1.0,-123456789012345678901234567890]}]}',
    '{"lone":"\\ud800"}',
    "[1e400]",
]


@pytest.mark.parametrize("text", TEXTS)
def test_reads_as_the_standard_library_does(text: str) -> None:
    assert repr(parse_json(text)) == repr(json.loads(text))


def test_nan_and_infinity_tokens() -> None:
    value = parse_json('{"n":NaN,"p":Infinity,"m":-Infinity}')
    assert math.isnan(value["n"]) and value["p"] == math.inf and value["m"] == -math.inf


@pytest.mark.parametrize("text", ['{"a":', "", "{'a': 1}", '{"a":1}x'])
def test_invalid_json_raises_as_before(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        parse_json(text)


@pytest.mark.parametrize("text", ["123456789012345678901234567890", "-123456789012345678901234567890", "1.5"])
def test_a_document_of_one_number(text: str) -> None:
    assert repr(parse_json(text)) == repr(json.loads(text))
