"""The embedded stack: Spanner emulator, Kafka-protocol broker and PostgreSQL on free ports.

Used by the tests (session fixtures), ``make demo``, the benchmarks and, for people,
``spanner-cdc stack up|down|status``. Services that were started here are stopped here, also
when start-up fails half-way, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from spanner_cdc.stack.process import ServiceError
from spanner_cdc.stack.services import (
    ServiceHandle,
    probe_error,
    probe_kafka,
    probe_postgres,
    probe_spanner,
    start_kafka,
    start_postgres,
    start_spanner,
)

__all__ = ["SERVICES", "EmbeddedStack", "ServiceError", "stop_on_signals"]

SERVICES = ("spanner", "kafka", "postgres")
PROBES: dict[str, Callable[[str], None]] = {
    "spanner": probe_spanner,
    "kafka": probe_kafka,
    "postgres": probe_postgres,
}
STATE_FILE = "state.json"


@dataclass
class EmbeddedStack:
    """Started services by name, and the work directory holding their data and logs."""

    workdir: Path
    services: dict[str, ServiceHandle] = field(default_factory=dict)
    owns_workdir: bool = False

    @classmethod
    def start(
        cls,
        workdir: Path | None = None,
        names: tuple[str, ...] = SERVICES,
        churn_seconds: int | None = None,
    ) -> EmbeddedStack:
        """Start ``names`` in order; if one fails, stop those already started and re-raise."""
        unknown = set(names) - set(SERVICES)
        if unknown:
            raise ServiceError(f"unknown service(s) {sorted(unknown)}; choose from {list(SERVICES)}")
        owns = workdir is None
        # Absolute: each service runs in a directory of its own and is handed paths under the root.
        root = Path(tempfile.mkdtemp(prefix="spanner-cdc-stack-")) if workdir is None else workdir.resolve()
        root.mkdir(parents=True, exist_ok=True)
        stack = cls(root, owns_workdir=owns)
        starters: dict[str, Callable[[], ServiceHandle]] = {
            "spanner": lambda: start_spanner(root, churn_seconds),
            "kafka": lambda: start_kafka(root),
            "postgres": lambda: start_postgres(root),
        }
        try:
            for name in names:
                stack.services[name] = starters[name]()
        except BaseException:
            stack.stop()
            raise
        return stack

    def endpoint(self, name: str) -> str:
        return self.services[name].endpoint

    def stop(self) -> None:
        """Stop every service this stack started; remove the work directory if it made it."""
        errors = []
        for handle in reversed(list(self.services.values())):
            try:
                handle.stop()
            except Exception as exc:  # keep stopping the others; report all at the end
                errors.append(f"{handle.name}: {exc}")
        self.services.clear()
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise ServiceError("could not stop: " + "; ".join(errors))

    def status(self) -> dict[str, str]:
        """``name → "ready" | error text`` by probing each service now."""
        result = {}
        for name, handle in self.services.items():
            try:
                PROBES[name](handle.endpoint)
                result[name] = "ready"
            except Exception as exc:
                result[name] = f"not answering: {probe_error(exc)}"
        return result

    def save(self) -> Path:
        """Write the state ``stack down``/``status`` need to find these services later."""
        path = self.workdir / STATE_FILE
        state: dict[str, Any] = {
            "owns_workdir": self.owns_workdir,
            "services": {name: handle.to_json() for name, handle in self.services.items()},
        }
        path.write_text(json.dumps(state, indent=2))
        return path

    @classmethod
    def load(cls, workdir: Path) -> EmbeddedStack:
        path = workdir / STATE_FILE
        if not path.is_file():
            raise ServiceError(f"no stack state at {path}: is a stack up there?")
        state = json.loads(path.read_text())
        services = {name: ServiceHandle.from_json(handle) for name, handle in state["services"].items()}
        return cls(workdir, services, owns_workdir=bool(state["owns_workdir"]))


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM into SystemExit for the duration, so ``finally`` blocks stop services.

    Ctrl-C already raises KeyboardInterrupt; SIGTERM (CI cancelling a job, ``kill``) would
    otherwise end the process without running any clean-up.
    """

    def raise_exit(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
