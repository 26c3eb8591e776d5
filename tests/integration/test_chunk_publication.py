"""Rows in chunks → events on the real broker (``producer.publish.chunks``): the loop a backfill and
a poll share, with the table's schemas published as the read starts and its position saved beside
the sending."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from spanner_cdc.producer.metrics import ProducerMetrics
from spanner_cdc.producer.publish.chunks import Chunk, ChunkEvents, publish_chunks
from spanner_cdc.producer.publish.kafka import KafkaClient
from spanner_cdc.producer.publish.publisher import EventSender
from spanner_cdc.schemas.events import EventBuilder
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.timestamps import now_micros
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import unique_prefix
from tests.support.kafka_read import read_events

pytestmark = pytest.mark.integration
KEY = {"name": "Id", "type": {"code": "STRING"}, "is_primary_key": True, "ordinal_position": 1}
#: Chunks handed over this far apart, so that a save falls due (about once a second) mid-read.
CHUNK_PAUSE_SECONDS = 0.3


def test_a_save_that_fails_beside_the_sending_stops_the_publication_with_its_error(
    stack: EmbeddedStack,
) -> None:
    """A save runs as a task beside the sending: its failure must still end the publication with
    its error (a lost one would let the read finish with a position that never moved), and the
    events sent before it stay on Kafka."""
    prefix = unique_prefix("chunks")
    table = TableSchema.from_column_types("Docs", [KEY])
    builder, snapshot = EventBuilder("stream", "db"), now_micros()
    saves = 0

    def chunks() -> Iterator[Chunk]:
        for index in range(16):
            time.sleep(CHUNK_PAUSE_SECONDS)
            yield [(f"k{index:02d}",)]

    async def events_of(chunk: Chunk) -> ChunkEvents:
        events = builder.build_snapshot_rows(
            table, ["Id"], chunk, snapshot_micros=snapshot, read_timestamp_millis=0
        )
        return events, lambda: None

    async def save() -> None:
        nonlocal saves
        saves += 1
        raise RuntimeError("the position's record was refused")

    async def publish() -> None:
        kafka = KafkaClient(stack.endpoint("kafka"), prefix, {}, 1, -1)
        await kafka.take_over()
        async with kafka.serving():
            await publish_chunks(
                "chunks",
                chunks,
                table=table,
                sender=EventSender(kafka, ProducerMetrics()),
                events_of=events_of,
                save=save,
                read_timeout=30,
            )

    with pytest.raises(RuntimeError, match="the position's record was refused"):
        asyncio.run(publish())
    assert saves == 1, "one save at a time: the first one's error is raised before a second"
    published = read_events(stack.endpoint("kafka"), prefix, "Docs")
    sent = sorted(event.key["Id"] for event in published)
    assert sent and sent == [f"k{index:02d}" for index in range(len(sent))]
