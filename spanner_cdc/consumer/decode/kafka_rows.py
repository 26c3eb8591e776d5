"""The columns of Spark's Kafka source that decoding reads, for Arrow.

Spark's ``kafka`` source hands every record as ``key, value, topic, partition, offset,
timestamp, timestampType`` (and ``headers`` with ``includeHeaders``). Decoding reads only
:data:`DECODE_COLUMNS`; the consistent cut stores held events in that shape too, so it can give
them back to the same decode function.
"""

from __future__ import annotations

import pyarrow as pa

DECODE_COLUMNS = ("key", "value", "topic", "partition", "offset")
DECODE_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
    ]
)


def kafka_column(rows: pa.RecordBatch | pa.Table, name: str) -> pa.Array:
    """A column of Kafka rows (a record batch's, or a table's in one chunk) as one array."""
    column = rows.column(name)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
