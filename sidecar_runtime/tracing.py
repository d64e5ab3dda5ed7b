"""`--otel`: OpenTelemetry SERVER spans for every call, exported where the OTEL_* variables say.

    tracing = start_tracing("negotiator")        # at start-up, when --otel is given
    interceptor = tracing.interceptor            # outermost in the server's chain
    tracing.flush()                              # after the server stops: exports queued spans

The spans come from OpenTelemetry's own gRPC instrumentation
(`opentelemetry-instrumentation-grpc`, its asyncio server interceptor:
span name `/package.Service/Method`, `rpc.*` attributes, the status code,
and a parent taken from the caller's `traceparent` metadata).

Where they go: a process that already has a tracer provider (run under
`opentelemetry-instrument`, or embedding the sidecar after setting its own)
keeps it. Otherwise the sidecar sets up the SDK from the standard variables,
so `--otel` alone is enough:

- `OTEL_TRACES_EXPORTER`: `otlp` (the default), `console` (one JSON object
  per span on stdout) or `none`;
- `otlp` speaks `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (or
  `OTEL_EXPORTER_OTLP_PROTOCOL`): `grpc` (the default) or `http/protobuf`,
  to `OTEL_EXPORTER_OTLP_ENDPOINT` and the exporter's other variables;
- `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` name the service
  (default: the sidecar's name);
- `OTEL_BSP_*` tune the batch processor (spans are exported in the
  background, never on the call's path).

Outgoing calls: `trace_metadata()` is the current trace context as W3C
`traceparent` / `tracestate` metadata, for the sidecar's own calls to other
services (the negotiator's remote adapters; as HTTP headers, its openai
adapter's requests; its seedstore connection, through
`agentsidecar.clients.channel.metadata_interceptors(trace_metadata)`), so their spans join
the caller's trace. It is empty until `start_tracing` ran.

Packages: `pip install 'agentsidecar[otel]'` (the instrumentation, the SDK
and the OTLP/gRPC exporter). Without them `--otel` fails at start-up,
naming what to install.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

OTEL_PACKAGE = "opentelemetry-instrumentation-grpc"
OTEL_INSTALL_HINT = "pip install 'agentsidecar[otel]'"
EXPORTERS = ("otlp", "console", "none")
OTLP_PROTOCOLS = {
    "grpc": (
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "opentelemetry-exporter-otlp-proto-grpc",
    ),
    "http/protobuf": (
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "opentelemetry-exporter-otlp-proto-http",
    ),
}


# opentelemetry.propagate once --otel is on; None before, so that without
# --otel no call pays for (or imports) OpenTelemetry.
_propagate: Any = None


def trace_metadata() -> tuple[tuple[str, str], ...]:
    """The current span's context as gRPC metadata for an outgoing call; () without --otel or a span."""
    if _propagate is None:
        return ()
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return tuple(carrier.items())


class TracingConfigError(RuntimeError):
    """--otel cannot work as configured: a package is missing or an OTEL_* variable is unusable."""


FLUSH_TIMEOUT_MILLIS = 5_000  # an unreachable collector must not hold a stopping sidecar for long


@dataclass(slots=True)
class Tracing:
    interceptor: grpc.aio.ServerInterceptor  # type: ignore[type-arg]
    provider: Any  # the process's tracer provider (set up here, or brought by the process)

    def flush(self) -> None:
        """Export what is queued now, leaving the provider running.

        The provider is the process's, not this server's: another server in
        the same process (tests, an embedding program) may still use it, and
        the SDK shuts it down at exit. A provider without `force_flush` (not
        the SDK's) is left alone.
        """
        force_flush = getattr(self.provider, "force_flush", None)
        if force_flush is not None:
            force_flush(FLUSH_TIMEOUT_MILLIS)


def _import(module: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise TracingConfigError(
            f"--otel needs the {package} package, which is not installed: {OTEL_INSTALL_HINT} ({exc})"
        ) from exc


def _service_name_configured(environ: Mapping[str, str]) -> bool:
    if environ.get("OTEL_SERVICE_NAME"):
        return True
    pairs = environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    return any(pair.partition("=")[0].strip() == "service.name" for pair in pairs)


def _exporter(environ: Mapping[str, str]) -> Any | None:
    """The span exporter OTEL_TRACES_EXPORTER names (None for `none`)."""
    name = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if name not in EXPORTERS:
        raise TracingConfigError(
            f"OTEL_TRACES_EXPORTER={name!r} is not supported here; expected one of: {', '.join(EXPORTERS)}"
        )
    if name == "none":
        return None
    if name == "console":
        export = _import("opentelemetry.sdk.trace.export", "opentelemetry-sdk")
        return export.ConsoleSpanExporter()
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    ).strip()
    if protocol not in OTLP_PROTOCOLS:
        raise TracingConfigError(
            f"OTLP protocol {protocol!r} is not supported here; expected one of: {', '.join(OTLP_PROTOCOLS)}"
        )
    module, package = OTLP_PROTOCOLS[protocol]
    return _import(module, package).OTLPSpanExporter()


def start_tracing(default_service_name: str) -> Tracing:
    """The interceptor for --otel, with the SDK set up from the OTEL_* variables unless a provider exists.

    Raises:
        TracingConfigError: a needed package is missing, or OTEL_TRACES_EXPORTER /
            the OTLP protocol names something unsupported.
    """
    global _propagate
    env = os.environ
    instrumentation = _import("opentelemetry.instrumentation.grpc", OTEL_PACKAGE)
    trace = _import("opentelemetry.trace", "opentelemetry-api")
    propagate = _import("opentelemetry.propagate", "opentelemetry-api")
    existing = trace.get_tracer_provider()
    if not isinstance(existing, trace.ProxyTracerProvider):
        # Configured before us (opentelemetry-instrument, the embedding program, or an
        # earlier start in this process): its provider, its exporters, its service name.
        _propagate = propagate
        return Tracing(instrumentation.aio_server_interceptor(tracer_provider=existing), provider=existing)
    sdk_trace = _import("opentelemetry.sdk.trace", "opentelemetry-sdk")
    sdk_export = _import("opentelemetry.sdk.trace.export", "opentelemetry-sdk")
    resources = _import("opentelemetry.sdk.resources", "opentelemetry-sdk")
    exporter = _exporter(env)
    attributes = {} if _service_name_configured(env) else {resources.SERVICE_NAME: default_service_name}
    provider = sdk_trace.TracerProvider(resource=resources.Resource.create(attributes))
    if exporter is not None:
        provider.add_span_processor(sdk_export.BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _propagate = propagate
    return Tracing(instrumentation.aio_server_interceptor(tracer_provider=provider), provider=provider)
