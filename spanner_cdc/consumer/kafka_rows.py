"""The row a Kafka source hands Spark, once: its columns for Spark (DDL) and for Arrow.

The same shape as Spark's built-in ``kafka`` source (headers with ``includeHeaders``), so switching sources
changes nothing downstream. Decoding reads only :data:`DECODE_COLUMNS`; the consistent cut stores
held events in that shape too, so it can give them back to the same decode function.
"""

from __future__ import annotations

import pyarrow as pa

_FIELDS = (
    ("key", pa.binary(), "binary"),
    ("value", pa.binary(), "binary"),
    ("topic", pa.string(), "string"),
    ("partition", pa.int32(), "int"),
    ("offset", pa.int64(), "long"),
    ("timestamp", pa.timestamp("us", tz="UTC"), "timestamp"),
    ("timestampType", pa.int32(), "int"),
)
ARROW_SCHEMA = pa.schema([(name, arrow_type) for name, arrow_type, _ in _FIELDS])
SPARK_DDL = ", ".join(f"{name} {spark_type}" for name, _, spark_type in _FIELDS)
#: With ``includeHeaders``: one more column, last, as in Spark's source.
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
ARROW_SCHEMA_WITH_HEADERS = ARROW_SCHEMA.append(pa.field("headers", HEADERS_TYPE))
SPARK_DDL_WITH_HEADERS = f"{SPARK_DDL}, headers array<struct<key: string, value: binary>>"
DECODE_COLUMNS = ("key", "value", "topic", "partition", "offset")
DECODE_SCHEMA = pa.schema([ARROW_SCHEMA.field(name) for name in DECODE_COLUMNS])
