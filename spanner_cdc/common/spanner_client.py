"""Spanner client construction, for real Spanner and for the emulator alike."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from google.auth.credentials import AnonymousCredentials
from google.cloud import spanner
from google.oauth2 import credentials as user_credentials
from google.oauth2 import service_account

from spanner_cdc.errors import SpannerCdcError


def emulator_host(given: str | None) -> str | None:
    """The emulator to use: the option if given, else the client libraries' SPANNER_EMULATOR_HOST."""
    return given or os.environ.get("SPANNER_EMULATOR_HOST") or None


def emulator_client(host: str, project: str) -> Any:
    """A client for the emulator at ``host:port``.

    Anonymous credentials plus an explicit endpoint put the client in emulator mode (plain-text
    gRPC) without touching the process environment; built-in metrics are off because their
    exporter would try to reach Google Cloud Monitoring.
    """
    return spanner.Client(
        project=project,
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        client_options={"api_endpoint": host},
        disable_builtin_metrics=True,
    )


#: What a change-stream reader needs of Cloud Spanner: its data (queries, sessions).
SPANNER_DATA_SCOPE = "https://www.googleapis.com/auth/spanner.data"


def cloud_client(project: str, credentials_file: Path | None, endpoint: str | None) -> Any:
    """A client for Cloud Spanner: credentials from ``credentials_file`` or else application
    default credentials; ``endpoint`` for a regional endpoint or Private Service Connect instead
    of spanner.googleapis.com. Raises CredentialsFileError for a file it cannot use, and
    ``google.auth.exceptions.DefaultCredentialsError`` when there are no credentials at all.

    The client library's built-in metrics are off: they are exported to Cloud Monitoring every
    minute with these same credentials, which a credentials file here scopes to Spanner's data
    alone, so each export would fail and log an error line (seen at the end of a test run that
    only made a client); the producer's own metrics are on its Prometheus endpoint."""
    credentials = None if credentials_file is None else _credentials_from(credentials_file)
    return spanner.Client(
        project=project,
        credentials=credentials,
        client_options={"api_endpoint": endpoint} if endpoint else None,
        disable_builtin_metrics=True,
    )


class CredentialsFileError(SpannerCdcError):
    """A --credentials-file that is not a credentials file this client reads."""


def _credentials_from(path: Path) -> Any:
    """A service account key or a user's credentials, by the file's own ``type``: the loaders
    for each type, not google.auth's generic one (deprecated: it also runs whatever an external
    account configuration names). Other types (workload identity federation) are read by
    application default credentials from GOOGLE_APPLICATION_CREDENTIALS."""
    try:
        kind = json.loads(path.read_text()).get("type")
        if kind == "service_account":
            return service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                str(path), scopes=[SPANNER_DATA_SCOPE]
            )
        if kind == "authorized_user":
            return user_credentials.Credentials.from_authorized_user_file(  # type: ignore[no-untyped-call]
                str(path), scopes=[SPANNER_DATA_SCOPE]
            )
    except (OSError, ValueError, AttributeError) as exc:
        raise CredentialsFileError(f"{path}: {str(exc).splitlines()[0][:200]}") from None
    raise CredentialsFileError(
        f"{path}: credentials of type {kind!r} are read from GOOGLE_APPLICATION_CREDENTIALS; "
        "--credentials-file takes service_account and authorized_user files"
    )


def create_emulator_database(
    host: str,
    project: str,
    instance_id: str,
    database_id: str,
    ddl: list[str],
    *,
    dialect: str = "GOOGLE_STANDARD_SQL",
) -> Any:
    """A new database on the emulator; the instance is created on first use."""
    from google.cloud.spanner_admin_database_v1.types import DatabaseDialect

    instance = emulator_client(host, project).instance(
        instance_id, configuration_name=f"projects/{project}/instanceConfigs/emulator-config", node_count=1
    )
    if not instance.exists():
        instance.create().result(60)
    if dialect == "POSTGRESQL":
        database = instance.database(database_id, database_dialect=DatabaseDialect.POSTGRESQL)
        database.create().result(60)
        database.update_ddl(ddl).result(60)
    else:
        database = instance.database(database_id, ddl_statements=ddl)
        database.create().result(60)
    return database
