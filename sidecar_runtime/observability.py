"""What a sidecar tells its operator: one JSON line per call and Prometheus metrics (tracing: `tracing`).

Each call that reaches a handler produces one line (on stderr, or a file):

    {"ts": "2026-11-30T04:32:00.123Z", "service": "agentsidecar.seedstore.v1.SeedStoreService",
     "method": "AddSeed", "status": "PERMISSION_DENIED", "duration_ms": 0.412,
     "peer": "unix:", "request_id": "3f2a...", "error_reason": "TOKEN_INVALID"}

`status` is the final status code's name, also for streams, aborts, client
cancels (CANCELLED) and expired deadlines (DEADLINE_EXCEEDED); `error_reason`
(failed calls only) is the ErrorInfo reason, or null when the status has
none. `request_id` is the caller's `x-request-id` metadata, else a fresh id.
Calls grpc refuses before any handler runs (a message over the size limit)
are not seen here; unknown methods are logged as UNIMPLEMENTED, undecodable
requests as INVALID_ARGUMENT with reason MALFORMED_REQUEST.

Call metrics are recorded only when the metrics endpoint is on: without it
nobody could read them, and they are the costlier half of the per-call work.

Lines are formatted and written by a background thread, in batches within
50 ms of being queued, from a bounded queue (10,000 lines), so a slow or
blocked stderr never stalls the event loop; lines that do not fit are
dropped and counted (`sidecar_call_log_dropped_total`). With nothing queued
the thread sleeps.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from json.encoder import encode_basestring  # the C encoder without ASCII escaping, as json.dumps uses
from pathlib import Path
from typing import Any, TextIO, TypeAlias

import grpc
from google.rpc import error_details_pb2, status_pb2

from agentsidecar.sidecar_runtime.handlers import Behavior, MethodInfo, call_metadata, service_and_method
from agentsidecar.sidecar_runtime.metrics import (
    METRICS,
    MethodCalls,
    SidecarMetrics,
    grpc_type,
    record_refusal,
    record_refusals,
    record_verification,
)

__all__ = [
    "METRICS",
    "CallLog",
    "CallObserver",
    "final_status",
    "open_call_log",
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

# Enum members as module constants: reading one off its class goes through the enum
# metaclass's __getattr__ hook on every call, a module global does not.
_OK = grpc.StatusCode.OK


class CallLog:
    """JSON lines written by a daemon thread; `write` never blocks and never serializes.

    The thread sleeps until a line is queued, then waits `flush_interval`
    seconds for more (not a wake per line, which would hand the GIL back
    and forth on every call), formats what has accumulated and writes it in
    one go. An idle sidecar's writer never wakes. A record's `ts` is an epoch float,
    written as RFC 3339 UTC with milliseconds.

    `write_call` is the per-call path: it queues the call's raw figures as a
    tuple, and the thread finds the request id, names the status and builds
    the line from a per-method prefix. Formatting holds the GIL the event
    loop needs, so it is kept lean: a per-method prefix and the figures
    formatted directly, never json.dumps of a dict (which `write` records
    go through).
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
        self._pending: collections.deque[dict[str, Any] | _CallRecord | str] = collections.deque()
        self._closing = threading.Event()
        self._queued = threading.Event()  # set when the queue turns non-empty (or on close)
        self._thread = threading.Thread(target=self._run, name="sidecar-call-log", daemon=True)
        self._thread.start()

    def writes_to(self, stream: TextIO) -> bool:
        """Whether this log writes to `stream` and is still open."""
        return self._stream is stream and not self._closing.is_set()

    def write(self, record: dict[str, Any]) -> None:
        """A record serialized by the writer with json.dumps (`ts` as an epoch float)."""
        self._enqueue(record)

    def write_line(self, line: str) -> None:
        """A line the caller has already rendered (one JSON object, no newline), written as it is."""
        self._enqueue(line)

    def write_call(
        self,
        method_fields: str,
        code: grpc.StatusCode,
        duration_s: float,
        peer: str | None,
        metadata: Any,
        error_reason: str | None,
    ) -> None:
        """One finished call; `method_fields` is `method_fields(service, method)`, made once per method."""
        self._enqueue((time.time(), method_fields, code, duration_s, peer, metadata, error_reason))

    def _enqueue(self, item: dict[str, Any] | _CallRecord | str) -> None:
        pending = self._pending
        if len(pending) >= self._max_pending:
            self._on_drop()
            return
        pending.append(item)
        # Only the item that finds the queue empty wakes the writer: setting an
        # Event takes a lock, a length check does not. An item queued while the
        # writer drains is taken by that same drain, or finds the queue empty
        # again and wakes it.
        if len(pending) == 1:
            self._queued.set()

    async def close(self) -> None:
        """Write what is pending, then stop the thread (and close the file it owns)."""
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        self._closing.set()
        self._queued.set()
        self._thread.join(timeout=10)
        if self._close_stream:
            self._stream.close()

    def _run(self) -> None:
        while not self._closing.is_set():
            self._queued.wait()
            self._closing.wait(self._flush_interval)  # let a batch gather, unless closing
            self._queued.clear()  # before draining: a line queued from here on wakes the next round
            self._flush()
        self._flush()

    def _flush(self) -> None:
        lines: list[str] = []
        while self._pending:
            record = self._pending.popleft()
            if isinstance(record, tuple):
                lines.append(_call_line(record))
                continue
            if isinstance(record, str):
                lines.append(record)
                continue
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


# (whole second, its "YYYY-MM-DDTHH:MM:SS" text): calls within a second share the formatting.
_last_second: tuple[int, str] = (-1, "")


