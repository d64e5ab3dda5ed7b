"""NegotiatorClient and AsyncNegotiatorClient against the real negotiator, every RPC."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsidecar.clients import (
    AdapterKindMismatchError,
    AdapterNotFoundError,
    AdapterNotRemovableError,
    AdapterRateLimitedError,
    AlreadyExistsError,
    AsyncNegotiatorClient,
    Gap,
    InvalidArgumentError,
    NegotiatorClient,
    OutputSchemaViolationError,
    UnsupportedCapabilityError,
    call_options,
)
from agentsidecar.clients.negotiator import tool_spec
from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator_service import server as negotiator_server
from tests.clients.sidecars import REFUSE_PROMPT, FakeNegotiator, ServerHandle, ServerLoop

SCHEMA = {
    "type": "object",
    "properties": {"summary": {"type": "string"}, "ok": {"type": "boolean"}},
    "required": ["summary", "ok"],
}


def gap_of(verdict: pb.Verdict) -> Gap:
    """A Decision's gap verdict in the shape the refusal's gaps are decoded into."""
    requirement = verdict.requirement
    in_set = requirement.set != common_pb2.TYPED_SET_UNSPECIFIED
    return Gap(
        capability=common_pb2.Capability.Name(requirement.capability).removeprefix("CAPABILITY_").lower(),
        set=common_pb2.TypedSet.Name(requirement.set).removeprefix("TYPED_SET_").lower() if in_set else None,
        member=requirement.member if in_set else None,
        request_field=requirement.request_field,
        state=common_pb2.CapabilityState.Name(verdict.state).removeprefix("CAPABILITY_STATE_").lower(),
    )


def test_sync_adapters_negotiate_produce_invoke(negotiator: ServerHandle) -> None:
    with NegotiatorClient(negotiator.unix) as client:
        assert [a.declaration.shortname for a in client.list_adapters()] == [
            "bad-output",
            "demo",
            "shell-echo",
            "throttled",
        ]
        assert client.get_adapter("shell-echo").implementation == "command"

        options = call_options(model="small", settings={"temperature": 0.2})
        decision = client.negotiate(adapter="demo", prompt="hi", output_schema=SCHEMA, options=options)
        assert decision.accepted
        assert [v.requirement.request_field for v in decision.verdicts] == [
            "output_schema",
            "options.model",
            "options.settings",
            "options.settings.temperature",
        ]
        produced = client.produce(adapter="demo", prompt="hi", output_schema=SCHEMA, options=options)
        assert json.loads(produced.output_json) == {"summary": "scripted reply", "ok": True}
        assert produced.decision.adapter == "demo"

        assert client.invoke(adapter="demo", prompt="echo me").text == "echo me"
        assert client.invoke(agent="shell-echo", prompt="through cat").text.strip() == "through cat"
        # Request protos still work, as the negotiator CLI passes them.
        assert client.negotiate(pb.InvokeRequest(adapter="demo", prompt="x")).accepted


async def test_async_adapters_negotiate_produce_invoke(negotiator: ServerHandle) -> None:
    async with AsyncNegotiatorClient(negotiator.tcp) as client:
        assert len(await client.list_adapters()) == 4
        assert (await client.get_adapter("demo")).declaration.kind == common_pb2.ADAPTER_KIND_AGENT_FRAMEWORK
        decision = await client.negotiate(agent="shell-echo", prompt="hi", output_schema=SCHEMA)
        assert not decision.accepted
        assert [gap_of(v) for v in decision.gaps] == [
            Gap("structured_output", None, None, "output_schema", "unsupported")
        ]
        produced = await client.produce(adapter="demo", prompt="hi", output_schema=json.dumps(SCHEMA))
        assert json.loads(produced.output_json)["ok"] is True
        assert (await client.invoke(adapter="demo", prompt="async echo")).text == "async echo"


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_refusal_carries_the_same_gaps_as_the_dry_run(negotiator: ServerHandle, flavour: str) -> None:
    options = call_options(model="small", settings={"temperature": 0.2, "seed": 7}, persona="pirate")
    call = {"agent": "shell-echo", "prompt": "hi", "output_schema": SCHEMA, "options": options}
    if flavour == "sync":
        with NegotiatorClient(negotiator.unix) as client:
            decision = client.negotiate(**call)  # type: ignore[arg-type]
            with pytest.raises(UnsupportedCapabilityError) as refused:
                client.produce(**call)  # type: ignore[arg-type]
    else:
        async with AsyncNegotiatorClient(negotiator.unix) as aio_client:
            decision = await aio_client.negotiate(**call)  # type: ignore[arg-type]
            with pytest.raises(UnsupportedCapabilityError) as refused:
                await aio_client.produce(**call)  # type: ignore[arg-type]
    assert list(refused.value.gaps) == [gap_of(v) for v in decision.gaps]
    assert len(refused.value.gaps) >= 4  # schema, model, persona and the two settings
    assert refused.value.adapter == "shell-echo"
    assert refused.value.declaration_version == decision.declaration_version


def test_other_negotiator_errors_are_typed(negotiator: ServerHandle) -> None:
    with NegotiatorClient(negotiator.unix) as client:
        with pytest.raises(AdapterNotFoundError) as missing:
            client.get_adapter("nope")
        assert missing.value.adapter == "nope"
        with pytest.raises(AdapterKindMismatchError) as mismatch:
            client.produce(adapter="shell-echo", prompt="hi", output_schema=SCHEMA)
        assert (mismatch.value.kind, mismatch.value.selected_by) == ("agent-harness", "adapter")
        with pytest.raises(InvalidArgumentError) as invalid:
            client.invoke(adapter="demo", prompt="")
        assert "prompt" in invalid.value.fields
        with pytest.raises(OutputSchemaViolationError) as broken:
            client.produce(adapter="bad-output", prompt="hi", output_schema=SCHEMA)
        assert sorted(v.pointer for v in broken.value.violations) == ["/", "/summary"]  # wrong type, no "ok"
        with pytest.raises(AdapterRateLimitedError) as throttled:
            client.invoke(adapter="throttled", prompt="hi")
        assert (throttled.value.retry_after, throttled.value.adapter) == (2.0, "throttled")
        with pytest.raises(AdapterNotRemovableError):
            client.deregister_adapter("demo")


@pytest.mark.slow
def test_register_watch_and_deregister(negotiator: ServerHandle, remote_adapter: str) -> None:
    with NegotiatorClient(negotiator.unix) as client:
        watch = client.watch()
        existing = [next(watch) for _ in range(4)]
        assert {c.change for c in existing} == {pb.ADAPTER_CHANGE_EXISTING}

        registered = client.register_adapter(remote_adapter, "echo-remote")
        assert (registered.declaration.shortname, registered.source) == (
            "echo-remote",
            pb.ADAPTER_SOURCE_RUNTIME,
        )
        change = next(watch)
        assert (change.change, change.adapter.declaration.shortname) == (
            pb.ADAPTER_CHANGE_REGISTERED,
            "echo-remote",
        )
        assert client.invoke(adapter="echo-remote", prompt="hi").text == "remote:hi"
        with pytest.raises(AlreadyExistsError):
            client.register_adapter(remote_adapter, "echo-remote")

        assert client.deregister_adapter("echo-remote").declaration.shortname == "echo-remote"
        assert next(watch).change == pb.ADAPTER_CHANGE_DEREGISTERED
        watch.close()


@pytest.mark.slow
async def test_async_register_watch_and_deregister(negotiator: ServerHandle, remote_adapter: str) -> None:
    async with AsyncNegotiatorClient(negotiator.unix) as client:
        watch = client.watch_adapters()
        for _ in range(4):
            assert (await anext(watch)).change == pb.ADAPTER_CHANGE_EXISTING
        await client.register_adapter(remote_adapter, shortname="echo-remote")
        assert (await asyncio.wait_for(anext(watch), 5)).change == pb.ADAPTER_CHANGE_REGISTERED
        removed = await client.deregister_adapter("echo-remote")
        assert removed.source == pb.ADAPTER_SOURCE_RUNTIME
        assert (await asyncio.wait_for(anext(watch), 5)).change == pb.ADAPTER_CHANGE_DEREGISTERED
        await watch.aclose()
        with pytest.raises(AdapterNotFoundError):
            await client.deregister_adapter("echo-remote")


def test_call_options_from_python_values() -> None:
    options = call_options(
        model="m",
        settings={"temperature": 0.5},
        max_depth="provider-managed",
        allow_tools=["read"],
        allow_unknown=["persona", "CAPABILITY_HOOKS"],
        stream_events=True,
    )
    assert options.model == "m"
    assert dict(options.settings) == {"temperature": 0.5}
    assert options.max_depth.provider_managed
    assert list(options.tool_filter.allow) == ["read"]
    assert list(options.allow_unknown) == [common_pb2.CAPABILITY_PERSONA, common_pb2.CAPABILITY_HOOKS]
    assert call_options(max_depth=0).max_depth.HasField("depth")
    assert not call_options().HasField("model")
    with pytest.raises(ValueError, match="is not one of: structured_output, tool_registration"):
        call_options(allow_unknown=["telepathy"])


# --- ToolSession, WatchAudit, Bootstrap ---------------------------------------------------------

LOOKUP = tool_spec("lookup", arguments_schema={"type": "object"}, risk="read_only")
EXPLODE = tool_spec("explode", arguments_schema={"type": "object"}, risk="read_only")
SEND = tool_spec("send", arguments_schema={"type": "object"}, description="sends a message")


def run_tool(call: pb.ToolCall) -> object:
    if call.name == "explode":
        raise RuntimeError("boom")
    return {"tool": call.name, "arguments": json.loads(call.arguments_json)}


@pytest.mark.slow
def test_a_sync_tool_session_answers_every_tool_call_and_approval(
    fake_negotiator: tuple[FakeNegotiator, str],
) -> None:
    fake, target = fake_negotiator
    asked: list[str] = []

    def approve(request: pb.ApprovalRequest) -> pb.ToolApproval:
        asked.append(request.tool_name)
        return pb.ToolApproval(decision=pb.APPROVAL_DECISION_EDIT, edited_arguments_json='{"to": "eve"}')

    with NegotiatorClient(target) as client:
        reply = client.tool_session(
            pb.InvokeRequest(adapter="fake", prompt="go"),
            tools=[LOOKUP, EXPLODE, SEND],
            run_tool=run_tool,
            approve=approve,
        )
    assert asked == ["send"]
    assert json.loads(reply.text) == [
        {"toolResult": {"callId": "c1", "resultJson": '{"tool": "lookup", "arguments": {}}'}},
        {"toolResult": {"callId": "c2", "error": "boom"}},
        {
            "approval": {
                "callId": "c3",
                "decision": "APPROVAL_DECISION_EDIT",
                "editedArgumentsJson": '{"to": "eve"}',
            }
        },
        {"toolResult": {"callId": "c3", "resultJson": '{"tool": "send", "arguments": {"to": "eve"}}'}},
    ]
    assert [t.name for t in fake.received[0].start.tools] == ["lookup", "explode", "send"]


async def test_an_async_tool_session_takes_coroutine_handlers_and_denies_without_approve(
    fake_negotiator: tuple[FakeNegotiator, str],
) -> None:
    _, target = fake_negotiator

    async def lookup(call: pb.ToolCall) -> object:
        await asyncio.sleep(0)
        return run_tool(call)

    async with AsyncNegotiatorClient(target) as client:
        reply = await client.tool_session(
            pb.InvokeRequest(adapter="fake", prompt="go"), tools=[LOOKUP], run_tool=lookup
        )
    answers = json.loads(reply.text)
    assert answers[2] == {
        "approval": {
            "callId": "c3",
            "decision": "APPROVAL_DECISION_DENY",
            "reason": "this caller approves no tool calls",
        }
    }
    assert len(answers) == 3  # denied: `send` never ran


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_refused_tool_session_raises_the_refusal(
    fake_negotiator: tuple[FakeNegotiator, str], flavour: str
) -> None:
    _, target = fake_negotiator
    call = pb.InvokeRequest(adapter="fake", prompt=REFUSE_PROMPT)

    async def start() -> None:
        if flavour == "sync":
            with NegotiatorClient(target) as client:
                client.tool_session(call, tools=[LOOKUP], run_tool=run_tool)
        else:
            async with AsyncNegotiatorClient(target) as aio_client:
                await aio_client.tool_session(call, tools=[LOOKUP], run_tool=run_tool)

    with pytest.raises(UnsupportedCapabilityError) as refused:
        await start()
    assert refused.value.gaps == (Gap("tool_registration", None, None, "tools", "unsupported"),)


async def test_bootstrap_sends_python_values_as_the_request(
    fake_negotiator: tuple[FakeNegotiator, str],
) -> None:
    _, target = fake_negotiator
    with NegotiatorClient(target) as client:
        echoed = client.bootstrap(
            capability="voice_message", local_only=True, approved_gates=["provider_cost_approval"], run=True
        )
    assert json.loads(echoed.selected) == {
        "capability": "voice_message",
        "localOnly": True,
        "approvedGates": ["GATE_PROVIDER_COST_APPROVAL"],
        "run": True,
    }
    async with AsyncNegotiatorClient(target) as aio_client:
        echoed = await aio_client.bootstrap(pb.BootstrapRequest(capability="tts", seed="voice/say"))
    assert json.loads(echoed.selected) == {"capability": "tts", "seed": "voice/say"}
    with pytest.raises(ValueError, match="is not one of"):
        tool_spec("x", arguments_schema={}, risk="reckless")


async def test_watch_audit_sees_the_decisions(negotiator: ServerHandle) -> None:
    async with AsyncNegotiatorClient(negotiator.unix) as client:
        records = client.watch_audit()
        waiting = asyncio.ensure_future(anext(records))
        while not waiting.done():  # until the watch is registered and a decision reaches it
            await client.negotiate(adapter="demo", prompt="audited", output_schema=SCHEMA)
            await asyncio.wait([waiting], timeout=0.1)
        record = waiting.result()
        assert (record.operation, record.adapter, record.outcome) == ("negotiate", "demo", "accepted")
        with pytest.raises(UnsupportedCapabilityError):
            await client.produce(agent="shell-echo", prompt="audited", output_schema=SCHEMA)
        async with asyncio.timeout(5):
            async for record in records:
                if record.operation == "produce":
                    assert (record.adapter, record.outcome) == ("shell-echo", "refused")
                    assert record.error_reason == "UNSUPPORTED_CAPABILITY"
                    break
        await records.aclose()


TOOLSMITH_CONFIG = """\
adapters:
  - shortname: toolsmith
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {tool_registration: supported}
    options:
      tool_calls:
        - {name: lookup, arguments: {q: weather}}
        - {name: send, arguments: {to: bob}}
      reply_with_tool_results: true
