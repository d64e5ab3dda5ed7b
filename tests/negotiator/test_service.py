"""NegotiatorService over a real socket: adapters, dry runs, brokered calls, deadlines and failures."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TypeAlias

import grpc
import pytest
from fakes import Hang, make_declaration
from google.protobuf import struct_pb2
from negotiator_testkit import ERROR_KINDS, EVERYTHING, add_fake, call_error

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.model import AdapterKind, Capability, MaxDepth, McpServer, ToolFilter
from agentsidecar.negotiator_service.server import RunningNegotiator
from agentsidecar.negotiator_service.status import DOMAIN

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"

OBJECT_SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "email": {"type": "string", "format": "email"}},
        "required": ["name"],
    }
)


# --- adapters -----------------------------------------------------------------


async def test_list_adapters_sorted_with_declarations(stub: Stub) -> None:
    response = await stub.ListAdapters(pb.ListAdaptersRequest(), timeout=5)
    names = [a.declaration.shortname for a in response.adapters]
    assert names == sorted(names)
    assert {"scripted-fw", "scripted-harness", "slow", "bad-output", "fail-timeout"} <= set(names)
    fw = next(a for a in response.adapters if a.declaration.shortname == "scripted-fw")
    assert fw.implementation == "scripted"
    assert fw.source == pb.ADAPTER_SOURCE_CONFIG
    assert fw.declaration.kind == common_pb2.ADAPTER_KIND_AGENT_FRAMEWORK
    assert fw.declaration.scripted
    assert fw.declaration.version.startswith("sha256:")
    assert list(fw.declaration.accepted_settings) == ["temperature"]
    states = {c.capability: c.state for c in fw.declaration.capabilities}
    assert states[common_pb2.CAPABILITY_PERSONA] == common_pb2.CAPABILITY_STATE_UNSUPPORTED
    assert states[common_pb2.CAPABILITY_STRUCTURED_OUTPUT] == common_pb2.CAPABILITY_STATE_SUPPORTED


async def test_the_tcp_listener_serves_too(negotiator: RunningNegotiator) -> None:
    tcp = negotiator.bound[1]
    assert tcp.startswith("127.0.0.1:")
    assert not tcp.endswith(":0")
    async with grpc.aio.insecure_channel(tcp) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        response = await stub.GetAdapter(pb.GetAdapterRequest(shortname="scripted-harness"), timeout=5)
    assert response.adapter.declaration.kind == common_pb2.ADAPTER_KIND_AGENT_HARNESS


async def test_get_unknown_adapter_is_not_found(stub: Stub) -> None:
    error = await call_error(stub.GetAdapter(pb.GetAdapterRequest(shortname="ghost"), timeout=5))
    assert error.code is grpc.StatusCode.NOT_FOUND
    assert (error.reason, error.domain) == ("ADAPTER_NOT_FOUND", DOMAIN)
    assert error.metadata["adapter"] == "ghost"


async def test_get_without_shortname_is_invalid(stub: Stub) -> None:
    error = await call_error(stub.GetAdapter(pb.GetAdapterRequest(), timeout=5))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert error.field_violations == (("shortname", "is required"),)


@pytest.mark.slow
async def test_watch_sends_existing_then_changes(stub: Stub, negotiator: RunningNegotiator) -> None:
    call = stub.WatchAdapters(pb.WatchAdaptersRequest())
    existing = [await call.read() for _ in range(len(negotiator.registry))]
    changes = {m.change for m in existing if isinstance(m, pb.WatchAdaptersResponse)}
    assert len(existing) == 10
    assert changes == {pb.ADAPTER_CHANGE_EXISTING}

    add_fake(negotiator, make_declaration("runtime-fake"), source="runtime")
    registered = await asyncio.wait_for(call.read(), 5)
    assert isinstance(registered, pb.WatchAdaptersResponse)
    assert registered.change == pb.ADAPTER_CHANGE_REGISTERED
    assert registered.adapter.declaration.shortname == "runtime-fake"
    assert registered.adapter.source == pb.ADAPTER_SOURCE_RUNTIME

    await stub.DeregisterAdapter(pb.DeregisterAdapterRequest(shortname="runtime-fake"), timeout=5)
    removed = await asyncio.wait_for(call.read(), 5)
    assert isinstance(removed, pb.WatchAdaptersResponse)
    assert removed.change == pb.ADAPTER_CHANGE_DEREGISTERED
    assert removed.adapter.declaration.shortname == "runtime-fake"
    assert negotiator.registry.watcher_count == 1
    call.cancel()
    for _ in range(100):  # a cancelled watch unsubscribes from the registry
        if negotiator.registry.watcher_count == 0:
            break
        await asyncio.sleep(0.02)
    assert negotiator.registry.watcher_count == 0


async def test_deregister_closes_the_adapter(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator, make_declaration("temp"), source="runtime")
    response = await stub.DeregisterAdapter(pb.DeregisterAdapterRequest(shortname="temp"), timeout=5)
    assert response.adapter.declaration.shortname == "temp"
    assert fake.close_count == 1
    error = await call_error(stub.GetAdapter(pb.GetAdapterRequest(shortname="temp"), timeout=5))
    assert error.code is grpc.StatusCode.NOT_FOUND


async def test_config_adapters_cannot_be_deregistered(stub: Stub) -> None:
    error = await call_error(stub.DeregisterAdapter(pb.DeregisterAdapterRequest(shortname="scripted-fw")))
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "ADAPTER_NOT_REMOVABLE"
    assert error.metadata == {"adapter": "scripted-fw", "source": "config"}
    listed = await stub.ListAdapters(pb.ListAdaptersRequest(), timeout=5)
    assert "scripted-fw" in [a.declaration.shortname for a in listed.adapters]


async def test_register_rejects_malformed_target_and_shortname(stub: Stub) -> None:
    error = await call_error(
        stub.RegisterAdapter(pb.RegisterAdapterRequest(target="nowhere", shortname="Bad Name"), timeout=5)
    )
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in error.field_violations] == ["target", "shortname"]


# --- brokered calls -------------------------------------------------------------


async def test_invoke_runs_the_adapter_and_returns_the_decision(stub: Stub) -> None:
    request = pb.InvokeRequest(adapter="scripted-fw", prompt="hello", options=pb.CallOptions(model="m1"))
    response = await stub.Invoke(request, timeout=5)
    assert response.text == "hello"
    decision = response.decision
    assert decision.adapter == "scripted-fw"
    assert decision.accepted
    assert decision.declaration_version.startswith("sha256:")
    assert [(v.requirement.capability, v.requirement.request_field, v.state) for v in decision.verdicts] == [
        (common_pb2.CAPABILITY_MODEL_OVERRIDE, "options.model", common_pb2.CAPABILITY_STATE_SUPPORTED)
    ]
    assert list(decision.gaps) == []


async def test_invoke_a_harness_with_agent(stub: Stub) -> None:
    response = await stub.Invoke(pb.InvokeRequest(agent="scripted-harness", prompt="go"), timeout=5)
    assert response.text == "harness reply"


async def test_produce_returns_schema_valid_output(stub: Stub) -> None:
    request = pb.ProduceRequest(adapter="scripted-fw", prompt="who?", output_schema=OBJECT_SCHEMA)
    response = await stub.Produce(request, timeout=5)
    assert json.loads(response.output_json) == {"name": "Ada", "email": "ada@example.org"}
    requirements = [
        (v.requirement.capability, v.requirement.set, v.requirement.member)
        for v in response.decision.verdicts
    ]
    assert requirements == [
        (common_pb2.CAPABILITY_STRUCTURED_OUTPUT, common_pb2.TYPED_SET_UNSPECIFIED, ""),
        (common_pb2.CAPABILITY_STRUCTURED_OUTPUT, common_pb2.TYPED_SET_STRING_FORMATS, "email"),
    ]


async def test_events_only_when_requested(stub: Stub) -> None:
    plain = await stub.Invoke(pb.InvokeRequest(adapter="scripted-fw", prompt="x"), timeout=5)
    assert list(plain.events) == []
    request = pb.InvokeRequest(adapter="scripted-fw", prompt="x", options=pb.CallOptions(stream_events=True))
    streamed = await stub.Invoke(request, timeout=5)
    assert [(e.type, e.text) for e in streamed.events] == [("message", "thinking")]


async def test_every_option_reaches_the_adapter_converted(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator)
    settings = struct_pb2.Struct()
    settings.update({"seed": 7, "temperature": 0.5})
    options = pb.CallOptions(
        model="m",
        effort="high",
        settings=settings,
        profile="p",
        mcp_servers=[
            pb.McpServer(name="fs", transport="stdio", command="npx", args=["srv"], env={"K": "V"}),
            pb.McpServer(name="docs", transport="streamable-http", url="http://localhost/mcp"),
        ],
        max_depth=pb.MaxDepth(depth=2),
        tool_filter=pb.ToolFilter(allow=["read"], deny=["write"]),
        persona="critic",
        stream_events=True,
    )
    await stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p", options=options), timeout=5)
    [(kind, call)] = fake.calls
    assert kind == "invoke"
    seen = call.options
    assert (seen.model, seen.effort, seen.profile, seen.persona) == ("m", "high", "p", "critic")
    assert dict(seen.settings) == {"seed": 7, "temperature": 0.5}
    assert isinstance(seen.settings["seed"], int)
    assert seen.mcp_servers[0] == McpServer("fs", "stdio", command="npx", args=("srv",), env={"K": "V"})
    assert seen.mcp_servers[1].url == "http://localhost/mcp"
    assert seen.max_depth == MaxDepth(depth=2)
    assert seen.tool_filter == ToolFilter(allow=("read",), deny=("write",))
    assert seen.stream_events is True
    assert call.delegation_depth == 0
    assert call.output_schema is None


async def test_delegation_depth_comes_from_metadata(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator)
    await stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p"), metadata=(("x-delegation-depth", "3"),))
    assert fake.calls[0][1].delegation_depth == 3
    error = await call_error(
        stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p"), metadata=(("x-delegation-depth", "-1"),))
    )
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert error.field_violations[0][0] == "metadata.x-delegation-depth"
    assert len(fake.calls) == 1


# --- dry runs and malformed requests ----------------------------------------------


async def test_negotiate_reports_verdicts_and_gaps_without_running(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(
        negotiator,
        make_declaration("partial", supported=[Capability.MODEL_OVERRIDE], unsupported=[Capability.PERSONA]),
    )
    call = pb.InvokeRequest(
        adapter="partial", prompt="p", options=pb.CallOptions(model="m", persona="x", effort="e")
    )
    response = await stub.Negotiate(pb.NegotiateRequest(invoke=call), timeout=5)
    decision = response.decision
    assert not decision.accepted
    assert [(v.requirement.request_field, v.state) for v in decision.verdicts] == [
        ("options.model", common_pb2.CAPABILITY_STATE_SUPPORTED),
        ("options.effort", common_pb2.CAPABILITY_STATE_UNKNOWN),
        # effort_levels:e: the declaration lists no levels, so any level
        ("options.effort", common_pb2.CAPABILITY_STATE_SUPPORTED),
        ("options.persona", common_pb2.CAPABILITY_STATE_UNSUPPORTED),
    ]
    assert [v.requirement.capability for v in decision.gaps] == [
        common_pb2.CAPABILITY_EFFORT,
        common_pb2.CAPABILITY_PERSONA,
    ]
    assert fake.calls == []


async def test_negotiate_accepts_a_call_the_declaration_meets(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator)
    call = pb.ProduceRequest(adapter="fake", prompt="p", output_schema=OBJECT_SCHEMA)
    response = await stub.Negotiate(pb.NegotiateRequest(produce=call), timeout=5)
    assert response.decision.accepted
    assert list(response.decision.gaps) == []
    assert fake.calls == []


async def test_malformed_schema_is_invalid_argument_with_bad_request(stub: Stub) -> None:
    request = pb.ProduceRequest(adapter="scripted-fw", prompt="p", output_schema='{"type": "obj"}')
    error = await call_error(stub.Produce(request, timeout=5))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert error.reason == "INVALID_REQUEST"
    [(field, description)] = error.field_violations
    assert field == "output_schema"
    assert "/type" in description

    dry = await call_error(stub.Negotiate(pb.NegotiateRequest(produce=request), timeout=5))
    assert dry.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in dry.field_violations] == ["produce.output_schema"]


async def test_every_malformed_field_is_reported_at_once(stub: Stub) -> None:
    request = pb.ProduceRequest(adapter="", prompt="", output_schema="not json")
    error = await call_error(stub.Produce(request, timeout=5))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in error.field_violations] == ["adapter", "prompt", "output_schema"]


async def test_unknown_allow_unknown_enum_is_invalid(stub: Stub) -> None:
    request = pb.InvokeRequest(
        adapter="scripted-fw",
        prompt="p",
        options=pb.CallOptions(allow_unknown=[common_pb2.Capability.ValueType(n) for n in (0, 99)]),
    )
    error = await call_error(stub.Invoke(request, timeout=5))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in error.field_violations] == ["options.allow_unknown[0]", "options.allow_unknown[1]"]


async def test_output_violating_the_schema_lists_violations(stub: Stub) -> None:
    schema = json.dumps(
        {"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": False}
    )
    error = await call_error(
        stub.Produce(pb.ProduceRequest(adapter="bad-output", prompt="p", output_schema=schema), timeout=5)
    )
    assert error.code is grpc.StatusCode.INTERNAL
    assert error.reason == "OUTPUT_SCHEMA_VIOLATION"
    assert error.metadata["adapter"] == "bad-output"
    assert error.metadata["violations"] == "2"
    subjects = sorted(v.subject for v in error.precondition_violations)
    assert subjects == ["/", "/name"]
    assert all(v.type == "OUTPUT_SCHEMA" for v in error.precondition_violations)
    assert any('not of type "string"' in v.description for v in error.precondition_violations)


# --- deadlines and cancellation ---------------------------------------------------


@pytest.mark.slow
async def test_slow_adapter_hits_the_callers_deadline(stub: Stub) -> None:
    started = time.monotonic()
    error = await call_error(stub.Invoke(pb.InvokeRequest(adapter="slow", prompt="p"), timeout=0.5))
    elapsed = time.monotonic() - started
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert elapsed < 2.0


@pytest.mark.slow
async def test_server_side_timeout_is_deadline_exceeded_naming_the_adapter(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    # A generous client deadline, but the margin the server keeps back is large:
    # the broker's own deadline fires first and is reported with its ErrorInfo.
    negotiator.servicer._deadline_margin = 0.4
    error = await call_error(stub.Invoke(pb.InvokeRequest(adapter="slow", prompt="p"), timeout=0.8))
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert error.reason == "ADAPTER_TIMEOUT"
    assert error.metadata["adapter"] == "slow"


async def test_adapter_gets_a_budget_within_the_callers_deadline(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator)
    await stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p"), timeout=2.0)
    budget = fake.calls[0][1].time_budget
    assert budget is not None
    assert 1.0 < budget <= 2.0

    await stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p"))  # no deadline at all
    assert fake.calls[1][1].time_budget is None

    negotiator.servicer._deadline_margin = 0.5  # the margin is kept back from the adapter
    await stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p"), timeout=2.0)
    kept_back = fake.calls[2][1].time_budget
    assert kept_back is not None
    # The grpc-timeout header rounds the deadline up by a few ms, so the server
    # sees slightly more than 2.0 s left; that is what the default margin absorbs.
    assert 0.5 < kept_back <= 1.52


async def test_client_cancellation_reaches_the_adapter(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator, default=Hang())
    call = stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p"), timeout=10)
    await asyncio.wait_for(fake.started.wait(), 5)
    assert call.cancel()
    for _ in range(100):
        if fake.cancelled:
            break
        await asyncio.sleep(0.02)
    assert [kind for kind, _ in fake.cancelled] == ["invoke"]
    assert fake.completed == []


# --- adapter failures ---------------------------------------------------------------

FAILURE_CODES = {
    "unavailable": (grpc.StatusCode.UNAVAILABLE, "ADAPTER_UNAVAILABLE"),
    "timeout": (grpc.StatusCode.DEADLINE_EXCEEDED, "ADAPTER_TIMEOUT"),
    "rate_limited": (grpc.StatusCode.RESOURCE_EXHAUSTED, "ADAPTER_RATE_LIMITED"),
    "refused": (grpc.StatusCode.FAILED_PRECONDITION, "ADAPTER_REFUSED"),
    "misconfigured": (grpc.StatusCode.FAILED_PRECONDITION, "ADAPTER_MISCONFIGURED"),
    "internal": (grpc.StatusCode.INTERNAL, "ADAPTER_INTERNAL"),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ERROR_KINDS)
async def test_each_adapter_failure_maps_to_its_code(stub: Stub, kind: str) -> None:
    shortname = f"fail-{kind.replace('_', '-')}"
    error = await call_error(stub.Invoke(pb.InvokeRequest(adapter=shortname, prompt="p"), timeout=5))
    assert (error.code, error.reason) == FAILURE_CODES[kind]
    assert error.code is not grpc.StatusCode.UNKNOWN
    assert error.domain == DOMAIN
    assert error.metadata["adapter"] == shortname
    assert error.metadata["cause"] == f"scripted {kind}"
    if kind == "rate_limited":
        assert error.retry_after_seconds == 2.0
    else:
        assert error.retry_after_seconds is None


async def test_an_adapter_crash_is_internal_naming_the_adapter(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    add_fake(negotiator, default=RuntimeError("kaboom"))
    error = await call_error(stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p"), timeout=5))
    assert error.code is grpc.StatusCode.INTERNAL
    assert error.reason == "ADAPTER_INTERNAL"
    assert error.metadata["adapter"] == "fake"
    assert "kaboom" in error.metadata["cause"]


async def test_a_bug_in_the_negotiator_is_internal_not_unknown(
    stub: Stub, negotiator: RunningNegotiator, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object, **__: object) -> None:
        raise KeyError("bug")

    monkeypatch.setattr(negotiator.broker, "negotiate", broken)
    error = await call_error(
        stub.Negotiate(pb.NegotiateRequest(invoke=pb.InvokeRequest(adapter="fake", prompt="p")), timeout=5)
    )
    assert error.code is grpc.StatusCode.INTERNAL
    assert error.reason == "INTERNAL"
    assert error.metadata == {"operation": "Negotiate", "exception": "KeyError"}


async def test_a_harness_fake_is_selected_by_agent(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator, make_declaration("h", AdapterKind.HARNESS))
    response = await stub.Invoke(pb.InvokeRequest(agent="h", prompt="hi"), timeout=5)
    assert response.text == "hi"
    assert len(fake.calls) == 1
    assert EVERYTHING.kind is AdapterKind.FRAMEWORK


async def test_a_bug_in_a_watch_is_internal_not_unknown(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> None:
        raise ValueError("bug")

    monkeypatch.setattr("agentsidecar.negotiator_service.convert.watch_response", broken)
    call = stub.WatchAdapters(pb.WatchAdaptersRequest())
    error = await call_error(call.read())
    assert error.code is grpc.StatusCode.INTERNAL
    assert error.metadata == {"operation": "WatchAdapters", "exception": "ValueError"}