def _timestamp(epoch_seconds: float) -> str:
    """RFC 3339 UTC with milliseconds (truncated, as datetime.isoformat does)."""
    global _last_second
    microseconds = round(epoch_seconds * 1_000_000)
    second, fraction = divmod(microseconds, 1_000_000)
    cached_second, text = _last_second
    if second != cached_second:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _last_second = (second, text)
    return text + _MILLISECONDS[fraction // 1000]


_MILLISECONDS = tuple(f".{millisecond:03d}Z" for millisecond in range(1000))


# (epoch seconds, method_fields, status, duration in seconds, peer, invocation metadata, ErrorInfo reason)
_CallRecord: TypeAlias = tuple[float, str, grpc.StatusCode, float, str | None, Any, str | None]


def method_fields(service: str, method: str) -> str:
    """The `"service":...,"method":...` part of a call's line."""
    return f'"service":{encode_basestring(service)},"method":{encode_basestring(method)}'


def _json_text(value: object) -> str:
    if value is None:
        return "null"
    return encode_basestring(value if isinstance(value, str) else str(value))


def _milliseconds_text(seconds: float) -> str:
    """`repr(round(seconds * 1000, 3))` (what json.dumps writes for that float), without round() and repr().

    Both round the exact binary value correctly to three decimals; repr then
    drops trailing zeros but keeps one digit after the point.
    """
    text = f"{seconds * 1000:.3f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _call_line(record: _CallRecord) -> str:
    """The JSON line of a `write_call` record: the keys and spacing json.dumps gives its dict form.

    Formatted on the writer thread, but holding the GIL the event loop needs,
    so every part that recurs (method fields, status names, peers, the
    second of the timestamp) is made once.
    """
    ts, fields, code, duration_s, peer, metadata, reason = record
    # `_json_text(peer)` and `_request_id_text(metadata)`, spelled out: a line is made per call.
    peer_text = "null" if peer is None else encode_basestring(peer if isinstance(peer, str) else str(peer))
    given = _callers_request_id(metadata) if metadata else None
    request_id = (
        encode_basestring(given) if given is not None else f'"{_REQUEST_ID_PREFIX}-{next(_request_numbers)}"'
    )
    line = (
        # `_name_` is what the `name` property reads, minus the enum machinery's descriptor call.
        f'{{"ts":"{_timestamp(ts)}",{fields},"status":"{code._name_}",'
        f'"duration_ms":{_milliseconds_text(duration_s)},'
        f'"peer":{peer_text},"request_id":{request_id}'
    )
    if code is not _OK:
        line += f',"error_reason":{_json_text(reason)}'
    return line + "}"


# Generated request ids: a random per-process prefix and a counter, unique
# across sidecars without a random draw per call.
_REQUEST_ID_PREFIX = uuid.uuid4().hex[:16]
_request_numbers = itertools.count(1)


def _callers_request_id(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == REQUEST_ID_KEY:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            if text:
                return text[:MAX_REQUEST_ID_CHARS]
    return None


def _fresh_request_id() -> str:
    return f"{_REQUEST_ID_PREFIX}-{next(_request_numbers)}"


def _request_id(metadata: Any) -> str:
    """The caller's `x-request-id`, else a fresh one."""
    given = _callers_request_id(metadata)
    return given if given is not None else _fresh_request_id()


def _request_id_text(metadata: Any) -> str:
    """`_request_id` as JSON text; a fresh id (hex and digits) needs no escaping."""
    given = _callers_request_id(metadata)
    return encode_basestring(given) if given is not None else f'"{_fresh_request_id()}"'


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
        return _OK
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


class CallObserver:
    """Logs and measures every call, as the outermost layer, so it sees the other layers' refusals.

    `metrics` None records no call metrics (nobody could read them without
    the metrics endpoint); `call_log` None writes no lines.
    """

    def __init__(self, call_log: CallLog | None, metrics: SidecarMetrics | None = METRICS) -> None:
        self._log = call_log
        self._metrics = metrics

    def wrap(self, method: MethodInfo, inner: Behavior) -> Behavior:
        log = self._log
        method_calls = self.message_counts(method)
        fields = method_fields(method.service, method.name)
        ok = grpc.StatusCode.OK

        async def observed(request: Any, context: Any) -> Any:
            started = time.perf_counter()
            if method_calls is not None:
                method_calls.started += 1
            error: BaseException | None = None
            try:
                return await inner(request, context)
            except BaseException as exc:
                error = exc
                raise
            finally:
                duration = time.perf_counter() - started
                if error is None:
                    # `final_status` of a call that returned: the code the handler set, else OK.
                    code = context.code()
                    if code is None:
                        code = ok
                else:
                    code = final_status(context, error)
                if method_calls is not None:
                    method_calls.record(code.name, duration)
                if log is not None:
                    reason = None if code is ok else error_reason(context)
                    log.write_call(fields, code, duration, context.peer(), call_metadata(context), reason)

        return observed

    def message_counts(self, method: MethodInfo) -> MethodCalls | None:
        """The method's call metrics (its stream messages are counted there); None without metrics."""
        if self._metrics is None:
            return None
        kind = grpc_type(method.request_streaming, method.response_streaming)
        return self._metrics.for_method(method.service, method.name, kind)

    def unknown(self, full_method: str, metadata: Any) -> None:
        """A call to a method no handler serves: grpc answers UNIMPLEMENTED."""
        code = grpc.StatusCode.UNIMPLEMENTED
        if self._metrics is not None:
            label = UNKNOWN_METHOD_LABEL
            self._metrics.record_call(label, label, code.name, 0.0, grpc_type=label)
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
