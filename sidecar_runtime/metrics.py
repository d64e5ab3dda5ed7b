"""Prometheus metrics of a sidecar process, and the HTTP endpoint that serves them.

No grpc here, so any module may record: `record_verification` (seedstore)
and `record_refusal` (negotiator) are the service-specific hooks; code that
needs its own metric registers it on `METRICS.registry`.

Call metrics are those of go-grpc-prometheus (and py-grpc-prometheus), with
its names, labels and label values, so dashboards written for it apply:

    grpc_server_started_total{grpc_type, grpc_service, grpc_method}
    grpc_server_handled_total{grpc_type, grpc_service, grpc_method, grpc_code}
    grpc_server_msg_received_total{grpc_type, grpc_service, grpc_method}
    grpc_server_msg_sent_total{grpc_type, grpc_service, grpc_method}
    grpc_server_handling_seconds{grpc_type, grpc_service, grpc_method}   (histogram)
    grpc_server_calls_in_flight
    seedstore_verification_duration_seconds{status}                      (histogram, one per seed)
    negotiator_refusals_total{capability}
    sidecar_call_log_dropped_total

`grpc_type` is `unary`, `client_stream`, `server_stream` or `bidi_stream`;
`grpc_code` is the status code as grpc-go spells it (`OK`, `Canceled`,
`InvalidArgument`, `DeadlineExceeded`, ...). As go-grpc-prometheus counts
them, a unary request counts as received when the call starts and a unary
response as sent when the call ends OK; stream messages are counted one by
one. Calls to methods no handler serves are counted under `unknown` (type,
service and method). Plus prometheus_client's process_* and python_*
collectors (resident memory, CPU, open files, GC). Metrics are per process:
one sidecar per process. The grpc_server_* series are plain counters behind
a collector (`CallMetrics`), updated from the event loop's thread only.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import accumulate
from threading import Thread
from typing import cast
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from agentsidecar.sidecar_runtime.addresses import parse_address

CALL_SECONDS_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
_go_float = cast(Callable[[float], str], floatToGoString)  # untyped in prometheus_client
_BUCKET_LABELS = (*(_go_float(bound) for bound in CALL_SECONDS_BUCKETS), "+Inf")  # as `le` labels
VERIFICATION_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

UNARY = "unary"
CLIENT_STREAM = "client_stream"
SERVER_STREAM = "server_stream"
BIDI_STREAM = "bidi_stream"

# grpc.StatusCode names -> grpc-go's codes.Code.String(), the `grpc_code` values
# go-grpc-prometheus writes (CANCELLED is spelled "Canceled" there).
GO_CODE_NAMES = {
    "OK": "OK",
    "CANCELLED": "Canceled",
    "UNKNOWN": "Unknown",
    "INVALID_ARGUMENT": "InvalidArgument",
    "DEADLINE_EXCEEDED": "DeadlineExceeded",
    "NOT_FOUND": "NotFound",
    "ALREADY_EXISTS": "AlreadyExists",
    "PERMISSION_DENIED": "PermissionDenied",
    "RESOURCE_EXHAUSTED": "ResourceExhausted",
    "FAILED_PRECONDITION": "FailedPrecondition",
    "ABORTED": "Aborted",
    "OUT_OF_RANGE": "OutOfRange",
    "UNIMPLEMENTED": "Unimplemented",
    "INTERNAL": "Internal",
    "UNAVAILABLE": "Unavailable",
    "DATA_LOSS": "DataLoss",
    "UNAUTHENTICATED": "Unauthenticated",
}


def grpc_type(request_streaming: bool, response_streaming: bool) -> str:
    """The `grpc_type` label of a method of that shape."""
    if request_streaming:
        return BIDI_STREAM if response_streaming else CLIENT_STREAM
    return SERVER_STREAM if response_streaming else UNARY


class MethodCalls:
    """One method's call counts, message counts and latency histogram, as plain numbers.

    The per-call cost is a few integer additions on the event loop's thread
    (the only writer), plus one per stream message (`received` for request
    streams, `sent` for response streams, counted by the runtime's
    deserializer and serializer); the HTTP thread reads them when scraped. A
    scrape may see a call in the histogram but not yet in the count by status
    (or the reverse), as with prometheus_client's own metrics, which take one
    lock per value.
    """

    __slots__ = (
        "buckets",
        "by_code",
        "created",
        "first_seen",
        "grpc_type",
        "method",
        "received",
        "sent",
        "service",
        "started",
        "total_seconds",
    )

    def __init__(self, service: str, method: str, grpc_type: str = UNARY) -> None:
        self.service = service
        self.method = method
        self.grpc_type = grpc_type
        self.created = time.time()
        self.started = 0
        self.received = 0  # request stream messages (unary requests are the started calls)
        self.sent = 0  # response stream messages (unary responses are the calls ended OK)
        self.by_code: dict[str, int] = {}  # status code name (grpc.StatusCode) -> calls
        self.first_seen: dict[str, float] = {}  # status code name -> epoch seconds (`_created`)
        self.buckets = [0] * (len(CALL_SECONDS_BUCKETS) + 1)  # the last one is +Inf
        self.total_seconds = 0.0

    def record(self, code: str, duration_s: float) -> None:
        """A call that started (`started` counted) has ended with `code` (a grpc.StatusCode name)."""
        count = self.by_code.get(code)
        if count is None:
            self.first_seen[code] = time.time()
            count = 0
        self.by_code[code] = count + 1
        self.buckets[bisect_left(CALL_SECONDS_BUCKETS, duration_s)] += 1
        self.total_seconds += duration_s

    def messages(self) -> tuple[int, int]:
        """(received, sent), unary sides derived from the calls as go-grpc-prometheus counts them."""
        request_streaming = self.grpc_type in (CLIENT_STREAM, BIDI_STREAM)
        response_streaming = self.grpc_type in (SERVER_STREAM, BIDI_STREAM)
        received = self.received if request_streaming else self.started
        sent = self.sent if response_streaming else self.by_code.get("OK", 0)
        return received, sent


class CallMetrics(Collector):
    """The grpc_server_* series, over plain counters.

    A collector over plain counters rather than prometheus_client metric
    objects: those take a lock per update, and every update here happens on
    the event loop's one thread, so no lock is needed. The exposition is the
    same (`_total`, `_bucket`/`_count`/`_sum` and `_created` samples). Calls in flight are
    the calls started less those handled, so a call costs one addition when
    it starts and its record when it ends.
    """

    def __init__(self) -> None:
        self._methods: dict[tuple[str, str], MethodCalls] = {}

    def for_method(self, service: str, method: str, grpc_type: str = UNARY) -> MethodCalls:
        calls = self._methods.get((service, method))
        if calls is None:
            calls = self._methods[(service, method)] = MethodCalls(service, method, grpc_type)
        return calls

    def describe(self) -> Iterable[Metric]:
        return self._families([])

    def collect(self) -> Iterable[Metric]:
        return self._families(list(self._methods.values()))

    def _families(self, methods: list[MethodCalls]) -> list[Metric]:
        method_labels = ["grpc_type", "grpc_service", "grpc_method"]
        started = CounterMetricFamily(
            "grpc_server_started", "Total number of RPCs started on the server.", labels=method_labels
        )
        handled = CounterMetricFamily(
            "grpc_server_handled",
            "Total number of RPCs completed on the server, regardless of success or failure.",
            labels=[*method_labels, "grpc_code"],
        )
        received = CounterMetricFamily(
            "grpc_server_msg_received",
            "Total number of RPC stream messages received on the server.",
            labels=method_labels,
        )
        sent = CounterMetricFamily(
            "grpc_server_msg_sent",
            "Total number of gRPC stream messages sent by the server.",
            labels=method_labels,
        )
        seconds = HistogramMetricFamily(
            "grpc_server_handling_seconds",
            "Histogram of response latency (seconds) of gRPC that had been application-level "
            "handled by the server.",
            labels=method_labels,
        )
        in_flight = 0
        for calls in methods:
            values = [calls.grpc_type, calls.service, calls.method]
            by_code = list(calls.by_code.items())
            handled_calls = sum(count for _, count in by_code)
            started_calls = max(calls.started, handled_calls)  # a scrape between the two updates
            in_flight += started_calls - handled_calls
            started.add_metric(values, started_calls, created=calls.created)
            for code, count in by_code:
                created = calls.first_seen.get(code, calls.created)
                handled.add_metric([*values, GO_CODE_NAMES.get(code, code)], count, created=created)
            messages_in, messages_out = calls.messages()
            received.add_metric(values, messages_in, created=calls.created)
            sent.add_metric(values, messages_out, created=calls.created)
            cumulative = list(accumulate(list(calls.buckets)))
            seconds.add_metric(
                values,
                [(_BUCKET_LABELS[i], float(n)) for i, n in enumerate(cumulative)],
                calls.total_seconds,
            )
            seconds.samples.append(
                Sample(
                    "grpc_server_handling_seconds_created",
                    dict(zip(method_labels, values, strict=True)),
                    calls.created,
                )
            )
        gauge = GaugeMetricFamily(
            "grpc_server_calls_in_flight",
            "Calls whose handler is running (open streams included).",
            value=in_flight,
        )
        return [started, handled, received, sent, seconds, gauge]


class SidecarMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.calls = CallMetrics()
        registry.register(self.calls)
        self.verification_seconds = Histogram(
            "seedstore_verification_duration_seconds",
            "Time to verify one seed (all its evidence), by the verdict.",
            ["status"],
            buckets=VERIFICATION_SECONDS_BUCKETS,
            registry=registry,
        )
        self.refusals = Counter(
            "negotiator_refusals",
            "Brokered calls refused, by each capability the adapter's declaration did not meet.",
            ["capability"],
            registry=registry,
        )
        self.call_log_dropped = Counter(
            "sidecar_call_log_dropped",
            "Call log lines dropped because the log could not be written fast enough.",
            registry=registry,
        )

    def record_call(
        self, service: str, method: str, code: str, duration_s: float, grpc_type: str = UNARY
    ) -> None:
        """One whole call, started and ended (`code`: a grpc.StatusCode name)."""
        calls = self.calls.for_method(service, method, grpc_type)
        calls.started += 1
        calls.record(code, duration_s)

    def for_method(self, service: str, method: str, grpc_type: str = UNARY) -> MethodCalls:
        return self.calls.for_method(service, method, grpc_type)

    def record_verification(self, duration_s: float, status: str) -> None:
        self.verification_seconds.labels(status).observe(duration_s)

    def record_refusal(self, capability: str) -> None:
        self.refusals.labels(capability).inc()


METRICS = SidecarMetrics()


def record_verification(duration_s: float, status: str) -> None:
    """One seed verified: how long it took and its verdict (`verified`, `failed`, ...)."""
    METRICS.record_verification(duration_s, status)


def record_refusal(capability: str) -> None:
    """A brokered call refused because the declaration does not meet `capability`."""
    METRICS.record_refusal(capability)


def record_refusals(capabilities: Iterable[str]) -> None:
    """One refused call: each capability it lacked counts once, however many gaps name it."""
    for capability in dict.fromkeys(capabilities):
        METRICS.record_refusal(capability)


@dataclass(slots=True)
class MetricsEndpoint:
    """prometheus_client's HTTP server (its own thread), serving `/metrics` and `/`."""

    bound: str  # HOST:PORT with the real port
    _server: WSGIServer
    _thread: Thread

    async def close(self) -> None:
        # shutdown() waits for the serving loop's next poll (up to 0.5 s): not on the event loop.
        await asyncio.to_thread(self._server.shutdown)
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_endpoint(listen: str, registry: CollectorRegistry = REGISTRY) -> MetricsEndpoint:
    """Serve the metrics over plain HTTP on HOST:PORT (port 0 picks one).

    Raises:
        ValueError: `listen` is not HOST:PORT.
        RuntimeError: the address cannot be bound.
    """
    address = parse_address(listen)
    if address.unix_path is not None:
        raise ValueError(f"--metrics-listen takes HOST:PORT, not a Unix socket: {listen!r}")
    host, _, port = address.target.rpartition(":")
    try:
        server, thread = start_http_server(int(port), addr=host.strip("[]"), registry=registry)
    except OSError as exc:
        raise RuntimeError(f"cannot serve metrics on {listen}: {exc.strerror or exc}") from exc
    return MetricsEndpoint(bound=f"{host}:{server.server_port}", _server=server, _thread=thread)
