"""One blocking Spanner read on a worker thread, its items handed to the event loop: a
change-stream query's records, or a backfill partition's rows.

The Spanner client is blocking (a gRPC server stream), so each running partition iterates its
query on a thread of its own and parses rows there; the loop receives parsed records. A bounded
number of rows may wait in between, which is the back-pressure that keeps a fast partition from
filling memory while Kafka is slow.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from spanner_cdc.producer.errors import QueryStalledError

ROWS_IN_FLIGHT = 256
_END = object()
Item = TypeVar("Item")


class QueryStream(Generic[Item]):
    """Runs ``rows()`` on a daemon thread; :meth:`next` returns its records in order.

    :meth:`stop` asks the thread to quit at its next row: the client offers no way to cancel a
    blocked stream, but heartbeats guarantee a row within one heartbeat interval, and an
    abandoned thread's rows are never delivered.
    """

    def __init__(self, name: str, rows: Callable[[], Iterator[Item]]) -> None:
        self._rows = rows
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._slots = threading.BoundedSemaphore(ROWS_IN_FLIGHT)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"query-{name[:12]}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    async def next(self, timeout: float) -> Item | None:
        """The next item; None when the read ended normally; raises its error."""
        try:
            async with asyncio.timeout(timeout):  # not wait_for, which may drop a cancel (common.waiting)
                item = await self._queue.get()
        except TimeoutError:
            raise QueryStalledError(f"no row for {timeout:.0f}s") from None
        self._slots.release()
        if item is _END:
            return None
        if isinstance(item, BaseException):
            raise item
        result: Item = item
        return result

    def _run(self) -> None:
        try:
            for item in self._rows():
                if not self._hand_over(item):
                    return
        except Exception as exc:  # delivered to the loop, which classifies it
            self._hand_over(exc)
            return
        self._hand_over(_END)

    def _hand_over(self, item: Any) -> bool:
        while not self._slots.acquire(timeout=0.5):
            if self._stopped.is_set():
                return False
        if self._stopped.is_set():
            return False
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop closed while this thread waited: nobody is listening
            return False
        return True
