"""What a sidecar tells its operator: one JSON line per call, Prometheus metrics, optional tracing.

Each call that reaches a handler produces one line (on stderr, or a file):

    {"ts": "2026-11-30T04:32:00.123Z", "service": "agentsidecar.seedstore.v1.SeedStoreService",
     "method": "AddSeed", "status": "PERMISSION_DENIED", "duration_ms": 0.412,
     "peer": "unix:", "request_id": "3f2a...", "error_reason": "TOKEN_INVALID"}

`status` is the final status code's name, also for streams, aborts, client
cancels (CANCELLED) and expired deadlines (DEADLINE_EXCEEDED); `error_reason`
(failed calls only) is the ErrorInfo reason, or null when the status has
none. `request_id` is the caller's `x-request-id` metadata, else a fresh id.
Calls grpc refuses before any handler runs (a message over the size limit)
are not seen here; unknown methods are logged as UNIMPLEMENTED.

Lines are formatted and written by a background thread every 50 ms from a
bounded queue (10,000 lines), so a slow or blocked stderr never stalls the
event loop; lines that do not fit are dropped and counted
(`sidecar_call_log_dropped_total`).
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import itertools
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import grpc
from google.rpc import error_details_pb2, status_pb2

from sidecar_runtime.handlers import Behavior, Continuation, Handler, WrapCache, service_and_method
from sidecar_runtime.metrics import (
    METRICS,
    SidecarMetrics,
    record_refusal,
    record_refusals,
    record_verification,
)

__all__ = [
    "METRICS",
    "CallLog",
    "ObservabilityInterceptor",
    "final_status",
    "open_call_log",
    "otel_interceptor",
    "record_refusal",
    "record_refusals",
    "record_verification",
]

REQUEST_ID_KEY = "x-request-id"
STATUS_DETAILS_KEY = "grpc-status-details-bin"
MAX_REQUEST_ID_CHARS = 128
MAX_PENDING_LINES = 10_000
FLUSH_INTERVAL_SECONDS = 0.05
DEADLINE_TOLERANCE_SECONDS = 0.1
UNKNOWN_METHOD_LABEL = "unknown"  # unknown methods share one label: clients choose their names
OTEL_PACKAGE = "opentelemetry-instrumentation-grpc"


class CallLog:
    """JSON lines written by a daemon thread; `write` never blocks and never serializes.

    The thread wakes every `flush_interval` seconds (not per line, which
    would hand the GIL back and forth on every call), formats what has
    accumulated and writes it in one go. A record's `ts` is an epoch float,
    written as RFC 3339 UTC with milliseconds.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        close_stream: bool,
        on_drop: Callable[[], None] = lambda: None,
        flush_interval: float = FLUSH_INTERVAL_SECONDS,
        max_pending: int = MAX_PENDING_LINES,
    ) -> None:
        self._stream = stream
        self._close_stream = close_stream
        self._on_drop = on_drop
        self._flush_interval = flush_interval
        self._max_pending = max_pending
        self._pending: collections.deque[dict[str, Any]] = collections.deque()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sidecar-call-log", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any]) -> None:
        if len(self._pending) >= self._max_pending:
            self._on_drop()
            return
        self._pending.append(record)

    async def close(self) -> None:
        """Write what is pending, then stop the thread (and close the file it owns)."""
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        self._closing.set()
        self._thread.join(timeout=10)
        if self._close_stream:
            self._stream.close()

    def _run(self) -> None:
        while not self._closing.wait(self._flush_interval):
            self._flush()
        self._flush()

    def _flush(self) -> None:
        lines: list[str] = []
        while self._pending:
            record = self._pending.popleft()
            if isinstance(record.get("ts"), float):
                record["ts"] = _timestamp(record["ts"])
            try:
                lines.append(json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str))
            except ValueError:  # a circular record: lose the line, not the thread
                self._on_drop()
        if not lines:
            return
        try:
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()
        except (OSError, ValueError):
            for _ in lines:
                self._on_drop()


def open_call_log(destination: str, metrics: SidecarMetrics = METRICS) -> CallLog:
    """`-` for stderr, else a file opened for appending (created if missing).

    Raises:
        RuntimeError: the file cannot be opened.
    """
    on_drop = metrics.call_log_dropped.inc
    if destination == "-":
        return CallLog(sys.stderr, close_stream=False, on_drop=on_drop)
    try:
        stream = Path(destination).open("a", encoding="utf-8")  # noqa: SIM115 - CallLog closes it
    except OSError as exc:
        raise RuntimeError(f"cannot open --log-file {destination}: {exc.strerror or exc}") from exc
    return CallLog(stream, close_stream=True, on_drop=on_drop)


