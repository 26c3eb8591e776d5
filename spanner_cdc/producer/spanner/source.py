"""The Spanner side of the producer: open the database, check the stream, run its queries."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as google_exceptions
from google.auth import exceptions as google_auth_exceptions
from google.cloud import spanner
from google.cloud.spanner_admin_database_v1.types import DatabaseDialect
from google.cloud.spanner_v1 import RequestOptions

from spanner_cdc.common.blocking import call_with_deadline
from spanner_cdc.common.spanner_client import CredentialsFileError, cloud_client, emulator_client
from spanner_cdc.common.spanner_client import emulator_host as emulator_host_from_env
from spanner_cdc.errors import UsageError
from spanner_cdc.producer.change_stream_rules import GOOGLE_STANDARD_SQL, POSTGRESQL, refuse_partition_mode
from spanner_cdc.producer.config import PublishSettings
from spanner_cdc.producer.errors import SpannerSetupError
from spanner_cdc.producer.spanner.catalog import NOT_CAPTURED, CatalogColumn, CatalogContents
from spanner_cdc.producer.spanner.query import ChangeStreamQuery
from spanner_cdc.producer.spanner.rows import records_from_googlesql_row
from spanner_cdc.schemas.records import ChangeStreamRecord, DataChangeRecord, records_from_json

log = logging.getLogger(__name__)

PRIORITIES = {
    "low": RequestOptions.Priority.PRIORITY_LOW,
    "medium": RequestOptions.Priority.PRIORITY_MEDIUM,
    "high": RequestOptions.Priority.PRIORITY_HIGH,
}
DIALECTS = {GOOGLE_STANDARD_SQL: DatabaseDialect.GOOGLE_STANDARD_SQL, POSTGRESQL: DatabaseDialect.POSTGRESQL}
#: Valid in both dialects: unquoted identifiers are case-insensitive in each.
DIALECT_SQL = (
    "SELECT option_value FROM information_schema.database_options WHERE option_name = 'database_dialect'"
)


@dataclass
class SpannerSource:
    database: Any
    dialect: str
    database_path: str
    #: How long the start's requests may take (``--connect-timeout-seconds``).
    answer_seconds: float
    #: Sent with every query (its priority); None leaves Spanner's default.
    request_options: RequestOptions | None = None

    @classmethod
    async def open(cls, config: PublishSettings) -> SpannerSource:
        project, instance, database = config.project, config.instance, config.database
        host = emulator_host_from_env(config.emulator_host)
        if host and (config.credentials_file or config.spanner_endpoint):
            raise UsageError(
                "--credentials-file and --spanner-endpoint are for Cloud Spanner; the emulator "
                "(--emulator-host or SPANNER_EMULATOR_HOST) takes neither"
            )
        try:
            client = (
                emulator_client(host, project)
                if host
                else cloud_client(project, config.credentials_file, config.spanner_endpoint)
            )
        except CredentialsFileError as exc:
            raise SpannerSetupError(
                f"--credentials-file holds no credentials Spanner accepts: {exc}"
            ) from None
        except google_auth_exceptions.DefaultCredentialsError:
            raise SpannerSetupError(
                "no Google Cloud credentials for Spanner: give --credentials-file, set "
                "GOOGLE_APPLICATION_CREDENTIALS (or run where application default credentials exist), "
                "or --emulator-host for an emulator"
            ) from None
        role = config.database_role
        handle = client.instance(instance).database(database, database_role=role)
        path = f"projects/{project}/instances/{instance}/databases/{database}"
        try:
            await call_with_deadline(handle.reload, config.connect_timeout_seconds)
        except TimeoutError:
            raise SpannerSetupError(
                f"Spanner does not answer within {config.connect_timeout_seconds:.0f}s ({path})"
            ) from None
        except google_exceptions.NotFound:
            raise SpannerSetupError(f"database {path} does not exist") from None
        except google_exceptions.GoogleAPICallError as exc:
            raise SpannerSetupError(f"cannot open {path}: {exc.message}") from None
        options = None
        if config.rpc_priority is not None:
            options = RequestOptions(priority=PRIORITIES[config.rpc_priority])
        probe = cls(handle, GOOGLE_STANDARD_SQL, path, config.connect_timeout_seconds, options)
        [[dialect]] = await call_with_deadline(lambda: probe._query(DIALECT_SQL), probe.answer_seconds)
        # The emulator's GetDatabase leaves the dialect unset, and the client re-reads the
        # database on every access while it is unset: give the handle the dialect we found.
        handle = client.instance(instance).database(
            database, database_dialect=DIALECTS[dialect], database_role=role
        )
        return cls(handle, dialect, path, config.connect_timeout_seconds, options)

    def _query(self, sql: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        types = {name: spanner.param_types.STRING for name in params or {}}
        with self.database.snapshot() as snapshot:
            rows = snapshot.execute_sql(
                sql, params=params, param_types=types, request_options=self.request_options
            )
            return [list(row) for row in rows]

    async def check_change_stream(self, stream: str) -> None:
        """A missing stream is one clear error at start, not a failing query per partition."""
        if self.dialect == POSTGRESQL:
            sql = "SELECT 1 FROM information_schema.change_streams WHERE change_stream_name = $1"
            params = {"p1": stream}
        else:
            sql = "SELECT 1 FROM INFORMATION_SCHEMA.CHANGE_STREAMS WHERE CHANGE_STREAM_NAME = @s"
            params = {"s": stream}
        if not await call_with_deadline(lambda: self._query(sql, params), self.answer_seconds):
            raise SpannerSetupError(f"change stream {stream!r} does not exist in {self.database_path}")
        mode = await call_with_deadline(
            lambda: self.stream_option(stream, "partition_mode"), self.answer_seconds
        )
        refuse_partition_mode(stream, mode)

    def stream_option(self, stream: str, option: str) -> str | None:
        """One option of ``stream`` (unquoted); None when it was not set (blocking)."""
        if self.dialect == POSTGRESQL:
            sql = (
                "SELECT option_value FROM information_schema.change_stream_options "
                "WHERE change_stream_name = $1 AND option_name = $2"
            )
            params = {"p1": stream, "p2": option}
        else:
            sql = (
                "SELECT OPTION_VALUE FROM INFORMATION_SCHEMA.CHANGE_STREAM_OPTIONS "
                "WHERE CHANGE_STREAM_NAME = @s AND OPTION_NAME = @o"
            )
            params = {"s": stream, "o": option}
        rows = self._query(sql, params)
        return str(rows[0][0]).strip("'\"") if rows else None

    def watched_tables(self, stream: str) -> frozenset[str] | None:
        """The tables ``stream`` watches, as change records name them; None when it watches
        every table (``FOR ALL``), including tables created later (blocking)."""
        if self.dialect == POSTGRESQL:
            everything_sql = (
                'SELECT "all" FROM information_schema.change_streams WHERE change_stream_name = $1'
            )
            tables_sql = (
                "SELECT table_schema, table_name FROM information_schema.change_stream_tables "
                "WHERE change_stream_name = $1"
            )
            params = {"p1": stream}
        else:
            everything_sql = (
                "SELECT `ALL` FROM INFORMATION_SCHEMA.CHANGE_STREAMS WHERE CHANGE_STREAM_NAME = @s"
            )
            tables_sql = (
                "SELECT TABLE_SCHEMA, TABLE_NAME FROM INFORMATION_SCHEMA.CHANGE_STREAM_TABLES "
                "WHERE CHANGE_STREAM_NAME = @s"
            )
            params = {"s": stream}
        # GoogleSQL answers a BOOL, the PostgreSQL dialect 'YES' or 'NO'.
        if any(row[0] in (True, "YES") for row in self._query(everything_sql, params)):
            return None
        return frozenset(self._qualified(schema, table) for schema, table in self._query(tables_sql, params))

    def load_catalog(self) -> CatalogContents:
        """Columns per table and the columns that accept commit timestamps (blocking)."""
        if self.dialect == POSTGRESQL:
            columns_sql = (
                "SELECT table_schema, table_name, column_name, ordinal_position, spanner_type "
                "FROM information_schema.columns "
                "WHERE table_schema NOT IN ('information_schema', 'spanner_sys', 'pg_catalog')"
            )
            commit_sql = (
                "SELECT table_schema, table_name, column_name FROM information_schema.columns "
                "WHERE spanner_type = 'spanner.commit_timestamp'"
            )
        else:
            columns_sql = (
                "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, ORDINAL_POSITION, SPANNER_TYPE "
                "FROM INFORMATION_SCHEMA.COLUMNS "
                "WHERE TABLE_SCHEMA NOT IN ('INFORMATION_SCHEMA', 'SPANNER_SYS')"
            )
            commit_sql = (
                "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME FROM INFORMATION_SCHEMA.COLUMN_OPTIONS "
                "WHERE OPTION_NAME = 'allow_commit_timestamp' AND OPTION_VALUE = 'TRUE'"
            )
        columns: dict[str, list[CatalogColumn]] = {}
        for schema, table, column, position, type_text in self._query(columns_sql):
            if type_text in NOT_CAPTURED:
                continue
            name = self._qualified(schema, table)
            columns.setdefault(name, []).append(
                CatalogColumn.parse(column, int(position), type_text, self.dialect, name)
            )
        commit_columns: dict[str, set[str]] = {}
        for schema, table, column in self._query(commit_sql):
            commit_columns.setdefault(self._qualified(schema, table), set()).add(column)
        return columns, {table: frozenset(names) for table, names in commit_columns.items()}

    def primary_keys(self) -> dict[str, list[str]]:
        """Each table's primary-key columns, in key order (blocking)."""
        if self.dialect == POSTGRESQL:
            sql = (
                "SELECT table_schema, table_name, column_name FROM information_schema.index_columns "
                "WHERE index_type = 'PRIMARY_KEY' "
                "AND table_schema NOT IN ('information_schema', 'spanner_sys', 'pg_catalog') "
                "ORDER BY table_schema, table_name, ordinal_position"
            )
        else:
            sql = (
                "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME FROM INFORMATION_SCHEMA.INDEX_COLUMNS "
                "WHERE INDEX_TYPE = 'PRIMARY_KEY' "
                "AND TABLE_SCHEMA NOT IN ('INFORMATION_SCHEMA', 'SPANNER_SYS') "
                "ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION"
            )
        keys: dict[str, list[str]] = {}
        for schema, table, column in self._query(sql):
            keys.setdefault(self._qualified(schema, table), []).append(column)
        return keys

    @staticmethod
    def _qualified(schema: str, table: str) -> str:
        """Table names as change records spell them: ``schema.table`` for named schemas only."""
        return table if schema in ("", "public") else f"{schema}.{table}"

    def read(
        self, query: ChangeStreamQuery, token: str | None, start_micros: int
    ) -> Iterator[list[ChangeStreamRecord]]:
        """The query's rows as parsed records, one list per row (runs on a worker thread)."""
        params, types = query.params(token, start_micros)
        with self.database.snapshot() as snapshot:
            results = snapshot.execute_sql(
                query.sql, params=params, param_types=types, request_options=self.request_options
            )
            for row in results:
                if self.dialect == POSTGRESQL:
                    records = list(records_from_json(row[0]))
                else:
                    records = list(records_from_googlesql_row(row, results.fields))
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
