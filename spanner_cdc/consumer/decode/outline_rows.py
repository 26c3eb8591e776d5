"""The outline of a micro-batch: every Kafka message as one narrow row (``OUTLINE_SCHEMA``).

The executors' tasks outline their share of a batch (consumer.tasks) and only the
outline crosses to the driver: what a message is (event, watermark, quarantined, tombstone) and,
for an event, what deduplication, the metrics and the consistent cut decide by (uuid, commit
time, table, change type, its transaction's counts); for a watermark, what it says; for a
message naming a schema, registry id or table version the batch's context lacks, that name
(``decoded.Unknown``). Bytes travel only for the few watermarks, which the driver checks and
quarantines with their bytes if the broker refutes them: a task stages what else needs its events'
bytes (the changelog's files, the replica's stage rows and messages: sinks.replica.stage.rows).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spanner_cdc.consumer.decode.decoded import (
    OFFSET,
    PARTITION,
    TOPIC,
    DecodedBatch,
    DecodedEvent,
    Unknown,
    WatermarkSeen,
    read_columns,
)
from spanner_cdc.schemas.watermark import Watermark

#: A message's coordinates: what identifies it across the tasks and attempts of a batch.
COORDINATES = ("topic", "partition", "offset")
_ROW = "__row"
EVENT, WATERMARK, QUARANTINED, TOMBSTONE = "event", "watermark", "quarantined", "tombstone"
#: What a quarantined message names that the driver may learn (decoded.Unknown; the fingerprint
#: in hex: Spark has no unsigned 64-bit type).
UNKNOWN_FIELDS = [
    pa.field("unknown_fingerprint", pa.string()),
    pa.field("unknown_schema_id", pa.int64()),
    pa.field("unknown_table", pa.string()),
    pa.field("unknown_schema_key", pa.string()),
]
UNKNOWN_COLUMNS = [f.name for f in UNKNOWN_FIELDS]
#: A watermark as the task read it (schemas.watermark.Watermark): the driver checks it against
#: the broker without reading its bytes again.
WATERMARK_FIELDS = [
    pa.field("watermark_stream", pa.string()),
    pa.field("watermark_micros", pa.int64()),
    pa.field("watermark_topics", pa.map_(pa.string(), pa.int32())),
]
#: Outline column → the ``source_metadata`` field it holds: an event's change type and where it
#: stands in its transaction.
TRANSACTION_FIELDS = {
    "change_type": "change_type",
    "tx_id": "tx_id",
    "record_sequence": "record_sequence",
    "records_in_transaction": "number_of_records_in_transaction",
    "mods_in_record": "number_of_mods_in_record",
}
OUTLINE_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("kind", pa.string()),
        ("uuid", pa.string()),
        ("commit_micros", pa.int64()),
        ("object", pa.string()),
        ("change_type", pa.string()),
        # The transaction's completeness, which the consistent cut checks (sinks.replica.cut).
        ("tx_id", pa.string()),
        ("record_sequence", pa.string()),
        ("records_in_transaction", pa.int64()),
        ("mods_in_record", pa.int64()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        *UNKNOWN_FIELDS,
        *WATERMARK_FIELDS,
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)


def outline_batch(decoded: DecodedBatch) -> pa.RecordBatch:
    """One row per message of ``decoded``; the columns a kind does not use stay null.

    Events are outlined from the columns they were read into (decoded.read_columns), the few
    other messages row by row (:func:`_rows_of_others`)."""
    others = pa.RecordBatch.from_pylist(_rows_of_others(decoded), schema=OUTLINE_SCHEMA)
    return pa.concat_batches([*_event_batches(decoded.events), others])


def _event_batches(events: Sequence[DecodedEvent]) -> Iterator[pa.RecordBatch]:
    """The outline rows of ``events``, a batch per writer schema they were read with."""
    by_writer: dict[int, list[DecodedEvent]] = {}
    for event in events:
        by_writer.setdefault(event.version.writer.fingerprint, []).append(event)
    for share in by_writer.values():
        columns = read_columns(share)
        metadata = columns.field("source_metadata")  # the sort keys' commit micros: rules
        found = {
            "topic": columns.field(TOPIC),
            "partition": columns.field(PARTITION),
            "offset": columns.field(OFFSET),
            "kind": pa.repeat(pa.scalar(EVENT), len(share)),
            "uuid": columns.field("uuid"),
            "commit_micros": pc.cast(metadata.field("commit_timestamp"), pa.int64()),
            "object": columns.field("object"),
            **{name: metadata.field(field) for name, field in TRANSACTION_FIELDS.items()},
        }
        yield pa.RecordBatch.from_arrays(
            [
                found[field.name].cast(field.type)
                if field.name in found
                else pa.nulls(len(share), field.type)
                for field in OUTLINE_SCHEMA
            ],
            schema=OUTLINE_SCHEMA,
        )


def _rows_of_others(decoded: DecodedBatch) -> list[dict[str, object]]:
    """Outline rows of the messages that are not events.

    A quarantined message's bytes stay with the task (it stages them); what the driver may
    learn from it travels as its name, so a flood of messages naming new schemas costs the
    driver a few bytes each, not each message's size."""
    tombstone: dict[str, object] = {"kind": TOMBSTONE}
    return [
        *(
            {
                "topic": w.topic,
                "partition": w.partition,
                "offset": w.offset,
                "kind": WATERMARK,
                "watermark_stream": w.watermark.stream_name,
                "watermark_micros": w.watermark.watermark_micros,
                "watermark_topics": list(w.watermark.topics.items()),
                "value": w.value,
            }
            for w in decoded.watermarks
        ),
        *(
            {
                "topic": q.topic,
                "partition": q.partition,
                "offset": q.offset,
                "kind": QUARANTINED,
                "reason": q.reason,
                "detail": q.detail,
                **unknown_columns(q.unknown),
            }
            for q in decoded.quarantined
        ),
        *[tombstone] * decoded.tombstones,
    ]


