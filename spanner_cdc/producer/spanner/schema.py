"""What the database says about itself: the change stream and its options, the tables it
watches, their columns and primary keys (the information schema, in either dialect)."""

from __future__ import annotations

from dataclasses import dataclass

from spanner_cdc.common.blocking import call_with_deadline
from spanner_cdc.producer.change_stream_rules import POSTGRESQL, refuse_partition_mode
from spanner_cdc.producer.errors import SpannerSetupError
from spanner_cdc.producer.spanner.catalog import NOT_CAPTURED, CatalogColumn, CatalogContents
from spanner_cdc.producer.spanner.database import SpannerDatabase


@dataclass(frozen=True)
class SpannerSchema:
    db: SpannerDatabase

    async def check_change_stream(self, stream: str) -> None:
        """A missing stream is one clear error at start, not a failing query per partition."""
        if self.db.dialect == POSTGRESQL:
            sql = "SELECT 1 FROM information_schema.change_streams WHERE change_stream_name = $1"
            params = {"p1": stream}
        else:
            sql = "SELECT 1 FROM INFORMATION_SCHEMA.CHANGE_STREAMS WHERE CHANGE_STREAM_NAME = @s"
            params = {"s": stream}
        if not await call_with_deadline(lambda: self.db.query(sql, params), self.db.answer_seconds):
            raise SpannerSetupError(f"change stream {stream!r} does not exist in {self.db.database_path}")
        mode = await call_with_deadline(
            lambda: self.stream_option(stream, "partition_mode"), self.db.answer_seconds
        )
        refuse_partition_mode(stream, mode)

    def stream_option(self, stream: str, option: str) -> str | None:
        """One option of ``stream`` (unquoted); None when it was not set (blocking)."""
        if self.db.dialect == POSTGRESQL:
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
        rows = self.db.query(sql, params)
        return str(rows[0][0]).strip("'\"") if rows else None

    def watched_tables(self, stream: str) -> frozenset[str] | None:
        """The tables ``stream`` watches, as change records name them; None when it watches
        every table (``FOR ALL``), including tables created later (blocking)."""
        if self.db.dialect == POSTGRESQL:
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
        if any(row[0] in (True, "YES") for row in self.db.query(everything_sql, params)):
            return None
        return frozenset(
            self._qualified(schema, table) for schema, table in self.db.query(tables_sql, params)
        )

    def load_catalog(self) -> CatalogContents:
        """Columns per table and the columns that accept commit timestamps (blocking)."""
        if self.db.dialect == POSTGRESQL:
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
        for schema, table, column, position, type_text in self.db.query(columns_sql):
            if type_text in NOT_CAPTURED:
                continue
            name = self._qualified(schema, table)
            columns.setdefault(name, []).append(
                CatalogColumn.parse(column, int(position), type_text, self.db.dialect, name)
            )
        commit_columns: dict[str, set[str]] = {}
        for schema, table, column in self.db.query(commit_sql):
            commit_columns.setdefault(self._qualified(schema, table), set()).add(column)
        return columns, {table: frozenset(names) for table, names in commit_columns.items()}

    def primary_keys(self) -> dict[str, list[str]]:
        """Each table's primary-key columns, in key order (blocking)."""
        if self.db.dialect == POSTGRESQL:
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
        for schema, table, column in self.db.query(sql):
            keys.setdefault(self._qualified(schema, table), []).append(column)
        return keys

    @staticmethod
    def _qualified(schema: str, table: str) -> str:
        """Table names as change records spell them: ``schema.table`` for named schemas only."""
        return table if schema in ("", "public") else f"{schema}.{table}"
