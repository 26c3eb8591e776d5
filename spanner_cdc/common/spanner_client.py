"""Spanner client construction, for real Spanner and for the emulator alike."""

from __future__ import annotations

import os
from typing import Any

from google.auth.credentials import AnonymousCredentials
from google.cloud import spanner


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
