"""The Spanner access options reach the client (the emulator has no credentials, endpoints or
fine-grained access control to prove them against; the end-to-end run with a role and a
priority is in ``test_producer_errors.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import google.cloud.spanner_v1.client
import pytest
from google.oauth2.credentials import Credentials as UserCredentials

from spanner_cdc.common.spanner_client import SPANNER_DATA_SCOPE, CredentialsFileError, cloud_client

pytestmark = pytest.mark.unit


def test_a_credentials_file_and_an_endpoint_make_the_client(tmp_path: Path) -> None:
    user = {"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"}
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps(user))
    client = cloud_client("proj", path, "spanner.europe-west1.rep.googleapis.com")
    assert isinstance(client.credentials, UserCredentials)
    assert client.credentials.scopes == [SPANNER_DATA_SCOPE]
    assert client._client_options.api_endpoint == "spanner.europe-west1.rep.googleapis.com"
    # No exporter to Cloud Monitoring: with Spanner-only credentials it would log an error a minute.
    assert not google.cloud.spanner_v1.client._metrics_monitor_initialized


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"type": "external_account", "audience": "a"}', "are read from GOOGLE_APPLICATION_CREDENTIALS"),
        ('{"type": "service_account", "private_key": "no"}', "credentials.json"),
        ("not json", "credentials.json"),
    ],
)
def test_a_file_it_cannot_use_is_one_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "credentials.json"
    path.write_text(content)
    with pytest.raises(CredentialsFileError, match=message):
        cloud_client("proj", path, None)
