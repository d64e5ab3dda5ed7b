"""`--otel`: spans from real sidecar processes, received over real OTLP/gRPC or read off stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from agentsidecar.seedstore.v1 import seedstore_pb2, seedstore_pb2_grpc
from agentsidecar.sidecar_runtime.tracing import TracingConfigError, start_tracing
from tests.procs import REPO, start_process, stop_process
from tests.runtime.runtime_support import StartProbe
from tests.runtime.test_serve_cli import BIN, Sidecar, cleanup, env, launch

__all__ = ["cleanup", "env"]  # fixtures, used by name

INVOKE = "/agentsidecar.negotiator.v1.NegotiatorService/Invoke"
EXAMPLE_ADAPTER = REPO / "tests" / "negotiator" / "remote_double.py"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"


def console_spans(printed: str) -> list[dict[str, Any]]:
    """The spans OpenTelemetry's console exporter printed: one JSON object after another."""
    decoder = json.JSONDecoder()
    spans, position = [], printed.find("{")
    while position != -1:
        span, end = decoder.raw_decode(printed, position)
        spans.append(span)
        position = printed.find("{", end)
    return spans


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver: keeps every export request it is sent."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []

    async def Export(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.aio.ServicerContext[
            trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse
        ],
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[str, dict[str, object], trace_pb2.Span]]:
        """(service.name, span attributes, span) for every span received."""
        found = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        attributes: dict[str, object] = {}
                        for attribute in span.attributes:
                            value = attribute.value
                            attributes[attribute.key] = getattr(
                                value, value.WhichOneof("value") or "string_value"
                            )
                        found.append((resource["service.name"], attributes, span))
        return found


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, int]]:
    server = grpc.aio.server()
    collected = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collected, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield collected, port
    await server.stop(0)


@pytest.mark.slow
async def test_negotiator_exports_a_span_per_call_over_otlp(
    receiver: tuple[Receiver, int], env: dict[str, str], socket_dir: Path, cleanup: list[Sidecar]
) -> None:
    collected, port = receiver
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_BSP_SCHEDULE_DELAY="50",
    )
    env.pop("OTEL_TRACES_EXPORTER", None)  # the default: otlp
    env.pop("OTEL_SERVICE_NAME", None)
    argv = [str(BIN / "negotiator"), "serve", "--listen", f"unix:{socket_dir / 'n.sock'}", "--otel"]
    sidecar = await launch(argv, env)
    cleanup.append(sidecar)
    async with grpc.aio.insecure_channel(sidecar.bound[0]) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        traceparent = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
        await stub.Invoke(
            negotiator_pb2.InvokeRequest(adapter="demo", prompt="hi"),
            timeout=10,
            metadata=(("traceparent", traceparent),),
        )
        refused = negotiator_pb2.InvokeRequest(
            adapter="demo", prompt="hi", options=negotiator_pb2.CallOptions(persona="pirate")
        )
        with pytest.raises(grpc.aio.AioRpcError) as refusal:
            await stub.Invoke(refused, timeout=10)
        assert refusal.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    code, _ = await sidecar.stop()  # stopping flushes what the batch processor still holds
    assert code == 0

    spans = sorted(
        (entry for entry in collected.spans() if entry[2].name == INVOKE),
        key=lambda entry: entry[2].start_time_unix_nano,
    )
    assert [name for name, _, _ in spans] == ["negotiator", "negotiator"]
    assert [attributes["rpc.grpc.status_code"] for _, attributes, _ in spans] == [
        grpc.StatusCode.OK.value[0],
        grpc.StatusCode.FAILED_PRECONDITION.value[0],
    ]
    accepted, refused_span = spans[0][2], spans[1][2]
    assert accepted.trace_id.hex() == TRACE_ID  # the caller's trace, continued
    assert accepted.parent_span_id.hex() == PARENT_SPAN_ID
    assert refused_span.trace_id.hex() != TRACE_ID  # no traceparent: a trace of its own
    assert accepted.kind == trace_pb2.Span.SPAN_KIND_SERVER


