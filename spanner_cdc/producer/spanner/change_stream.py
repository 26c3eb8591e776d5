"""Change-stream queries run against the database: their rows as the record model, one list of
records per row (GoogleSQL rows by their field metadata, the PostgreSQL dialect's JSON)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from spanner_cdc.producer.change_stream_rules import POSTGRESQL
from spanner_cdc.producer.spanner.database import SpannerDatabase
from spanner_cdc.producer.spanner.query import ChangeStreamQuery
from spanner_cdc.producer.spanner.rows import records_of
from spanner_cdc.schemas.records import ChangeStreamRecord, DataChangeRecord, records_from_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChangeStreamReader:
    db: SpannerDatabase

    def read(
        self, query: ChangeStreamQuery, token: str | None, start_micros: int
    ) -> Iterator[list[ChangeStreamRecord]]:
        """The query's rows as parsed records, one list per row (runs on a worker thread)."""
        params, types = query.params(token, start_micros)
        postgresql = self.db.dialect == POSTGRESQL
        with self.db.database.snapshot() as snapshot:
            results = snapshot.execute_sql(
                query.sql,
                params=params,
                param_types=types,
                request_options=self.db.request_options,
                lazy_decode=not postgresql,  # GoogleSQL rows are decoded by records_of
            )
            rows = (list(records_from_json(row[0])) for row in results) if postgresql else records_of(results)
            for records in rows:
                if log.isEnabledFor(logging.DEBUG):
                    log_returned(records)
                yield records


def log_returned(records: list[ChangeStreamRecord]) -> None:
    """One debug line per data change record, as Spanner returned it: with ``--log-level debug``
    a run's log says which changes the server gave the producer (a change the server never
    returned cannot reach Kafka; one it returned and Kafka lacks is the producer's to explain)."""
    for record in records:
        if isinstance(record, DataChangeRecord):
            log.debug(
                "returned tx=%s seq=%s mods=%d commit=%d table=%s",
                record.server_transaction_id,
                record.record_sequence,
                len(record.mods),
                record.commit_timestamp_micros,
                record.table_name,
            )
