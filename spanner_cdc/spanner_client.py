"""Spanner client construction, for real Spanner and for the emulator alike."""

from __future__ import annotations

from typing import Any

from google.auth.credentials import AnonymousCredentials
from google.cloud import spanner


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