"""


@pytest.fixture
def toolsmith(server_loop: ServerLoop, socket_dir: Path, tmp_path: Path) -> Iterator[str]:
    """A real negotiator whose scripted `toolsmith` calls the caller's `lookup`, then `send`."""
    config = tmp_path / "tools.yaml"
    config.write_text(TOOLSMITH_CONFIG)
    settings = negotiator_server.Settings(listen=(f"unix:{socket_dir / 'tools.sock'}",), config_path=config)
    running = server_loop.run(negotiator_server.create_server(settings))
    try:
        yield running.bound[0]
    finally:
        server_loop.run(running.stop())


@pytest.mark.parametrize("allow", [True, False])
def test_a_tool_session_against_the_real_negotiator(toolsmith: str, allow: bool) -> None:
    with NegotiatorClient(toolsmith) as client:
        reply = client.tool_session(
            pb.InvokeRequest(adapter="toolsmith", prompt="use the tools"),
            tools=[LOOKUP, SEND],
            run_tool=run_tool,
            approve=lambda request: allow and request.tool_name == "send",
        )
    results = json.loads(reply.text)["tool_results"]
    assert results[0] == {"name": "lookup", "result": {"tool": "lookup", "arguments": {"q": "weather"}}}
    if allow:
        assert results[1] == {"name": "send", "result": {"tool": "send", "arguments": {"to": "bob"}}}
    else:
        assert results[1] == {"name": "send", "error": "denied by the caller", "denied": True}
