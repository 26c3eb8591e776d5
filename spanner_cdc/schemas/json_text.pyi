"""Types of the compiled ``json_text`` extension (its source: ``json_text.pyx``)."""

from typing import Any

def parse_json(text: str) -> Any: ...
