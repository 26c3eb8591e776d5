"""What :func:`redact` hides in text a person or a log file may see."""

from __future__ import annotations

import pytest

from spanner_cdc.common.secrets import redact

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://u:hunter2@h:5432/db", "postgresql://u:<hidden>@h:5432/db"),
        ("SPANNER_CDC_POSTGRES_DSN=postgres://u:p%40ss@h/d does not answer", "postgres://u:<hidden>@h/d"),
        ("host=h password=hunter2 dbname=d", "host=h password=<hidden> dbname=d"),
        ("host=h password='hun ter2' dbname=d", "host=h password=<hidden> dbname=d"),
        ("sasl.password=hunter2", "sasl.password=<hidden>"),
        ('sasl.jaas.config="x y hunter2";', "sasl.jaas.config=<hidden>"),
        ("postgresql://u:p@hunter2@h/db", "postgresql://u:<hidden>@h/db"),
        ("basic.auth.user.info=u:hunter2", "basic.auth.user.info=<hidden>"),
        ("Authorization: Basic hunter2 sent", "Authorization: <hidden> sent"),
        ("Authorization: hunter2", "Authorization: <hidden>"),
        ("aws_secret_access_key=hunter2", "aws_secret_access_key=<hidden>"),
        ("fs.s3a.access.key=hunter2", "fs.s3a.access.key=<hidden>"),
        ("api_key: hunter2", "api_key: <hidden>"),
    ],
)
def test_secrets_are_hidden(text: str, shown: str) -> None:
    assert shown in redact(text)
    assert "hunter2" not in redact(text) and "p%40ss" not in redact(text)


def test_text_without_secrets_is_unchanged() -> None:
    for text in (
        "postgresql://postgres@127.0.0.1:5432/postgres (local)",
        "s3a://bucket/path@v2 and a@b.example",
        "the primary key=Id of Accounts",
    ):
        assert redact(text) == text