@pytest.mark.slow
async def test_seedstore_spans_on_stdout_under_the_configured_service_name(
    env: dict[str, str], socket_dir: Path, cleanup: list[Sidecar]
) -> None:
    env.update(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="seeds-of-team-a")
    argv = [str(BIN / "seedstore"), "serve", "--listen", f"unix:{socket_dir / 's.sock'}", "--otel"]
    sidecar = await launch(argv, env)
    cleanup.append(sidecar)
    async with grpc.aio.insecure_channel(sidecar.bound[0]) as channel:
        stub = seedstore_pb2_grpc.SeedStoreServiceStub(channel)
        await stub.ListSeeds(seedstore_pb2.ListSeedsRequest(), timeout=10)
    code, _ = await sidecar.stop()
    assert code == 0
    assert sidecar.process.stdout is not None
    printed = (await sidecar.process.stdout.read()).decode()
    spans = console_spans(printed)
    listed = [s for s in spans if s["name"] == "/agentsidecar.seedstore.v1.SeedStoreService/ListSeeds"]
    assert len(listed) == 1
    assert listed[0]["resource"]["attributes"]["service.name"] == "seeds-of-team-a"
    assert listed[0]["attributes"]["rpc.grpc.status_code"] == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin' is not supported here"),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
            "OTLP protocol 'http/json' is not supported here",
        ),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "--otel needs the opentelemetry-exporter-otlp-proto-http package",
        ),
    ],
)
def test_unusable_otel_settings_fail_start_up_by_name(
    variables: dict[str, str], message: str, env: dict[str, str], socket_dir: Path
) -> None:
    env.update(variables)
    result = subprocess.run(
        [str(BIN / "negotiator"), "serve", "--listen", f"unix:{socket_dir / 'n.sock'}", "--otel"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert message in result.stderr
    assert not (socket_dir / "n.sock").exists()


async def test_without_the_packages_start_up_names_what_to_install(
    start_probe: StartProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.instrumentation.grpc", None)  # import now fails
    with pytest.raises(TracingConfigError) as failure:
        await start_probe(otel=True)
    assert "--otel needs the opentelemetry-instrumentation-grpc package" in str(failure.value)
    assert "pip install 'agentsidecar[otel]'" in str(failure.value)


# A process that set its own tracer provider keeps it: spans go to its exporter, and stopping
# the server leaves the provider running (it is not ours to shut down).
EMBEDDED = """
import asyncio, sys
import grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from grpc_health.v1 import health_pb2, health_pb2_grpc
from agentsidecar.sidecar_runtime.server import ServerOptions, start_server

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

async def main(socket):
    running = await start_server(lambda server: None, (), ServerOptions(listen=[f"unix:{socket}"], otel=True))
    assert running.tracing is not None and running.tracing.provider is provider
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    await running.stop()
    with trace.get_tracer("embedder").start_as_current_span("after-stop"):
        pass
    print(sorted(span.name for span in exporter.get_finished_spans()))

asyncio.run(main(sys.argv[1]))
"""


# Two servers, one after the other, in one process (an embedding program, a test run):
# the second must still export, through the provider the first one set up.
TWICE = """
import asyncio, sys
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from agentsidecar.sidecar_runtime.server import ServerOptions, start_server

async def serve_once(socket):
    running = await start_server(lambda server: None, (), ServerOptions(listen=[f"unix:{socket}"], otel=True))
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    await running.stop()

async def main(directory):
    await serve_once(f"{directory}/first.sock")
    await serve_once(f"{directory}/second.sock")

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.slow
def test_a_second_server_in_the_process_still_exports(socket_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", TWICE, str(socket_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "embedded"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count('"name": "/grpc.health.v1.Health/Check"') == 2


@pytest.mark.slow
def test_a_tracer_provider_set_by_the_process_is_kept(socket_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", EMBEDDED, str(socket_dir / "e.sock")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "OTEL_TRACES_EXPORTER": "none"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['/grpc.health.v1.Health/Check', 'after-stop']"


@pytest.mark.slow
async def test_an_unknown_exporter_is_refused_before_any_provider_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Checked before any provider is made, so a refused start leaves the process's tracing untouched.
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    with pytest.raises(TracingConfigError, match="expected one of: otlp, console, none"):
        start_tracing("probe")
    from opentelemetry import trace

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@pytest.fixture
def far_adapter(socket_dir: Path) -> Iterator[str]:
    """tests/negotiator/remote_double.py in its own process, declaring shortname "far"; its target."""
    target = f"unix:{socket_dir / 'remote.sock'}"
    process, _ = start_process(
        [sys.executable, str(EXAMPLE_ADAPTER), "--listen", target, "--shortname", "far"]
    )
    try:
        yield target
    finally:
        stop_process(process)


@pytest.mark.slow
@pytest.mark.parametrize("otel", [True, False])
async def test_the_trace_continues_into_remote_adapters_only_with_otel(
    otel: bool,
    far_adapter: str,
    env: dict[str, str],
    socket_dir: Path,
    tmp_path: Path,
    cleanup: list[Sidecar],
) -> None:
    remote = {"shortname": "far", "implementation": "remote", "options": {"target": far_adapter}}
    config = tmp_path / "negotiator.yaml"
    config.write_text(json.dumps({"adapters": [remote]}))
    env["OTEL_TRACES_EXPORTER"] = "none"
    argv = [str(BIN / "negotiator"), "serve", "--listen", f"unix:{socket_dir / 'n.sock'}"]
    sidecar = await launch([*argv, "--config", str(config), *(["--otel"] if otel else [])], env)
    cleanup.append(sidecar)
    async with grpc.aio.insecure_channel(sidecar.bound[0]) as channel:
        reply = await negotiator_pb2_grpc.NegotiatorServiceStub(channel).Invoke(
            negotiator_pb2.InvokeRequest(adapter="far", prompt="options:"),
            timeout=10,
            metadata=(("traceparent", f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"),),
        )
    seen = json.loads(reply.text.removeprefix("remote:"))
    if otel:
        version, trace_id, parent, flags = seen["metadata_traceparent"].split("-")
        assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
        assert parent != PARENT_SPAN_ID  # the negotiator's own span is the remote's parent
    else:
        assert seen["metadata_traceparent"] is None
    code, _ = await sidecar.stop()
    assert code == 0


@pytest.mark.slow
async def test_the_trace_continues_from_the_negotiator_into_the_seedstore(
    env: dict[str, str], socket_dir: Path, cleanup: list[Sidecar]
) -> None:
    seedstore_env = {**env, "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "seeds"}
    seedstore_argv = [str(BIN / "seedstore"), "serve", "--listen", f"unix:{socket_dir / 's.sock'}", "--otel"]
    seedstore = await launch(seedstore_argv, seedstore_env)
    cleanup.append(seedstore)
    negotiator_argv = [
        str(BIN / "negotiator"), "serve", "--listen", f"unix:{socket_dir / 'n.sock'}",
        "--seedstore", seedstore.bound[0], "--otel",
    ]  # fmt: skip
    negotiator = await launch(negotiator_argv, {**env, "OTEL_TRACES_EXPORTER": "none"})
    cleanup.append(negotiator)
    async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
        response = await negotiator_pb2_grpc.NegotiatorServiceStub(channel).Bootstrap(
            negotiator_pb2.BootstrapRequest(capability="text_to_speech"),
            timeout=10,
            metadata=(("traceparent", f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"),),
        )
    assert list(response.candidates) == []  # an empty store: the search ran and found nothing
    assert (await negotiator.stop())[0] == 0
    assert (await seedstore.stop())[0] == 0
    assert seedstore.process.stdout is not None
    printed = (await seedstore.process.stdout.read()).decode()
    spans = console_spans(printed)
    searches = [s for s in spans if s["name"] == "/agentsidecar.seedstore.v1.SeedStoreService/SearchSeeds"]
    assert searches, spans
    assert {s["context"]["trace_id"] for s in searches} == {f"0x{TRACE_ID}"}
    assert all(s["parent_id"] not in (None, f"0x{PARENT_SPAN_ID}") for s in searches)  # the negotiator's span
