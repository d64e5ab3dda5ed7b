"""The broker: refuse before dispatch, run within the budget, map failures, check output."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from typing import Any

import pytest
from fakes import FakeAdapter, Hang, make_declaration

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.broker import Broker
from agentsidecar.negotiator_service.mcp_policy import McpPolicy
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterKind,
    AdapterReply,
    CallKind,
    CallOptions,
    CallRequest,
    Capability,
    CapabilityState,
    Declaration,
    MaxDepth,
    McpServer,
    StreamEvent,
    ToolFilter,
    TypedSet,
)
from agentsidecar.negotiator_service.negotiation import frozen_json
from agentsidecar.negotiator_service.registry import AdapterRegistry, RegisteredAdapter

SUPPORTED = CapabilityState.SUPPORTED
UNKNOWN = CapabilityState.UNKNOWN
UNSUPPORTED = CapabilityState.UNSUPPORTED

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name"],
    "additionalProperties": False,
}

EVERYTHING = make_declaration(
    "all",
    supported=list(Capability),
    mcp_transports=["stdio", "sse", "http"],
    accepted_settings=["temperature", "seed", "top_k"],
    string_formats=["email", "date", "uuid"],
)


def setup(declaration: Declaration = EVERYTHING, **fake: Any) -> tuple[Broker, FakeAdapter]:
    adapter = FakeAdapter(declaration, **fake)
    registry = AdapterRegistry()
    registry.add(RegisteredAdapter(adapter, "config"))
    # The caller-supplied MCP servers these tests name are admitted (mcp_policy.py).
    policy = McpPolicy(caller_stdio_commands=frozenset({"x"}), caller_hosts=frozenset({"127.0.0.1"}))
    return Broker(registry, mcp_policy=policy), adapter


def produce(schema: Any = SCHEMA, target: str = "all", **options: Any) -> CallRequest:
    return CallRequest(
        CallKind.PRODUCE,
        "give me json",
        adapter=target,
        output_schema=json.dumps(schema),
        options=CallOptions(**options),
    )


def invoke(target: str = "all", **options: Any) -> CallRequest:
    return CallRequest(CallKind.INVOKE, "say hi", adapter=target, options=CallOptions(**options))


# One request per derivable requirement, with the requirement it must produce.
REQUIREMENT_CASES: list[tuple[str, CallRequest, Capability, TypedSet | None, str]] = [
    ("structured_output", produce({"type": "object"}), Capability.STRUCTURED_OUTPUT, None, ""),
    (
        "string_format",
        produce({"format": "uuid"}),
        Capability.STRUCTURED_OUTPUT,
        TypedSet.STRING_FORMATS,
        "uuid",
    ),
    ("model", invoke(model="m"), Capability.MODEL_OVERRIDE, None, ""),
    ("effort", invoke(effort="high"), Capability.EFFORT, None, ""),
    ("settings", invoke(settings={"temperature": 1}), Capability.SETTINGS, None, ""),
    ("setting_key", invoke(settings={"top_k": 1}), Capability.SETTINGS, TypedSet.ACCEPTED_SETTINGS, "top_k"),
    ("profile", invoke(profile="p"), Capability.PROFILE_OVERRIDE, None, ""),
    ("mcp", invoke(mcp_servers=(McpServer("s", "stdio", command="x"),)), Capability.MCP, None, ""),
    (
        "mcp_transport",
        invoke(mcp_servers=(McpServer("s", "sse", url="http://127.0.0.1:1/"),)),
        Capability.MCP,
        TypedSet.MCP_TRANSPORTS,
        "sse",
    ),
    ("max_depth", invoke(max_depth=MaxDepth(depth=1)), Capability.DEPTH_LIMIT, None, ""),
    ("provider_managed", invoke(max_depth=MaxDepth(provider_managed=True)), Capability.SUBAGENTS, None, ""),
    ("tool_filter", invoke(tool_filter=ToolFilter(deny=("rm",))), Capability.TOOL_FILTER, None, ""),
    ("persona", invoke(persona="critic"), Capability.PERSONA, None, ""),
    ("stream_events", invoke(stream_events=True), Capability.STREAM_EVENTS, None, ""),
]


def without(capability: Capability, typed_set: TypedSet | None, member: str) -> Declaration:
    """EVERYTHING, except the one requirement: its capability unsupported or its member missing."""
    if typed_set is None:
        return dataclasses.replace(
            EVERYTHING, capabilities={c: SUPPORTED for c in Capability} | {capability: UNSUPPORTED}
        )

    def kept(which: TypedSet) -> frozenset[str]:
        return EVERYTHING.members(which) - {member} if which is typed_set else EVERYTHING.members(which)

    return dataclasses.replace(
        EVERYTHING,
        mcp_transports=kept(TypedSet.MCP_TRANSPORTS),
        accepted_settings=kept(TypedSet.ACCEPTED_SETTINGS),
        string_formats=kept(TypedSet.STRING_FORMATS),
    )


@pytest.mark.parametrize(
    ("request_", "capability", "typed_set", "member"),
    [case[1:] for case in REQUIREMENT_CASES],
    ids=[case[0] for case in REQUIREMENT_CASES],
)
async def test_every_requirement_refuses_before_dispatch(
    request_: CallRequest, capability: Capability, typed_set: TypedSet | None, member: str
) -> None:
    broker, adapter = setup(without(capability, typed_set, member))
    with pytest.raises(errors.UnsupportedCapability) as caught:
        await broker.call(request_, time_budget=5)
    [gap] = caught.value.decision.gaps
    assert (gap.requirement.capability, gap.requirement.typed_set, gap.requirement.member) == (
        capability,
        typed_set,
        member,
    )
    assert gap.state is UNSUPPORTED
    assert adapter.call_count == 0
    assert broker.negotiate(request_).gaps == caught.value.decision.gaps


@pytest.mark.parametrize(
    "request_", [case[1] for case in REQUIREMENT_CASES], ids=[case[0] for case in REQUIREMENT_CASES]
)
async def test_every_requirement_passes_when_declared(request_: CallRequest) -> None:
    broker, adapter = setup(default='{"name": "x"}' if request_.kind is CallKind.PRODUCE else None)
    _reply, decision = await broker.call(request_, time_budget=5)
    assert decision.accepted
    assert adapter.call_count == 1


async def test_typed_set_members_name_the_request_field() -> None:
    declaration = make_declaration(
        supported=[Capability.STRUCTURED_OUTPUT, Capability.SETTINGS, Capability.MCP],
        mcp_transports=["stdio"],
        accepted_settings=["temperature"],
        string_formats=["date"],
    )
    broker, adapter = setup(declaration)
    request = produce(
        {"properties": {"email": {"format": "email"}}},
        target="fake",
        settings={"temperature": 0.3, "seed": 1},
        mcp_servers=(
            McpServer("a", "stdio", command="x"),
            McpServer("b", "streamable-http", url="http://127.0.0.1:1/"),
        ),
    )
    with pytest.raises(errors.UnsupportedCapability) as caught:
        await broker.call(request, time_budget=5)
    gaps = [(g.requirement.describe(), g.requirement.request_field) for g in caught.value.decision.gaps]
    assert gaps == [
        ("string_formats:email", "output_schema/properties/email/format"),
        ("accepted_settings:seed", "options.settings.seed"),
        ("mcp_transports:http", "options.mcp_servers[1].transport"),
    ]
    assert adapter.call_count == 0


async def test_several_gaps_are_all_listed_in_the_refusal() -> None:
    broker, adapter = setup(make_declaration(unsupported=[Capability.MODEL_OVERRIDE, Capability.PERSONA]))
    request = invoke("fake", model="m", persona="p", effort="low")
    with pytest.raises(errors.UnsupportedCapability) as caught:
        await broker.call(request, time_budget=5)
    assert [(g.requirement.capability, g.state) for g in caught.value.decision.gaps] == [
        (Capability.MODEL_OVERRIDE, UNSUPPORTED),
        (Capability.EFFORT, UNKNOWN),
        (Capability.PERSONA, UNSUPPORTED),
    ]
    assert "model_override (unsupported)" in caught.value.message
    assert "effort (unknown)" in caught.value.message
    assert "persona (unsupported)" in caught.value.message
    assert adapter.call_count == 0


async def test_unknown_is_refused_by_default() -> None:
    broker, adapter = setup(make_declaration())
    with pytest.raises(errors.UnsupportedCapability) as caught:
        await broker.call(invoke("fake", effort="low"), time_budget=5)
    [gap] = caught.value.decision.gaps
    assert (gap.requirement.capability, gap.state, gap.allowed_unknown) == (Capability.EFFORT, UNKNOWN, False)
    assert adapter.call_count == 0


async def test_unknown_allowed_by_the_caller_is_accepted_recorded_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker, adapter = setup(make_declaration(supported=[Capability.MODEL_OVERRIDE]))
    request = invoke(
        "fake", model="m", effort="low", allow_unknown=frozenset({Capability.EFFORT, Capability.HOOKS})
    )
    with caplog.at_level(logging.INFO, logger="agentsidecar.negotiator_service.broker"):
        reply, decision = await broker.call(request, time_budget=5)
    assert reply.text == "say hi"
    assert adapter.call_count == 1
    assert decision.accepted
    [allowed] = decision.allowed_unknowns
    assert (allowed.requirement.capability, allowed.state) == (Capability.EFFORT, UNKNOWN)

    [record] = [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == "agentsidecar.negotiator_service.broker"
    ]
    assert record["outcome"] == "accepted"
    assert record["adapter"] == "fake"
    assert record["declaration_version"] == decision.declaration_version
    assert record["allowed_unknown"] == ["effort"]
    assert record["allow_unknown_requested"] == ["effort", "hooks"]
    assert record["verdicts"] == [
        {"requirement": "model_override", "state": "supported", "allowed_unknown": False},
        {"requirement": "effort", "state": "unknown", "allowed_unknown": True},
        {"requirement": "effort_levels:low", "state": "supported", "allowed_unknown": False},
    ]
    assert [r["request_field"] for r in record["requirements"]] == [
        "options.model",
        "options.effort",
        "options.effort",
    ]


async def test_refusals_are_logged_too(caplog: pytest.LogCaptureFixture) -> None:
    broker, _adapter = setup(make_declaration(unsupported=[Capability.PERSONA]))
    with (
        caplog.at_level(logging.INFO, logger="agentsidecar.negotiator_service.broker"),
        pytest.raises(errors.UnsupportedCapability),
    ):
        await broker.call(invoke("fake", persona="p"), time_budget=5)
    [record] = [json.loads(r.getMessage()) for r in caplog.records]
    assert record["outcome"] == "refused"
    assert record["gaps"] == ["persona"]
    assert record["allowed_unknown"] == []


async def test_unsupported_is_never_overridable_by_allow_unknown() -> None:
    broker, adapter = setup(make_declaration(unsupported=[Capability.PERSONA]))
    request = invoke("fake", persona="p", allow_unknown=frozenset(Capability))
    with pytest.raises(errors.UnsupportedCapability):
        await broker.call(request, time_budget=5)
    assert adapter.call_count == 0


async def test_an_unsupported_set_member_is_never_overridable() -> None:
    declaration = make_declaration(supported=[Capability.SETTINGS], accepted_settings=["temperature"])
    broker, adapter = setup(declaration)
    request = invoke("fake", settings={"seed": 1}, allow_unknown=frozenset(Capability))
    with pytest.raises(errors.UnsupportedCapability) as caught:
        await broker.call(request, time_budget=5)
    assert [g.requirement.describe() for g in caught.value.decision.gaps] == ["accepted_settings:seed"]
    assert adapter.call_count == 0


@pytest.mark.parametrize(
    ("request_", "kind", "selected_by"),
    [
        (CallRequest(CallKind.INVOKE, "p", adapter="harness"), "agent-harness", "adapter"),
        (CallRequest(CallKind.INVOKE, "p", agent="framework"), "agent-framework", "agent"),
    ],
)
async def test_kind_mismatch_both_ways_runs_nothing(
    request_: CallRequest, kind: str, selected_by: str
) -> None:
    registry = AdapterRegistry()
    harness = FakeAdapter(make_declaration("harness", AdapterKind.HARNESS, supported=list(Capability)))
    framework = FakeAdapter(make_declaration("framework", AdapterKind.FRAMEWORK, supported=list(Capability)))
    registry.add(RegisteredAdapter(harness, "config"))
    registry.add(RegisteredAdapter(framework, "runtime"))
    broker = Broker(registry)
    with pytest.raises(errors.AdapterKindMismatch) as caught:
        await broker.call(request_, time_budget=5)
    assert (caught.value.kind, caught.value.selected_by) == (kind, selected_by)
    with pytest.raises(errors.AdapterKindMismatch):
        broker.negotiate(request_)
    assert harness.call_count == framework.call_count == 0


async def test_agent_selects_a_harness() -> None:
    broker, adapter = setup(make_declaration("h", AdapterKind.HARNESS))
    reply, _ = await broker.call(CallRequest(CallKind.INVOKE, "hello", agent="h"), time_budget=5)
    assert reply.text == "hello"
    assert adapter.call_count == 1


async def test_unknown_adapter_is_not_found() -> None:
    broker, adapter = setup()
    with pytest.raises(errors.AdapterNotFound):
        await broker.call(invoke("ghost"), time_budget=5)
    assert adapter.call_count == 0


async def test_invalid_requests_run_nothing() -> None:
    broker, adapter = setup()
    with pytest.raises(errors.InvalidRequest) as caught:
        await broker.call(CallRequest(CallKind.PRODUCE, "", adapter="all"), time_budget=5)
    assert [f for f, _ in caught.value.violations] == ["prompt", "output_schema"]
    assert adapter.call_count == 0


async def test_negotiate_runs_no_adapter_code_even_when_accepted() -> None:
    broker, adapter = setup()
    decision = broker.negotiate(produce(model="m"))
    assert decision.accepted
    assert [v.requirement.capability for v in decision.verdicts] == [
        Capability.STRUCTURED_OUTPUT,
        Capability.STRUCTURED_OUTPUT,
        Capability.MODEL_OVERRIDE,
    ]
    assert adapter.call_count == 0


async def test_the_adapter_receives_the_parsed_call() -> None:
    broker, adapter = setup(default='{"name": "n"}')
    request = produce(model="m", settings={"seed": 3})
    reply, decision = await broker.call(request, time_budget=2.5, delegation_depth=2)
    assert reply.text == '{"name": "n"}'
    assert decision.accepted
    [(kind, call)] = adapter.calls
    assert kind == "produce"
    assert call == AdapterCall(
        prompt="give me json",
        options=request.options,
        output_schema=frozen_json(SCHEMA),  # read-only: objects as MappingProxyType, arrays as tuples
        time_budget=2.5,
        delegation_depth=2,
    )


async def test_invoke_goes_to_invoke_without_a_schema() -> None:
    broker, adapter = setup(default="plain text")
    reply, _ = await broker.call(invoke(), time_budget=None)
    assert reply.text == "plain text"
    [(kind, call)] = adapter.calls
    assert (kind, call.output_schema, call.time_budget) == ("invoke", None, None)


async def test_events_are_returned_only_when_requested() -> None:
    events = (StreamEvent("message", "thinking"),)
    broker, _adapter = setup(default=AdapterReply("text", events))
    plain, _ = await broker.call(invoke(), time_budget=5)
    streamed, _ = await broker.call(invoke(stream_events=True), time_budget=5)
    assert plain.events == ()
    assert streamed.events == events


# --- output checking --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ('{"name": 7}', [("/name", '7 is not of type "string"')]),
        ('{"email": "a@b.example"}', [("", '"name" is a required property')]),
        ('{"name": "n", "email": "not-an-email"}', [("/email", '"not-an-email" is not a "email"')]),
        (
            '{"name": 1, "tags": ["ok", 2], "extra": true}',
            [
                ("", "Additional properties are not allowed ('extra' was unexpected)"),
                ("/name", '1 is not of type "string"'),
                ("/tags/1", '2 is not of type "string"'),
            ],
        ),
        ("[]", [("", '[] is not of type "object"')]),
    ],
)
async def test_output_schema_violations_list_every_error(
    output: str, expected: list[tuple[str, str]]
) -> None:
    broker, adapter = setup(default=output)
    with pytest.raises(errors.OutputSchemaViolation) as caught:
        await broker.call(produce(), time_budget=5)
    assert list(caught.value.violations) == expected
    assert caught.value.adapter == "all"
    assert adapter.call_count == 1  # checked once; never retried as text


@pytest.mark.parametrize("output", ["not json", "", '{"name": "n"', "```json\n{}\n```"])
async def test_output_that_is_not_json_is_a_violation(output: str) -> None:
    broker, adapter = setup(default=output)
    with pytest.raises(errors.OutputSchemaViolation) as caught:
        await broker.call(produce(), time_budget=5)
    [(pointer, message)] = caught.value.violations
    assert pointer == ""
    assert message.startswith("output is not valid JSON: ")
    assert adapter.call_count == 1


async def test_valid_output_passes_unchanged() -> None:
    output = '{"name": "n", "email": "n@example.test", "tags": []}'
    broker, _adapter = setup(default=output)
    reply, _ = await broker.call(produce(), time_budget=5)
    assert reply.text == output


# --- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exception", "cause"),
    [
        (RuntimeError("boom"), "RuntimeError: boom"),
        (KeyError("k"), "KeyError: 'k'"),
        (ValueError(), "ValueError: "),
        (ZeroDivisionError("division by zero"), "ZeroDivisionError: division by zero"),
        (TimeoutError("its own clock"), "TimeoutError: its own clock"),
    ],
)
async def test_any_adapter_exception_becomes_adapter_internal(exception: Exception, cause: str) -> None:
    broker, _adapter = setup(default=exception)
    with pytest.raises(errors.AdapterInternal) as caught:
        await broker.call(invoke(), time_budget=5)
    assert (caught.value.adapter, caught.value.cause) == ("all", cause)
    assert caught.value.__cause__ is exception


async def test_negotiator_errors_from_the_adapter_pass_through() -> None:
    failure = errors.AdapterUnavailable("all", "connection refused")
    broker, _adapter = setup(default=failure)
    with pytest.raises(errors.AdapterUnavailable) as caught:
        await broker.call(invoke(), time_budget=5)
    assert caught.value is failure


async def test_a_reply_of_the_wrong_type_is_adapter_internal() -> None:
    class Sloppy(FakeAdapter):
        async def invoke(self, call: AdapterCall) -> AdapterReply:
            return "bare text"  # type: ignore[return-value]

    registry = AdapterRegistry()
    registry.add(RegisteredAdapter(Sloppy(EVERYTHING), "runtime"))
    with pytest.raises(errors.AdapterInternal, match="returned str, not an AdapterReply"):
        await Broker(registry).call(invoke(), time_budget=5)


async def test_a_slow_adapter_times_out_and_is_cancelled() -> None:
    broker, adapter = setup(default="late", delay=10)
    with pytest.raises(errors.AdapterTimeout) as caught:
        await broker.call(invoke(), time_budget=0.05)
    assert caught.value.cause == "deadline of 0.05s exceeded"
    assert len(adapter.cancelled) == 1
    assert adapter.completed == []


async def test_an_exhausted_budget_runs_nothing() -> None:
    broker, adapter = setup()
    with pytest.raises(errors.AdapterTimeout):
        await broker.call(invoke(), time_budget=0)
    assert adapter.call_count == 0


async def test_an_adapter_that_ignores_cancellation_still_times_out() -> None:
    async def stubborn(kind: str, call: AdapterCall) -> str:
        with contextlib.suppress(asyncio.CancelledError):  # a badly behaved adapter answers anyway
            await asyncio.sleep(10)
        return "too late"

    broker, _adapter = setup(default=stubborn)
    with pytest.raises(errors.AdapterTimeout):
        await broker.call(invoke(), time_budget=0.05)


async def test_cancellation_propagates_to_the_adapter() -> None:
    broker, adapter = setup(default=Hang())
    task = asyncio.create_task(broker.call(invoke(), time_budget=None))
    await asyncio.wait_for(adapter.started.wait(), timeout=2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [kind for kind, _ in adapter.cancelled] == ["invoke"]
    assert adapter.completed == []


def test_a_custom_logger_receives_the_decisions(caplog: pytest.LogCaptureFixture) -> None:
    registry = AdapterRegistry()
    registry.add(RegisteredAdapter(FakeAdapter(EVERYTHING), "config"))
    broker = Broker(registry, logging.getLogger("audit.test"))
    with caplog.at_level(logging.INFO, logger="audit.test"):
        broker.negotiate(invoke(model="m"))
    [record] = caplog.records
    assert record.name == "audit.test"
    payload = json.loads(record.getMessage())
    assert (payload["operation"], payload["outcome"]) == ("negotiate", "accepted")
