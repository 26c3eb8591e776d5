"""Blocking calls with a deadline that does not hold up process exit.

``asyncio.to_thread`` runs on the default executor, which ``asyncio.run`` waits for at exit: a
client call stuck on an unreachable server (the Spanner client retries for minutes) would keep
the process alive long after the clear error was printed. Set-up calls run on daemon threads
instead, so giving up on them really ends the process.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def call_with_deadline(function: Callable[[], T], timeout: float) -> T:
    """``function()`` on a daemon thread; TimeoutError after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def run() -> None:
        try:
            result = function()
        except BaseException as exc:  # handed to the awaiting coroutine as is
            error = exc
            _deliver(loop, lambda: settle(lambda: future.set_exception(error)))
        else:
            _deliver(loop, lambda: settle(lambda: future.set_result(result)))

    threading.Thread(target=run, name="blocking-call", daemon=True).start()
    async with asyncio.timeout(timeout):  # not wait_for, which may drop a cancel (common.waiting)
        return await future


def _deliver(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # the loop is gone: nobody waits for this result any more
        return


async def loop_on_thread_until(step: Callable[[], object], stop: asyncio.Event) -> None:
    """Call ``step`` (blocking, e.g. one poll of a Kafka consumer) again and again on a worker
    thread until ``stop`` is set; an exception from ``step`` ends it and is raised here."""
    stopping = threading.Event()

    def repeat() -> None:
        while not stopping.is_set():
            step()

    looping = asyncio.ensure_future(asyncio.to_thread(repeat))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([looping, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.set()
        stopped.cancel()
        await asyncio.gather(looping, return_exceptions=True)
    looping.result()
