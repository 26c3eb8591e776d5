"""Rows for a person or a script: a table, JSON lines or CSV (``--format``)."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

FORMATS = ("table", "json", "csv")
#: Off a terminal (a pipe, a file) rich would assume 80 columns; a stream's row is wider.
WIDEST_TABLE = 160
#: Characters a terminal would obey rather than show (newlines and tabs are shown as such).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def write_rows(
    names: Sequence[str], rows: Sequence[Sequence[Any]], output_format: str, out: TextIO = sys.stdout
) -> None:
    if output_format == "json":
        for row in rows:
            out.write(json.dumps(dict(zip(names, map(plain, row), strict=True)), ensure_ascii=False) + "\n")
    elif output_format == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        writer.writerows([[_csv_text(plain(v)) for v in row] for row in rows])
    else:
        table = Table(show_lines=False)
        for name in names:
            table.add_column(_shown(name), overflow="fold")  # wrapped, never cut: a value is read whole
        for row in rows:
            table.add_row(*(Text("NULL") if v is None else _shown(str(_csv_text(plain(v)))) for v in row))
        Console(file=out, width=max(WIDEST_TABLE, Console(file=out).width)).print(table)


def _shown(text: str) -> Text:
    """``text`` as it is: never read as rich markup (``[red]`` stays text, ``[/bold]`` no error),
    control characters as their escapes (``\\x1b``), so a value cannot drive the terminal."""
    return Text(_CONTROL.sub(lambda found: repr(found.group())[1:-1], text))


def plain(value: Any) -> Any:
    """A value JSON can hold exactly: timestamps in RFC 3339, NUMERIC as text, bytes as base64."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def _csv_text(value: Any) -> Any:
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else value
