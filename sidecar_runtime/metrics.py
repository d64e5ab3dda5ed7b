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
CPU, open files, GC). Metrics are per process: one sidecar per process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from sidecar_runtime.addresses import parse_address

CALL_SECONDS_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
VERIFICATION_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class SidecarMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.handled = Counter(
            "grpc_server_handled",
            "Calls finished, by method and status code.",
            ["grpc_service", "grpc_method", "grpc_code"],
            registry=registry,
        )
        self.handling_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time from a call's handler starting to its final status, by method.",
            ["grpc_service", "grpc_method"],
            buckets=CALL_SECONDS_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "grpc_server_calls_in_flight", "Calls whose handler is running (open streams included).", [],
            registry=registry,
        )  # fmt: skip
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
        self.handled.labels(service, method, code).inc()
        self.handling_seconds.labels(service, method).observe(duration_s)

    def for_method(self, service: str, method: str) -> MethodMetrics:
        return MethodMetrics(self, service, method)

    def record_verification(self, duration_s: float, status: str) -> None:
        self.verification_seconds.labels(status).observe(duration_s)

    def record_refusal(self, capability: str) -> None:
        self.refusals.labels(capability).inc()


class MethodMetrics:
    """One method's call metrics, with the labelled series looked up once rather than per call."""

    __slots__ = ("_by_code", "_handled", "_labels", "_latency")

    def __init__(self, metrics: SidecarMetrics, service: str, method: str) -> None:
        self._handled = metrics.handled
        self._labels = (service, method)
        self._latency = metrics.handling_seconds.labels(service, method)
        self._by_code: dict[str, Counter] = {}

    def record(self, code: str, duration_s: float) -> None:
        counter = self._by_code.get(code)
        if counter is None:
            counter = self._by_code[code] = self._handled.labels(*self._labels, code)
        counter.inc()
        self._latency.observe(duration_s)


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
