"""Prometheus metrics of a sidecar process, and the HTTP endpoint that serves them.

No grpc here, so any module may record: `record_verification` (seedstore)
and `record_refusal` (negotiator) are the service-specific hooks; code that
needs its own metric registers it on `METRICS.registry`.

Call metrics follow the names go-grpc-prometheus made common, so existing
dashboards apply:

    grpc_server_handled_total{grpc_service, grpc_method, grpc_code}
    grpc_server_handling_seconds{grpc_service, grpc_method}      (histogram)
    grpc_server_calls_in_flight
    seedstore_verification_duration_seconds{status}              (histogram, one per seed)
    negotiator_refusals_total{capability}
    sidecar_call_log_dropped_total

plus prometheus_client's process_* and python_* collectors (resident memory,
CPU, open files, GC). Metrics are per process: one sidecar per process. The
grpc_server_* series are plain counters behind a collector (`CallMetrics`),
updated from the event loop's thread only.
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

from sidecar_runtime.addresses import parse_address

CALL_SECONDS_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
_go_float = cast(Callable[[float], str], floatToGoString)  # untyped in prometheus_client
_BUCKET_LABELS = (*(_go_float(bound) for bound in CALL_SECONDS_BUCKETS), "+Inf")  # as `le` labels
VERIFICATION_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class MethodCalls:
    """One method's call counts and latency histogram, as plain numbers.

    The per-call cost is a few integer additions on the event loop's thread
    (the only writer); the HTTP thread reads them when scraped. A scrape may
    see a call in the histogram but not yet in the count by status (or the
    reverse), as with prometheus_client's own metrics, which take one lock
    per value.
    """

    __slots__ = ("buckets", "by_code", "created", "first_seen", "method", "service", "total_seconds")

    def __init__(self, service: str, method: str) -> None:
        self.service = service
        self.method = method
        self.created = time.time()
        self.by_code: dict[str, int] = {}  # status code name -> calls
        self.first_seen: dict[str, float] = {}  # status code name -> epoch seconds (`_created`)
        self.buckets = [0] * (len(CALL_SECONDS_BUCKETS) + 1)  # the last one is +Inf
        self.total_seconds = 0.0

    def record(self, code: str, duration_s: float) -> None:
        count = self.by_code.get(code)
        if count is None:
            self.first_seen[code] = time.time()
            count = 0
        self.by_code[code] = count + 1
        self.buckets[bisect_left(CALL_SECONDS_BUCKETS, duration_s)] += 1
        self.total_seconds += duration_s


class CallMetrics(Collector):
    """grpc_server_handled_total, grpc_server_handling_seconds and grpc_server_calls_in_flight.

    A collector over plain counters rather than prometheus_client metric
    objects: those take a lock per update, about 5 µs per call for the three
    of them, against well under 1 µs here. The exposition is the same
    (`_total`, `_bucket`/`_count`/`_sum` and `_created` samples).
    """

    def __init__(self) -> None:
        self.in_flight = 0
        self._methods: dict[tuple[str, str], MethodCalls] = {}

    def for_method(self, service: str, method: str) -> MethodCalls:
        calls = self._methods.get((service, method))
        if calls is None:
            calls = self._methods[(service, method)] = MethodCalls(service, method)
        return calls

    def describe(self) -> Iterable[Metric]:
        return self._families([])

    def collect(self) -> Iterable[Metric]:
        return self._families(list(self._methods.values()))

    def _families(self, methods: list[MethodCalls]) -> list[Metric]:
        handled = CounterMetricFamily(
            "grpc_server_handled",
            "Calls finished, by method and status code.",
            labels=["grpc_service", "grpc_method", "grpc_code"],
        )
        seconds = HistogramMetricFamily(
            "grpc_server_handling_seconds",
            "Time from a call's handler starting to its final status, by method.",
            labels=["grpc_service", "grpc_method"],
        )
        for calls in methods:
            for code, count in list(calls.by_code.items()):
                created = calls.first_seen.get(code, calls.created)
                handled.add_metric([calls.service, calls.method, code], count, created=created)
            cumulative = list(accumulate(list(calls.buckets)))
            seconds.add_metric(
                [calls.service, calls.method],
                [(_BUCKET_LABELS[i], float(n)) for i, n in enumerate(cumulative)],
                calls.total_seconds,
            )
            seconds.samples.append(
                Sample(
                    "grpc_server_handling_seconds_created",
                    {"grpc_service": calls.service, "grpc_method": calls.method},
                    calls.created,
                )
            )
        in_flight = GaugeMetricFamily(
            "grpc_server_calls_in_flight",
            "Calls whose handler is running (open streams included).",
            value=self.in_flight,
        )
        return [handled, seconds, in_flight]


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

    def record_call(self, service: str, method: str, code: str, duration_s: float) -> None:
        self.calls.for_method(service, method).record(code, duration_s)

    def for_method(self, service: str, method: str) -> MethodCalls:
        return self.calls.for_method(service, method)

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
