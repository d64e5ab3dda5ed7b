"""A sidecar's lifecycle lines on stderr: JSON objects, one per line, like the call log's.

    {"ts": "2026-11-30T04:32:00.123Z", "event": "sidecar.serving", "sidecar": "seedstore",
     "addresses": ["unix:/run/seedstore.sock"]}

Events: `sidecar.serving` (`addresses`; the negotiator adds `adapters`),
`sidecar.metrics` (`url`), `sidecar.draining` (`grace_seconds`, on
SIGTERM/SIGINT), `sidecar.stopped`, and `sidecar.log` for the logging
module's records (`level`, `logger`, `message`, `exception` with the
traceback when there is one). The READY line stays plain text on stdout,
which carries nothing else: launchers and scripts wait for it.

Why JSON on stderr rather than a stream of their own: a container has only
stdout and stderr, and stdout is the READY line's. With every stderr line a
JSON object, log shippers read one format, and no line shares a line with
another: while the call log writes to stderr, lifecycle lines go through its
writer (whole lines, in order with the calls), and every other line is
written in one `write` call, as the logging handler writes its records.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable
from typing import Any, TextIO

from agentsidecar.sidecar_runtime.observability import CallLog, _timestamp


def lifecycle_line(event: str, sidecar: str, **fields: Any) -> str:
    record = {"ts": _timestamp(time.time()), "event": f"sidecar.{event}", "sidecar": sidecar, **fields}
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str)


def announce(event: str, sidecar: str, writers: Iterable[CallLog | None] = (), **fields: Any) -> None:
    """Write one lifecycle line on stderr, through the first of `writers` that writes to stderr."""
    line = lifecycle_line(event, sidecar, **fields)
    for writer in writers:
        if writer is not None and writer.writes_to(sys.stderr):
            writer.write_line(line)
            return
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class JsonLogFormatter(logging.Formatter):
    """A logging record as one `sidecar.log` JSON line."""

    def __init__(self, sidecar: str) -> None:
        super().__init__()
        self._sidecar = sidecar

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "event": "sidecar.log",
            "sidecar": self._sidecar,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        return json.dumps(fields, ensure_ascii=False, separators=(",", ":"), default=str)


def log_json(sidecar: str, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Send the logging module's records to `stream` (stderr) as `sidecar.log` lines."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonLogFormatter(sidecar))
    logging.basicConfig(level=level, handlers=[handler])
