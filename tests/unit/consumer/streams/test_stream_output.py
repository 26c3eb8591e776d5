"""What ``--format table`` shows: values as they are, never as markup or terminal commands."""

from __future__ import annotations

import io

import pytest

from spanner_cdc.consumer.streams.output import write_rows

pytestmark = pytest.mark.unit


def table_of(*values: str) -> str:
    out = io.StringIO()
    write_rows(["Note [b]"], [[value] for value in values], "table", out)
    return out.getvalue()


def test_markup_in_values_and_names_is_shown_as_text() -> None:
    shown = table_of("[/bold]", "[red]x[/red]")
    assert "[/bold]" in shown and "[red]x[/red]" in shown and "Note [b]" in shown


def test_control_characters_are_shown_as_escapes() -> None:
    shown = table_of("\x1b[31mred", "a\rb", "bell\x07")
    assert not any(char in shown for char in "\x1b\r\x07")
    assert "\\x1b[31mred" in shown and "a\\rb" in shown and "bell\\x07" in shown
