"""Writer schemas compiled once per table version, as the producer keeps them: a test that
encodes thousands of generated events pays for each schema's compiled encoder once."""

from __future__ import annotations

import functools
import json
from typing import Any

from spanner_cdc.schemas.wire import WriterSchema


def writer_of(schema: dict[str, Any]) -> WriterSchema:
    return _compiled(json.dumps(schema, sort_keys=True))


@functools.cache
def _compiled(schema_text: str) -> WriterSchema:
    return WriterSchema.from_schema(json.loads(schema_text))
