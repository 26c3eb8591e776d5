"""A live progress line for long work: redrawn in a terminal, logged every so often otherwise."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.text import Text

from spanner_cdc.common.waiting import set_within

log = logging.getLogger("spanner_cdc.common.progress")
LOG_EVERY_SECONDS = 10.0


async def show_progress(render: Callable[[], str], stop: asyncio.Event, enabled: bool = True) -> None:
    """Until ``stop`` is set: a rich Live line on a terminal, else a log line every 10 s."""
    console = Console(stderr=True)
    if not enabled:
        await stop.wait()
        return
    if console.is_terminal:
        with Live(Text(render()), console=console, refresh_per_second=2, transient=True) as live:
            while not stop.is_set():
                live.update(Text(render()))
                await set_within(stop, 0.5)
        return
    while not stop.is_set():
        await set_within(stop, LOG_EVERY_SECONDS)
        log.info(render())
