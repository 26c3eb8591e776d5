"""The Spanner database the producer reads: opened and checked once at start, with its dialect,
and the one way its start-up queries run (a snapshot, the configured priority)."""

from __future__ import annotations

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
from spanner_cdc.producer.change_stream_rules import GOOGLE_STANDARD_SQL, POSTGRESQL
from spanner_cdc.producer.config import PublishSettings
from spanner_cdc.producer.errors import SpannerSetupError

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
class SpannerDatabase:
    #: The client's database handle (snapshots for every read of the producer).
    database: Any
    dialect: str
    database_path: str
    #: How long the start's requests may take (``--connect-timeout-seconds``).
    answer_seconds: float
    #: Sent with every query (its priority); None leaves Spanner's default.
    request_options: RequestOptions | None = None

    @classmethod
    async def open(cls, config: PublishSettings) -> SpannerDatabase:
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
        [[dialect]] = await call_with_deadline(lambda: probe.query(DIALECT_SQL), probe.answer_seconds)
        # The emulator's GetDatabase leaves the dialect unset, and the client re-reads the
        # database on every access while it is unset: give the handle the dialect we found.
        handle = client.instance(instance).database(
            database, database_dialect=DIALECTS[dialect], database_role=role
        )
        return cls(handle, dialect, path, config.connect_timeout_seconds, options)

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        """A query of the schema or options: its rows (blocking; string parameters only)."""
        types = {name: spanner.param_types.STRING for name in params or {}}
        with self.database.snapshot() as snapshot:
            rows = snapshot.execute_sql(
                sql, params=params, param_types=types, request_options=self.request_options
            )
            return [list(row) for row in rows]