def unknown_columns(unknown: Unknown | None) -> dict[str, object]:
    """The outline's ``unknown_*`` columns of a name."""
    if unknown is None:
        return {}
    table, schema_key = unknown.table_version or (None, None)
    return {
        "unknown_fingerprint": None if unknown.fingerprint is None else f"{unknown.fingerprint:016x}",
        "unknown_schema_id": unknown.schema_id,
        "unknown_table": table,
        "unknown_schema_key": schema_key,
    }


def watermarks_from_rows(rows: pa.Table) -> list[WatermarkSeen]:
    """The watermarks outline rows (of kind :data:`WATERMARK`) hold."""
    return [
        WatermarkSeen(
            row["topic"],
            row["partition"],
            row["offset"],
            Watermark(row["watermark_stream"], row["watermark_micros"], dict(row["watermark_topics"])),
            row["value"],
        )
        for row in rows.to_pylist()
    ]


def unknown_from_columns(row: dict[str, Any]) -> Unknown:
    """The name an outline row's ``unknown_*`` columns hold (:func:`unknown_columns`)."""
    fingerprint, table = row["unknown_fingerprint"], row["unknown_table"]
    return Unknown(
        None if fingerprint is None else int(fingerprint, 16),
        row["unknown_schema_id"],
        None if table is None else (table, row["unknown_schema_key"]),
    )


def row_numbers(
    rows: pa.Table,
    coordinates: Sequence[str],
    messages: pa.Table,
    *,
    named: bool,
    on: Sequence[str] = COORDINATES,
) -> pa.Array:
    """The numbers, ascending, of the ``rows`` whose Kafka coordinates (in their columns
    ``coordinates``) are (``named``) or are not among ``messages`` (columns ``on``: by default
    :data:`COORDINATES`; ``coordinates`` names the rows' columns of the same values).
    Arrow's join on the coordinates and a row number — not Python per row; the row number,
    because Arrow's join carries no list or struct columns and does not keep the rows' order."""
    numbered = rows.select(list(coordinates)).rename_columns(list(on))
    numbered = numbered.append_column(_ROW, pa.array(range(rows.num_rows), pa.int64()))
    join_type = "left semi" if named else "left anti"
    found = numbered.join(messages.select(list(on)), keys=list(on), join_type=join_type)
    numbers = found.column(_ROW)
    return pc.take(numbers, pc.array_sort_indices(numbers))
