"""The baselines of (b): a change stream's backlog read with the Spanner client alone — every
partition token read once, each on its own thread as soon as a parent names it, its rows made
change records, and nothing else: no commit order, no events, no Kafka.

Two readings of the same backlog. As a hand-written reader does it, with the client decoding
each row (:data:`CLIENT_DECODING`: every JSON value a ``JsonObject``, every STRUCT a list, here
named by the query's field metadata, read once); and as the producer does it (:data:`UNDECODED`:
``lazy_decode``, the wire values walked by ``producer.spanner.rows``), which leaves only the
client's own reading and so is the stricter of the two.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterator
from typing import Any

from google.cloud.spanner_v1 import TypeCode

from spanner_cdc.producer.change_stream_rules import GOOGLE_STANDARD_SQL
from spanner_cdc.producer.config import ProducerConfig
from spanner_cdc.producer.spanner.query import ChangeStreamQuery
from spanner_cdc.producer.spanner.rows import records_of
from spanner_cdc.schemas.records import (
    ChangeStreamRecord,
    ChildPartitionsRecord,
    DataChangeRecord,
    records_from_json,
)

CLIENT_DECODING = "the client's decoding"
UNDECODED = "the producer's reading of undecoded rows"


def read_backlog_alone(database: Any, config: ProducerConfig, rows: int, reading: str) -> float:
    """Reads the stream's backlog by ``reading`` (:data:`CLIENT_DECODING` or :data:`UNDECODED`).
    Checks it saw every committed row; returns the seconds from the first data change record
    read to the last (each holds a transaction's rows: 1,000 here)."""
    query = ChangeStreamQuery(
        config.change_stream, GOOGLE_STANDARD_SQL, config.heartbeat_ms, config.end_timestamp_micros
    )
    records_of_rows = records_of if reading == UNDECODED else _client_decoded_records
    stamps: list[float] = []  # when each thread read a change: list.append is atomic

    def read(token: str | None, start: int) -> tuple[int, list[tuple[str, int]]]:
        mods, children = 0, []
        params, types = query.params(token, start)
        with database.snapshot() as snapshot:
            results = snapshot.execute_sql(
                query.sql, params=params, param_types=types, lazy_decode=reading == UNDECODED
            )
            for records in records_of_rows(results):
                for record in records:
                    if isinstance(record, DataChangeRecord):
                        mods += len(record.mods)
                        stamps.append(time.perf_counter())
                    elif isinstance(record, ChildPartitionsRecord):
                        children += [(c.token, record.start_timestamp_micros) for c in record.children]
        return mods, children

    seen: set[str] = set()
    mods = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
        running_reads = {pool.submit(read, None, config.start_timestamp_micros)}
        while running_reads:
            done, running_reads = concurrent.futures.wait(
                running_reads, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for finished in done:
                found, children = finished.result()
                mods += found
                for token, start in children:
                    if token not in seen:
                        seen.add(token)
                        running_reads.add(pool.submit(read, token, start))
    if mods < rows:
        raise RuntimeError(f"the baseline read {mods} of {rows} committed rows")
    return max(stamps) - min(stamps)


def _client_decoded_records(results: Any) -> Iterator[list[ChangeStreamRecord]]:
    """Rows the client decoded → each row's records, their STRUCTs named by the field metadata
    that comes with the first rows."""
    name: Callable[[Any], Any] | None = None
    for row in results:
        if name is None:
            name = _namer(results.fields[0].type_)
        yield [record for change in name(row[0]) or () for record in records_from_json(change)]


def _namer(spanner_type: Any) -> Callable[[Any], Any]:
    """A client-decoded value of ``spanner_type`` → the same with each STRUCT a dict by name."""
    code = TypeCode(int(spanner_type.code))
    if code == TypeCode.ARRAY:
        item = _namer(spanner_type.array_element_type)
        return lambda value: None if value is None else [item(element) for element in value]
    if code == TypeCode.STRUCT:
        fields = [(field.name, _namer(field.type_)) for field in spanner_type.struct_type.fields]
        return lambda value: (
            None
            if value is None
            else {name: step(item) for (name, step), item in zip(fields, value, strict=True)}
        )
    return lambda value: value
