"""Local service processes: own process group, logs to a file, real readiness, clean stop.

Every service of the embedded stack is a child process tree (the emulator's gateway starts
``emulator_main`` as its own child), so each one runs in a new session and is stopped by
signalling the whole group: stopping only the leader would leave grandchildren behind.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spanner_cdc.errors import SpannerCdcError

LOG_TAIL_LINES = 40


class ServiceError(SpannerCdcError):
    """A service could not be started, reached or resolved; the message says what to do."""


#: Where :func:`free_port` looks when the kernel's ephemeral range cannot be read (Linux's default).
EPHEMERAL_LOW_DEFAULT = 32768
#: The lowest port :func:`free_port` hands out: above the well-known and most registered ports.
LOWEST_PORT = 10000
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW_DEFAULT


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for a child process to bind.

    The port is chosen below the kernel's ephemeral range, not with ``bind(0)``: the caller lets
    go of it and a child binds it later, and meanwhile a port from the ephemeral range can be
    handed to any outgoing connection or any other ``bind(0)`` on the machine (Spark's, the
    JVM's) — a CI run lost a test to exactly that (``Errno 98: Address already in use``). Below
    the range only explicit binds compete, and this process never hands out a port twice.
    """
    high = _ephemeral_low()
    candidates = [port for port in range(LOWEST_PORT, high) if port not in _handed_out]
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise ServiceError(f"no free TCP port on 127.0.0.1 between {LOWEST_PORT} and {high}")


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The end of a log file, for error messages that must show why a service died."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class LocalProcess:
    """A started service process group. ``pgid`` is all another process needs to stop it."""

    name: str
    pgid: int
    log_path: Path

    @classmethod
    def start(
        cls,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        **account: Any,
    ) -> LocalProcess:
        """``account``: ``user``, ``group`` and ``extra_groups`` for :class:`subprocess.Popen`."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=cwd,
                **account,
            )
        return cls(name, process.pid, log_path)

    def is_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return _leader_alive(self.pgid)

    def wait_ready(self, probe: Callable[[], None], timeout: float) -> None:
        """Call ``probe`` until it succeeds; fail with the log's tail if it never does."""

        def check_alive() -> None:
            if not self.is_alive():
                raise ServiceError(f"{self.name} exited during start-up")

        try:
            wait_until_ready(self.name, probe, timeout, check_alive)
        except ServiceError as exc:
            raise ServiceError(f"{exc}; log {self.log_path}:\n{log_tail(self.log_path)}") from exc

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the group, then SIGKILL whatever is left after ``grace`` seconds."""
        stop_process_group(self.pgid, grace)


def wait_until_ready(
    name: str, probe: Callable[[], None], timeout: float, check_alive: Callable[[], None] | None = None
) -> None:
    """Retry ``probe`` until it returns; ``check_alive`` may raise to give up early."""
    deadline = time.monotonic() + timeout
    while True:
        if check_alive is not None:
            check_alive()
        try:
            probe()
            return
        except Exception as exc:  # a probe fails in the service's own ways; all mean "not yet"
            if time.monotonic() > deadline:
                raise ServiceError(f"{name} not ready after {timeout:.0f}s (last error: {exc})") from exc
        time.sleep(0.2)


def stop_process_group(pgid: int, grace: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pgid)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    _reap(pgid)


def _reap(pid: int) -> None:
    """Collect our own exited child so it does not linger as a zombie in the group."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _leader_alive(pid: int) -> bool:
    """False when the group leader is a zombie (exited, not yet reaped) or gone."""
    try:
        waited_pid, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        stat = Path(f"/proc/{pid}/stat")
        try:
            return stat.read_text().split(") ", 1)[1][0] != "Z"
        except (OSError, IndexError):
            return False
    return waited_pid == 0
