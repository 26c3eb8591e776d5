"""Structured logs: one line per event of interest, as text or JSON (``--log-format json``)."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


#: ``--log-level`` names.
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
#: The loggers ``--log-level`` sets; below them third-party libraries (py4j, grpc, urllib3)
#: would bury a debug run in their own lines, so the root logger stays at info or above.
PROJECT_LOGGERS = ("spanner_cdc",)


def configure(log_format: str, level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(LEVELS[level], logging.INFO))
    for name in PROJECT_LOGGERS:
        logging.getLogger(name).setLevel(LEVELS[level])
