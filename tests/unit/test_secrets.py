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
    ],
)
def test_secrets_are_hidden(text: str, shown: str) -> None:
    assert shown in redact(text)
    assert "hunter2" not in redact(text) and "p%40ss" not in redact(text)


def test_text_without_secrets_is_unchanged() -> None:
    text = "postgresql://postgres@127.0.0.1:5432/postgres (local)"
    assert redact(text) == text
