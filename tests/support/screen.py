"""What a person sees: the project's own log lines (``common/logs.py``'s text format), nothing else."""

from __future__ import annotations

import re

LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) spanner_cdc[\w.]*: ")


def foreign_lines(stderr: str) -> list[str]:
    """Lines of ``stderr`` that are not the project's own log lines (a library's log, a stack trace)."""
    return [line for line in stderr.splitlines() if not LOG_LINE.match(line)]
