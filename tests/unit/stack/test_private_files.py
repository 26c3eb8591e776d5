"""The embedded PostgreSQL's password file is its owner's alone, whatever was there before."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from spanner_cdc.stack.services import write_private

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("existing_mode", [None, 0o644, 0o666])
def test_the_password_file_is_0600(tmp_path: Path, existing_mode: int | None) -> None:
    passfile = tmp_path / "postgres.pgpass"
    if existing_mode is not None:
        passfile.write_text("old\n")
        passfile.chmod(existing_mode)
    write_private(passfile, "127.0.0.1:5432:*:postgres:secret\n")
    assert stat.S_IMODE(passfile.stat().st_mode) == 0o600
    assert passfile.read_text() == "127.0.0.1:5432:*:postgres:secret\n"
