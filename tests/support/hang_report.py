"""``python -X faulthandler tests/support/hang_report.py MODULE ARG…`` runs ``python -m MODULE
ARG…``, able to say where it hangs: SIGUSR1 prints every asyncio task's chain of awaits to
stderr (a thread dump alone shows an idle event loop, not what its tasks wait for), and with
``-X faulthandler`` SIGABRT then prints every thread's stack as the process dies.

Run by its path, not as ``-m tests.support…``, so it starts from any working directory (a test
may run a command elsewhere); it imports nothing of the repository, and puts the working
directory first on ``sys.path`` as ``python -m`` would.

Test plumbing: ``tests.support.stopping`` sends both to a process that did not end after
SIGTERM, so the failure names the await the process hung at.
"""

from __future__ import annotations

import asyncio
import os
import runpy
import signal
import sys
from types import FrameType
from typing import Any

#: The interpreter flags and launcher in front of the module a test runs.
HANG_REPORT = ("-X", "faulthandler", __file__)


def await_chain(task: asyncio.Task[Any]) -> list[str]:
    """Where each coroutine of ``task`` stands, outermost first, down to what it awaits."""
    lines: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
        if frame is None:
            lines.append(f"    awaiting {awaited!r}")
            break
        lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    return lines


def report_tasks(_signum: int, _frame: FrameType | None) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        print("hang report: no event loop running", file=sys.stderr)
        return
    for task in asyncio.all_tasks(loop):
        print(f"hang report: task {task.get_name()}", file=sys.stderr)
        print("\n".join(await_chain(task)), file=sys.stderr)
    sys.stderr.flush()


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, report_tasks)
    sys.path[0] = os.getcwd()  # this file's directory, as a script; the working one, as -m
    module = sys.argv[1]
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
