"""Types of the compiled ``wire_values`` extension (its source: ``wire_values.pyx``)."""

from typing import Any

class Converter:
    def __call__(self, value: Any) -> Any: ...

def converter(spanner_type: Any) -> Converter: ...