def _timestamp(epoch_seconds: float) -> str:
    moment = datetime.fromtimestamp(epoch_seconds, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# Generated request ids: a random per-process prefix and a counter, unique
# across sidecars without a random draw per call.
_REQUEST_ID_PREFIX = uuid.uuid4().hex[:16]
_request_numbers = itertools.count(1)


def _request_id(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == REQUEST_ID_KEY:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            if text:
                return text[:MAX_REQUEST_ID_CHARS]
    return f"{_REQUEST_ID_PREFIX}-{next(_request_numbers)}"


def final_status(context: Any, error: BaseException | None) -> grpc.StatusCode:
    """The status the client receives, seen from inside the server once the handler returned or raised."""
    if isinstance(error, asyncio.CancelledError):
        # A client whose own deadline fires first cancels the stream just
        # before the server's copy of that deadline expires: near the
        # deadline, a cancel is the deadline.
        remaining = context.time_remaining()
        expired = remaining is not None and remaining <= DEADLINE_TOLERANCE_SECONDS
        return grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
    code: grpc.StatusCode | None = context.code()
    if code is not None:
        return code
    if error is None or isinstance(error, grpc.aio.AbortError):
        return grpc.StatusCode.OK
    return grpc.StatusCode.UNKNOWN  # grpc sends UNKNOWN for an exception that escapes a handler


def error_reason(context: Any) -> str | None:
    """The ErrorInfo reason in the call's rich status, if it has one."""
    for key, value in context.trailing_metadata() or ():
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason: str = info.reason
                return reason
    return None


class ObservabilityInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Logs and measures every call; install it first, so it sees the other interceptors' refusals."""

    def __init__(self, call_log: CallLog | None, metrics: SidecarMetrics | None = METRICS) -> None:
        self._log = call_log
        self._metrics = metrics
        self._wrapped = WrapCache(self._observed)

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler:
        handler: Handler | None = await continuation(handler_call_details)
        full_method: str = handler_call_details.method
        if handler is None:
            self._finish_unknown(full_method, handler_call_details.invocation_metadata)
            return handler  # type: ignore[return-value]
        return self._wrapped.get(full_method, handler)

    def _observed(self, full_method: str, inner: Behavior) -> Behavior:
        service, method = service_and_method(full_method)
        log = self._log
        in_flight = self._metrics.in_flight if self._metrics is not None else None
        method_metrics = self._metrics.for_method(service, method) if self._metrics is not None else None

        async def observed(request: Any, context: Any) -> Any:
            started = time.perf_counter()
            if in_flight is not None:
                in_flight.inc()
            error: BaseException | None = None
            try:
                return await inner(request, context)
            except BaseException as exc:
                error = exc
                raise
            finally:
                duration = time.perf_counter() - started
                code = final_status(context, error)
                if in_flight is not None and method_metrics is not None:
                    in_flight.dec()
                    method_metrics.record(code.name, duration)
                if log is not None:
                    record: dict[str, Any] = {
                        "ts": time.time(),
                        "service": service,
                        "method": method,
                        "status": code.name,
                        "duration_ms": round(duration * 1000, 3),
                        "peer": context.peer(),
                        "request_id": _request_id(context.invocation_metadata()),
                    }
                    if code is not grpc.StatusCode.OK:
                        record["error_reason"] = error_reason(context)
                    log.write(record)

        return observed

    def _finish_unknown(self, full_method: str, metadata: Any) -> None:
        code = grpc.StatusCode.UNIMPLEMENTED
        if self._metrics is not None:
            self._metrics.record_call(UNKNOWN_METHOD_LABEL, UNKNOWN_METHOD_LABEL, code.name, 0.0)
        if self._log is not None:
            service, method = service_and_method(full_method[:MAX_REQUEST_ID_CHARS])
            self._log.write(
                {
                    "ts": time.time(),
                    "service": service,
                    "method": method,
                    "status": code.name,
                    "duration_ms": 0.0,
                    "peer": None,  # no servicer context before a handler exists
                    "request_id": _request_id(metadata),
                    "error_reason": None,
                }
            )


def otel_interceptor() -> grpc.aio.ServerInterceptor:  # type: ignore[type-arg]
    """OpenTelemetry's aio server interceptor (SERVER spans with rpc.* attributes).

    Spans go to the globally configured tracer provider; without one (the
    OpenTelemetry SDK plus an exporter, e.g. configured through OTEL_*
    environment variables) they are no-ops.

    Raises:
        RuntimeError: the instrumentation package is not installed.
    """
    try:
        module = importlib.import_module("opentelemetry.instrumentation.grpc")
    except ImportError as exc:
        raise RuntimeError(
            f"--otel needs the {OTEL_PACKAGE} package (with opentelemetry-sdk and an exporter), "
            f"which is not installed: pip install {OTEL_PACKAGE} opentelemetry-sdk ({exc})"
        ) from exc
    interceptor: grpc.aio.ServerInterceptor = module.aio_server_interceptor()  # type: ignore[type-arg]
    return interceptor
