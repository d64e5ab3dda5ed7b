"""The remote adapter against tests/negotiator/remote_double.py running as a separate process."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf import json_format

from agentsidecar.adapter.v1 import adapter_pb2, adapter_pb2_grpc
from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters import build_adapter_async, build_adapters
from agentsidecar.negotiator_service.adapters.remote import (
    RemoteAdapter,
    call_options,
    connect_remote,
    implemented_in,
)
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterKind,
    AdapterSpec,
    CallOptions,
    Capability,
    CapabilityState,
    DeclarationOverride,
    MaxDepth,
    McpServer,
    ToolFilter,
)

EXAMPLE = Path(__file__).resolve().parent / "remote_double.py"
SCHEMA = {"type": "object", "properties": {"echo": {"type": "string"}}, "required": ["echo"]}


class ExampleProcess:
    """The example adapter as a child process, its stdout lines collected by a thread."""

    def __init__(self, listen: str, shortname: str, *flags: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--listen", listen, "--shortname", shortname, *flags],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._collect, daemon=True).start()
        self.address = self.expect("READY ", within=15).removeprefix("READY ")

    def _collect(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, prefix: str, within: float = 5) -> str:
        deadline = time.monotonic() + within
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no line starting {prefix!r} within {within} s")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleProcess]:
    socket_path = tmp_path_factory.mktemp("remote") / "adapter.sock"
    running = ExampleProcess(f"unix:{socket_path}", "echo-remote")
    yield running
    running.stop()


@pytest.fixture
async def remote(example: ExampleProcess) -> AsyncIterator[RemoteAdapter]:
    adapter = await connect_remote(example.address, "echo-remote")
    yield adapter
    await adapter.close()


def call(
    prompt: str = "hello", time_budget: float | None = 10, depth: int = 0, **options: Any
) -> AdapterCall:
    return AdapterCall(
        prompt=prompt, options=CallOptions(**options), time_budget=time_budget, delegation_depth=depth
    )


def produce_call(prompt: str = "hello", time_budget: float | None = 10, **options: Any) -> AdapterCall:
    return AdapterCall(
        prompt=prompt, options=CallOptions(**options), output_schema=SCHEMA, time_budget=time_budget
    )


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
async def test_connect_fetches_the_declaration(remote: RemoteAdapter) -> None:
    declaration = remote.declaration
    assert remote.implementation == "remote"
    assert declaration.shortname == "echo-remote"
    assert declaration.kind is AdapterKind.FRAMEWORK
    assert declaration.scripted is False
    assert declaration.string_formats == {"email"}
    supported = {c for c in Capability if declaration.state(c) is CapabilityState.SUPPORTED}
    assert supported == {
        Capability.STRUCTURED_OUTPUT,
        Capability.MODEL_OVERRIDE,
        Capability.TOOL_REGISTRATION,
        Capability.TOOL_FILTER,
        Capability.STATEFUL_HISTORY,
    }
    assert declaration.state(Capability.EFFORT) is CapabilityState.UNSUPPORTED


async def test_the_unix_url_form_works_too(example: ExampleProcess) -> None:
    path = example.address.removeprefix("unix:")
    adapter = await connect_remote(f"unix://{path}")  # unix:///abs/path
    try:
        assert (await adapter.invoke(call("via url form"))).text == "remote:via url form"
    finally:
        await adapter.close()


async def test_invoke_and_produce(remote: RemoteAdapter) -> None:
    assert (await remote.invoke(call("hello"))).text == "remote:hello"
    reply = await remote.produce(produce_call("structured please"))
    assert json.loads(reply.text) == {"echo": "structured please"}


async def test_model_override_reaches_the_remote(remote: RemoteAdapter) -> None:
    reply = await remote.produce(produce_call("pick", model="model-b"))
    assert json.loads(reply.text) == {"echo": "pick", "model": "model-b"}


async def test_budget_depth_and_options_travel_with_the_call(remote: RemoteAdapter) -> None:
    reply = await remote.invoke(call("options:", time_budget=5, depth=2, model="model-c"))
    seen = json.loads(reply.text.removeprefix("remote:"))
    assert seen["options"] == {"model": "model-c", "timeBudget": "5s", "delegationDepth": 2}
    assert seen["metadata_delegation_depth"] == "2"
    assert 3 < seen["time_remaining"] < 5.5  # the gRPC deadline carries the same budget


@pytest.mark.slow
async def test_a_slow_remote_times_out_at_the_time_budget(remote: RemoteAdapter) -> None:
    started = time.monotonic()
    with pytest.raises(errors.AdapterTimeout) as raised:
        await remote.invoke(call("sleep:5", time_budget=0.5))
    assert time.monotonic() - started < 2
    assert raised.value.adapter == "echo-remote"
    assert "time budget" in raised.value.cause


@pytest.mark.parametrize(
    ("code", "error_class"),
    [
        ("UNAVAILABLE", errors.AdapterUnavailable),
        ("RESOURCE_EXHAUSTED", errors.AdapterRateLimited),
        ("FAILED_PRECONDITION", errors.AdapterRefused),
        ("INVALID_ARGUMENT", errors.AdapterRefused),
        ("UNIMPLEMENTED", errors.AdapterRefused),
        ("PERMISSION_DENIED", errors.AdapterMisconfigured),
        ("UNAUTHENTICATED", errors.AdapterMisconfigured),
        ("DEADLINE_EXCEEDED", errors.AdapterTimeout),
        ("INTERNAL", errors.AdapterInternal),
        ("DATA_LOSS", errors.AdapterInternal),
        ("ABORTED", errors.AdapterInternal),
        ("NOT_FOUND", errors.AdapterInternal),
    ],
)
async def test_remote_status_codes_map_to_the_taxonomy(
    remote: RemoteAdapter, code: str, error_class: type[errors.AdapterFailure]
) -> None:
    with pytest.raises(error_class) as raised:
        await remote.invoke(call(f"fail:{code}"))
    assert type(raised.value) is error_class
    assert raised.value.adapter == "echo-remote"
    assert code in raised.value.cause
    with pytest.raises(error_class):
        await remote.produce(produce_call(f"fail:{code}"))


async def test_resource_exhausted_keeps_the_retry_delay(remote: RemoteAdapter) -> None:
    with pytest.raises(errors.AdapterRateLimited) as raised:
        await remote.invoke(call("fail:RESOURCE_EXHAUSTED"))
    assert raised.value.retry_after == 2.0


async def test_cancelling_the_caller_cancels_the_remote_call(
    remote: RemoteAdapter, example: ExampleProcess
) -> None:
    task = asyncio.create_task(remote.invoke(call("sleep:30.25", time_budget=60)))
    await asyncio.sleep(0.3)
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 1
    line = await asyncio.to_thread(example.expect, "CANCELLED Invoke sleep:30.25", 5)
    assert line == "CANCELLED Invoke sleep:30.25"


async def test_undeclared_or_untransmittable_fields_are_refused_locally(remote: RemoteAdapter) -> None:
    with pytest.raises(errors.AdapterRefused) as raised:
        await remote.invoke(call(effort="high", persona="pirate"))
    assert "options.effort" in raised.value.cause
    assert "options.persona" in raised.value.cause
    uri = {"type": "object", "properties": {"u": {"type": "string", "format": "uri"}}}
    with pytest.raises(errors.AdapterRefused, match="string_formats:uri"):
        await remote.produce(AdapterCall(prompt="x", options=CallOptions(), output_schema=uri))
    mcp = (McpServer(name="files", transport="stdio", command="mcp-files"),)
    with pytest.raises(errors.AdapterRefused, match=r"options.mcp_servers"):
        await remote.invoke(call(mcp_servers=mcp, allow_unknown=frozenset({Capability.MCP})))


async def test_a_closed_adapter_is_unavailable(example: ExampleProcess) -> None:
    adapter = await connect_remote(example.address)
    await adapter.close()
    with pytest.raises(errors.AdapterUnavailable, match="closed"):
        await adapter.invoke(call())


async def test_a_missing_socket_is_unavailable(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(errors.AdapterUnavailable) as raised:
        await connect_remote(f"unix:{tmp_path}/nobody.sock", "ghost")
    assert time.monotonic() - started < 6
    assert raised.value.adapter == "ghost"


async def test_a_closed_port_is_unavailable() -> None:
    with pytest.raises(errors.AdapterUnavailable, match="cannot reach"):
        await connect_remote(f"127.0.0.1:{closed_port()}")


@pytest.mark.parametrize("target", ["", "nowhere", "host:port", "127.0.0.1:70000", "unix:", "unix://host/x"])
async def test_a_malformed_target_fails_registration(target: str) -> None:
    with pytest.raises(errors.AdapterRegistrationFailed, match="target must be"):
        await connect_remote(target)


async def test_a_shortname_mismatch_fails_registration(example: ExampleProcess) -> None:
    with pytest.raises(errors.AdapterRegistrationFailed) as raised:
        await connect_remote(example.address, "someone-else")
    assert '"echo-remote"' in raised.value.message
    assert raised.value.shortname == "someone-else"


class _FixedDeclaration(adapter_pb2_grpc.AdapterServiceServicer):
    def __init__(self, response: adapter_pb2.GetDeclarationResponse) -> None:
        self._response = response

    async def GetDeclaration(
        self, request: adapter_pb2.GetDeclarationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adapter_pb2.GetDeclarationResponse:
        return self._response

    async def Invoke(
        self, request: adapter_pb2.InvokeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adapter_pb2.InvokeResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "declaration only")

    async def Produce(
        self, request: adapter_pb2.ProduceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adapter_pb2.ProduceResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "declaration only")

    async def CallWithTools(
        self,
        request_iterator: AsyncIterator[adapter_pb2.CallWithToolsRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[adapter_pb2.CallWithToolsResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "declaration only")
        yield adapter_pb2.CallWithToolsResponse()  # never reached: makes this a stream handler

    async def InvokeStream(
        self, request: adapter_pb2.InvokeStreamRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[adapter_pb2.InvokeStreamResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "declaration only")
        yield adapter_pb2.InvokeStreamResponse()  # never reached: makes this a stream handler

    async def ProduceStream(
        self, request: adapter_pb2.ProduceStreamRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[adapter_pb2.ProduceStreamResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "declaration only")
        yield adapter_pb2.ProduceStreamResponse()  # never reached: makes this a stream handler


@pytest.fixture
async def declaring_server(tmp_path: Path) -> AsyncIterator[Any]:
    """Starts an in-process adapter that declares whatever the test gives it."""
    servers: list[grpc.aio.Server] = []

    async def serve(response: adapter_pb2.GetDeclarationResponse | None) -> str:
        server = grpc.aio.server()
        if response is not None:
            adapter_pb2_grpc.add_AdapterServiceServicer_to_server(_FixedDeclaration(response), server)
        address = f"unix:{tmp_path}/declaring{len(servers)}.sock"
        server.add_insecure_port(address)
        await server.start()
        servers.append(server)
        return address

    yield serve
    for server in servers:
        await server.stop(None)


def _declaration(**fields: Any) -> adapter_pb2.GetDeclarationResponse:
    values: dict[str, Any] = {"shortname": "odd", "kind": common_pb2.ADAPTER_KIND_AGENT_HARNESS, **fields}
    return adapter_pb2.GetDeclarationResponse(declaration=common_pb2.Declaration(**values))


@pytest.mark.parametrize(
    ("response", "fragment"),
    [
        (adapter_pb2.GetDeclarationResponse(), "no declaration"),
        (_declaration(shortname="Not Valid"), "Not Valid"),
        (_declaration(kind=common_pb2.ADAPTER_KIND_UNSPECIFIED), "kind"),
        (
            _declaration(capabilities=[common_pb2.CapabilityDeclaration(state=common_pb2.CAPABILITY_STATE_SUPPORTED)]),
            "capabilities[0].capability",
        ),
        (
            _declaration(
                capabilities=[common_pb2.CapabilityDeclaration(capability=common_pb2.CAPABILITY_MCP)]
            ),
            "capabilities[0].state",
        ),
        (_declaration(mcp_transports=["carrier-pigeon"]), "carrier-pigeon"),
        (None, "UNIMPLEMENTED"),
    ],
)  # fmt: skip
async def test_an_invalid_declaration_fails_registration(
    declaring_server: Any, response: adapter_pb2.GetDeclarationResponse | None, fragment: str
) -> None:
    address = await declaring_server(response)
    with pytest.raises(errors.AdapterRegistrationFailed) as raised:
        await connect_remote(address)
    assert fragment in raised.value.message


async def test_explicit_unknown_states_are_dropped_from_the_declaration(declaring_server: Any) -> None:
    supported = common_pb2.CapabilityDeclaration(
        capability=common_pb2.CAPABILITY_PERSONA, state=common_pb2.CAPABILITY_STATE_SUPPORTED
    )
    unknown = common_pb2.CapabilityDeclaration(
        capability=common_pb2.CAPABILITY_EFFORT, state=common_pb2.CAPABILITY_STATE_UNKNOWN
    )
    address = await declaring_server(_declaration(capabilities=[supported, unknown], scripted=True))
    adapter = await connect_remote(address, "odd")
    try:
        assert adapter.declaration.kind is AdapterKind.HARNESS
        implemented = implemented_in(adapter.contract_revision)
        carried = {c: s for c, s in adapter.declaration.capabilities.items() if c in implemented}
        assert carried == {Capability.PERSONA: CapabilityState.SUPPORTED}
        assert adapter.declaration.scripted is True
    finally:
        await adapter.close()


@pytest.mark.parametrize("revision", [0, 1])
async def test_what_the_adapters_contract_revision_cannot_carry_is_unsupported(
    revision: int, declaring_server: Any
) -> None:
    """An adapter built for revision 0 would ignore conversations, MCP servers, tools: never send them."""
    claims = [
        common_pb2.CapabilityDeclaration(capability=c, state=common_pb2.CAPABILITY_STATE_SUPPORTED)
        for c in (
            common_pb2.CAPABILITY_MCP,
            common_pb2.CAPABILITY_STATEFUL_HISTORY,
            common_pb2.CAPABILITY_TOOL_REGISTRATION,
            common_pb2.CAPABILITY_TOOL_FILTER,
            common_pb2.CAPABILITY_PERSONA,
        )
    ]
    response = _declaration(capabilities=claims, mcp_transports=["stdio"])
    response.contract_revision = revision
    adapter = await connect_remote(await declaring_server(response), "odd")
    try:
        assert adapter.contract_revision == revision
        expected = CapabilityState.SUPPORTED if revision >= 1 else CapabilityState.UNSUPPORTED
        for capability in (
            Capability.MCP,
            Capability.STATEFUL_HISTORY,
            Capability.TOOL_REGISTRATION,
            Capability.TOOL_FILTER,
        ):
            assert adapter.declaration.state(capability) is expected, capability
        assert adapter.declaration.state(Capability.PERSONA) is CapabilityState.SUPPORTED  # in every revision
    finally:
        await adapter.close()


async def test_provider_managed_depth_is_refused_for_a_revision_0_adapter(declaring_server: Any) -> None:
    claims = [
        common_pb2.CapabilityDeclaration(capability=c, state=common_pb2.CAPABILITY_STATE_SUPPORTED)
        for c in (common_pb2.CAPABILITY_DEPTH_LIMIT, common_pb2.CAPABILITY_SUBAGENTS)
    ]
    adapter = await connect_remote(await declaring_server(_declaration(capabilities=claims)), "odd")
    try:
        with pytest.raises(errors.AdapterRefused, match="contract revision 0"):
            await adapter.invoke(call(max_depth=MaxDepth(provider_managed=True)))
    finally:
        await adapter.close()


def remote_spec(target: str, declaration: DeclarationOverride | None = None, **options: Any) -> AdapterSpec:
    return AdapterSpec(
        shortname="echo-remote",
        implementation="remote",
        declaration=declaration,
        options=MappingProxyType({"target": target, **options}),
    )


async def test_config_builds_and_narrows_a_remote_adapter(example: ExampleProcess) -> None:
    narrowed = DeclarationOverride(
        capabilities=MappingProxyType({Capability.MODEL_OVERRIDE: CapabilityState.UNSUPPORTED})
    )
    adapter = await build_adapter_async(remote_spec(example.address, narrowed))
    try:
        assert adapter.implementation == "remote"
        assert adapter.declaration.state(Capability.MODEL_OVERRIDE) is CapabilityState.UNSUPPORTED
        with pytest.raises(errors.AdapterRefused, match=r"options.model"):
            await adapter.invoke(call(model="m"))
    finally:
        await adapter.close()


async def test_config_timeout_seconds_bounds_calls_without_a_budget(example: ExampleProcess) -> None:
    adapter = await build_adapter_async(remote_spec(example.address, timeout_seconds=0.3))
    try:
        with pytest.raises(errors.AdapterTimeout, match="timeout_seconds"):
            await adapter.invoke(call("sleep:3", time_budget=None))
    finally:
        await adapter.close()


async def test_config_may_not_widen_a_remote_declaration(example: ExampleProcess) -> None:
    widening = DeclarationOverride(
        capabilities=MappingProxyType({Capability.EFFORT: CapabilityState.SUPPORTED})
    )
    with pytest.raises(errors.ConfigError, match="effort"):
        await build_adapter_async(remote_spec(example.address, widening))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({}, "target"),
        ({"target": "nowhere"}, "target"),
        ({"target": "127.0.0.1:1", "timeout_seconds": 0}, "timeout_seconds"),
        ({"target": "127.0.0.1:1", "tls": True}, "tls"),
    ],
)
async def test_bad_remote_options_are_config_errors(options: dict[str, Any], named: str) -> None:
    spec = AdapterSpec(shortname="far", implementation="remote", options=MappingProxyType(options))
    with pytest.raises(errors.ConfigError) as raised:
        await build_adapter_async(spec)
    assert '"far"' in raised.value.message
    assert f"`{named}`" in raised.value.message


async def test_build_adapters_fails_whole_when_a_remote_is_unreachable(tmp_path: Path) -> None:
    scripted = AdapterSpec(
        shortname="demo",
        implementation="scripted",
        declaration=DeclarationOverride(kind=AdapterKind.FRAMEWORK),
    )
    unreachable = remote_spec(f"unix:{tmp_path}/missing.sock")
    with pytest.raises(errors.AdapterUnavailable, match="echo-remote"):
        await build_adapters([scripted, unreachable])


async def test_build_adapters_connects_remotes(example: ExampleProcess) -> None:
    scripted = AdapterSpec(
        shortname="demo",
        implementation="scripted",
        declaration=DeclarationOverride(kind=AdapterKind.FRAMEWORK),
    )
    adapters = await build_adapters([scripted, remote_spec(example.address)])
    try:
        assert [a.implementation for a in adapters] == ["scripted", "remote"]
        assert (await adapters[1].invoke(call("both"))).text == "remote:both"
    finally:
        for adapter in adapters:
            await adapter.close()


@pytest.mark.slow
def test_sigterm_stops_the_example_cleanly(tmp_path: Path) -> None:
    socket_path = tmp_path / "stopping.sock"
    running = ExampleProcess(f"unix:{socket_path}", "stopper")
    assert running.address == f"unix:{socket_path}"
    assert socket_path.exists()
    assert running.stop() == 0
    assert running.expect("STOPPED", within=1) == "STOPPED"
    assert not socket_path.exists()


@pytest.mark.slow
def test_the_example_listens_on_tcp_too() -> None:
    running = ExampleProcess("127.0.0.1:0", "tcp-echo")
    try:
        host, _, port = running.address.rpartition(":")
        assert host == "127.0.0.1"
        assert int(port) > 0

        async def roundtrip() -> str:
            adapter = await connect_remote(running.address, "tcp-echo")
            try:
                return (await adapter.invoke(call("over tcp"))).text
            finally:
                await adapter.close()

        assert asyncio.run(roundtrip()) == "remote:over tcp"
    finally:
        assert running.stop() == 0


def test_example_runs_without_the_project_on_its_path() -> None:
    # The example is a standalone program: it needs only the generated stubs and grpc.
    source = EXAMPLE.read_text()
    assert "agentsidecar.negotiator_service" not in source
    assert os.access(EXAMPLE, os.R_OK)


def test_call_options_carry_only_what_the_call_set() -> None:
    bare = call_options(AdapterCall(prompt="p", options=CallOptions()))
    assert not bare.HasField("model")
    assert not bare.HasField("max_depth")
    assert not bare.HasField("time_budget")
    assert not bare.HasField("tool_filter")
    assert not bare.HasField("conversation_id")
    assert not bare.settings.fields
    assert not bare.mcp_servers
    assert bare.max_depth_provider_managed is False
    full = call_options(
        AdapterCall(
            prompt="p",
            options=CallOptions(
                model="m",
                effort="low",
                profile="fast",
                persona="pirate",
                settings=MappingProxyType(
                    {"temperature": 0.2, "stop": ["a"], "nested": MappingProxyType({"k": 1})}
                ),
                max_depth=MaxDepth(depth=0),
                stream_events=True,
            ),
            time_budget=1.5,
            delegation_depth=3,
        )
    )
    assert (full.model, full.effort, full.profile, full.persona) == ("m", "low", "fast", "pirate")
    assert full.HasField("max_depth")
    assert full.max_depth == 0
    assert full.stream_events is True
    assert full.delegation_depth == 3
    assert full.time_budget.ToNanoseconds() == 1_500_000_000
    assert json_format.MessageToDict(full.settings) == {
        "temperature": 0.2,
        "stop": ["a"],
        "nested": {"k": 1.0},
    }


def test_call_options_carry_mcp_servers_the_tool_filter_and_provider_managed_depth() -> None:
    servers = (
        McpServer(
            name="files", transport="stdio", command="mcp-files", args=("--root", "/w"), env={"A": "1"}
        ),
        McpServer(name="search", transport="http", url="https://mcp.example/x", headers={"X-Key": "k"}),
    )
    options = call_options(
        AdapterCall(
            prompt="p",
            options=CallOptions(
                mcp_servers=servers,
                tool_filter=ToolFilter(allow=("read",), deny=("write",)),
                max_depth=MaxDepth(provider_managed=True),
                conversation_id="c-7",
            ),
        )
    )
    assert [json_format.MessageToDict(server) for server in options.mcp_servers] == [
        {
            "name": "files",
            "transport": "stdio",
            "command": "mcp-files",
            "args": ["--root", "/w"],
            "env": {"A": "1"},
        },
        {"name": "search", "transport": "http", "url": "https://mcp.example/x", "headers": {"X-Key": "k"}},
    ]
    assert (list(options.tool_filter.allow), list(options.tool_filter.deny)) == (["read"], ["write"])
    assert options.max_depth_provider_managed is True
    assert not options.HasField("max_depth")
    assert options.conversation_id == "c-7"
