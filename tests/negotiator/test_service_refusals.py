"""Declare-and-refuse over a real socket: every refusal names every gap, and no adapter code runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import grpc
import pytest
from fakes import make_declaration
from negotiator_testkit import EVERYTHING, add_fake, call_error

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.convert import CAPABILITY_TO_PROTO
from agentsidecar.negotiator_service.model import AdapterKind, Capability, Declaration
from agentsidecar.negotiator_service.server import RunningNegotiator
from agentsidecar.negotiator_service.status import DOMAIN

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
Request: TypeAlias = "pb.ProduceRequest | pb.InvokeRequest"

PLAIN_SCHEMA = json.dumps({"type": "object"})


@dataclass(frozen=True)
class Case:
    """One request field that derives a requirement on one capability."""

    id: str
    capability: Capability
    request_field: str
    options: Callable[[], pb.CallOptions]
    produce: bool = False


CASES = [
    Case("output_schema", Capability.STRUCTURED_OUTPUT, "output_schema", pb.CallOptions, produce=True),
    Case("model", Capability.MODEL_OVERRIDE, "options.model", lambda: pb.CallOptions(model="m")),
    Case("effort", Capability.EFFORT, "options.effort", lambda: pb.CallOptions(effort="high")),
    Case("settings", Capability.SETTINGS, "options.settings", lambda: settings_options({"temperature": 0.2})),
    Case("profile", Capability.PROFILE_OVERRIDE, "options.profile", lambda: pb.CallOptions(profile="p")),
    Case(
        "mcp_servers",
        Capability.MCP,
        "options.mcp_servers",
        lambda: pb.CallOptions(mcp_servers=[pb.McpServer(name="fs", transport="stdio", command="srv")]),
    ),
    Case(
        "max_depth.depth",
        Capability.DEPTH_LIMIT,
        "options.max_depth",
        lambda: pb.CallOptions(max_depth=pb.MaxDepth(depth=1)),
    ),
    Case(
        "max_depth.provider_managed(depth_limit)",
        Capability.DEPTH_LIMIT,
        "options.max_depth",
        lambda: pb.CallOptions(max_depth=pb.MaxDepth(provider_managed=True)),
    ),
    Case(
        "max_depth.provider_managed(subagents)",
        Capability.SUBAGENTS,
        "options.max_depth.provider_managed",
        lambda: pb.CallOptions(max_depth=pb.MaxDepth(provider_managed=True)),
    ),
    Case(
        "tool_filter",
        Capability.TOOL_FILTER,
        "options.tool_filter",
        lambda: pb.CallOptions(tool_filter=pb.ToolFilter(deny=["shell"])),
    ),
    Case("persona", Capability.PERSONA, "options.persona", lambda: pb.CallOptions(persona="critic")),
    Case(
        "stream_events",
        Capability.STREAM_EVENTS,
        "options.stream_events",
        lambda: pb.CallOptions(stream_events=True),
    ),
]


def settings_options(values: dict[str, float]) -> pb.CallOptions:
    options = pb.CallOptions()
    options.settings.update(values)
    return options


def declaration_without(capability: Capability, *, unsupported: bool) -> Declaration:
    """EVERYTHING, except `capability` is UNSUPPORTED (or left out, so UNKNOWN)."""
    others = [c for c in Capability if c is not capability]
    return make_declaration(
        "fake",
        supported=others,
        unsupported=[capability] if unsupported else [],
        mcp_transports=EVERYTHING.mcp_transports,
        accepted_settings=EVERYTHING.accepted_settings,
        string_formats=EVERYTHING.string_formats,
    )


def request_for(case: Case, options: pb.CallOptions | None = None) -> Request:
    options = options if options is not None else case.options()
    if case.produce:
        return pb.ProduceRequest(adapter="fake", prompt="p", output_schema=PLAIN_SCHEMA, options=options)
    return pb.InvokeRequest(adapter="fake", prompt="p", options=options)


async def send(stub: Stub, request: Request) -> pb.ProduceResponse | pb.InvokeResponse:
    if isinstance(request, pb.ProduceRequest):
        return await stub.Produce(request, timeout=5)
    return await stub.Invoke(request, timeout=5)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("state", ["unsupported", "unknown"])
async def test_each_capability_is_refused_before_dispatch(
    stub: Stub, negotiator: RunningNegotiator, case: Case, state: str
) -> None:
    declaration = declaration_without(case.capability, unsupported=state == "unsupported")
    fake = add_fake(negotiator, declaration)
    error = await call_error(send(stub, request_for(case)))

    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert (error.reason, error.domain) == ("UNSUPPORTED_CAPABILITY", DOMAIN)
    assert dict(error.metadata) == {
        "adapter": "fake",
        "declarationVersion": declaration.version,
        "gaps": case.capability.value,
    }
    [violation] = error.precondition_violations
    assert violation.type == ("UNSUPPORTED_CAPABILITY" if state == "unsupported" else "UNKNOWN_CAPABILITY")
    assert violation.subject == case.capability.value
    assert violation.description.startswith(f"{case.request_field} needs {case.capability.value}")
    assert violation.description.endswith(f"says {state}")
    assert fake.calls == []


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_unknown_allowed_by_the_caller_runs_the_call(
    stub: Stub, negotiator: RunningNegotiator, case: Case
) -> None:
    fake = add_fake(negotiator, declaration_without(case.capability, unsupported=False))
    options = case.options()
    options.allow_unknown.append(CAPABILITY_TO_PROTO[case.capability])
    response = await send(stub, request_for(case, options))

    assert response.decision.accepted
    allowed = [v for v in response.decision.verdicts if v.allowed_unknown]
    assert [(v.requirement.capability, v.state) for v in allowed] == [
        (CAPABILITY_TO_PROTO[case.capability], common_pb2.CAPABILITY_STATE_UNKNOWN)
    ]
    assert allowed[0].requirement.request_field == case.request_field
    assert len(fake.calls) == 1
    assert case.capability in fake.calls[0][1].options.allow_unknown


async def test_allow_unknown_never_overrides_unsupported(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator, declaration_without(Capability.PERSONA, unsupported=True))
    options = pb.CallOptions(persona="critic", allow_unknown=[common_pb2.CAPABILITY_PERSONA])
    error = await call_error(stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p", options=options)))
    assert error.reason == "UNSUPPORTED_CAPABILITY"
    assert [v.type for v in error.precondition_violations] == ["UNSUPPORTED_CAPABILITY"]
    assert "allowedUnknown" not in error.metadata
    assert fake.calls == []


@dataclass(frozen=True)
class SetCase:
    id: str
    declaration: Declaration
    request: Request
    subject: str
    request_field: str


SET_CASES = [
    SetCase(
        "mcp transport",
        make_declaration("fake", supported=list(Capability), mcp_transports=["stdio"]),
        pb.InvokeRequest(
            adapter="fake",
            prompt="p",
            options=pb.CallOptions(mcp_servers=[pb.McpServer(name="docs", transport="sse", url="http://x")]),
        ),
        "mcp_transports:sse",
        "options.mcp_servers[0].transport",
    ),
    SetCase(
        "streamable-http is http",
        make_declaration("fake", supported=list(Capability), mcp_transports=["stdio", "sse"]),
        pb.InvokeRequest(
            adapter="fake",
            prompt="p",
            options=pb.CallOptions(
                mcp_servers=[pb.McpServer(name="docs", transport="streamable-http", url="http://x")]
            ),
        ),
        "mcp_transports:http",
        "options.mcp_servers[0].transport",
    ),
    SetCase(
        "setting key",
        make_declaration("fake", supported=list(Capability), accepted_settings=["temperature"]),
        pb.InvokeRequest(
            adapter="fake", prompt="p", options=settings_options({"temperature": 1, "top_p": 0.9})
        ),
        "accepted_settings:top_p",
        "options.settings.top_p",
    ),
    SetCase(
        "schema string format",
        make_declaration("fake", supported=list(Capability), string_formats=["email"]),
        pb.ProduceRequest(
            adapter="fake",
            prompt="p",
            output_schema=json.dumps(
                {
                    "type": "object",
                    "properties": {
                        "who": {"type": "string", "format": "email"},
                        "id": {"type": "string", "format": "uuid"},
                    },
                }
            ),
        ),
        "string_formats:uuid",
        "output_schema/properties/id/format",
    ),
]


@pytest.mark.parametrize("case", SET_CASES, ids=lambda c: c.id)
async def test_typed_set_members_outside_the_declaration_are_refused(
    stub: Stub, negotiator: RunningNegotiator, case: SetCase
) -> None:
    fake = add_fake(negotiator, case.declaration)
    error = await call_error(send(stub, case.request))
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "UNSUPPORTED_CAPABILITY"
    assert error.metadata["gaps"] == case.subject
    [violation] = error.precondition_violations
    assert (violation.type, violation.subject) == ("UNSUPPORTED_CAPABILITY", case.subject)
    assert violation.description.startswith(f"{case.request_field} needs {case.subject}")
    assert fake.calls == []


async def test_set_members_of_an_undeclared_capability_are_unknown_and_allowable(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator, make_declaration("fake"))
    server = pb.McpServer(name="docs", transport="http", url="http://x")
    refused = pb.InvokeRequest(adapter="fake", prompt="p", options=pb.CallOptions(mcp_servers=[server]))
    error = await call_error(stub.Invoke(refused, timeout=5))
    assert [(v.type, v.subject) for v in error.precondition_violations] == [
        ("UNKNOWN_CAPABILITY", "mcp"),
        ("UNKNOWN_CAPABILITY", "mcp_transports:http"),
    ]
    assert fake.calls == []

    refused.options.allow_unknown.append(common_pb2.CAPABILITY_MCP)
    response = await stub.Invoke(refused, timeout=5)
    assert [v.allowed_unknown for v in response.decision.verdicts] == [True, True]
    assert len(fake.calls) == 1


@pytest.mark.parametrize(
    ("kind", "selector", "selected_by"),
    [(AdapterKind.HARNESS, "adapter", "adapter"), (AdapterKind.FRAMEWORK, "agent", "agent")],
)
async def test_kind_mismatch_is_refused_both_ways(
    stub: Stub, negotiator: RunningNegotiator, kind: AdapterKind, selector: str, selected_by: str
) -> None:
    fake = add_fake(negotiator, make_declaration("fake", kind, supported=list(Capability)))
    request = (
        pb.InvokeRequest(adapter="fake", prompt="p")
        if selector == "adapter"
        else pb.InvokeRequest(agent="fake", prompt="p")
    )
    error = await call_error(stub.Invoke(request, timeout=5))
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "ADAPTER_KIND_MISMATCH"
    assert error.metadata == {"adapter": "fake", "kind": kind.value, "selectedBy": selected_by}
    assert [v.type for v in error.precondition_violations] == ["ADAPTER_KIND_MISMATCH"]
    dry = await call_error(stub.Negotiate(pb.NegotiateRequest(invoke=request), timeout=5))
    assert dry.reason == "ADAPTER_KIND_MISMATCH"
    assert fake.calls == []


async def test_every_gap_is_listed_in_one_refusal(stub: Stub, negotiator: RunningNegotiator) -> None:
    declaration = make_declaration(
        "fake",
        supported=[c for c in Capability if c not in (Capability.MODEL_OVERRIDE, Capability.PERSONA)],
        unsupported=[Capability.MODEL_OVERRIDE],
        mcp_transports=["stdio"],
        accepted_settings=["temperature"],
    )
    fake = add_fake(negotiator, declaration)
    options = settings_options({"seed": 1, "temperature": 0})
    options.model = "m"
    options.persona = "critic"
    options.effort = "low"
    options.mcp_servers.append(pb.McpServer(name="docs", transport="sse", url="http://x"))
    request = pb.InvokeRequest(adapter="fake", prompt="p", options=options)
    error = await call_error(stub.Invoke(request, timeout=5))

    expected = [
        ("UNSUPPORTED_CAPABILITY", "model_override"),
        ("UNSUPPORTED_CAPABILITY", "accepted_settings:seed"),
        ("UNSUPPORTED_CAPABILITY", "mcp_transports:sse"),
        ("UNKNOWN_CAPABILITY", "persona"),
    ]
    assert [(v.type, v.subject) for v in error.precondition_violations] == expected
    assert error.metadata["gaps"] == ",".join(subject for _, subject in expected)
    for subject in ("model_override", "accepted_settings:seed", "mcp_transports:sse", "persona"):
        assert subject in error.message
    assert fake.calls == []

    # The dry run agrees, gap for gap.
    dry = await stub.Negotiate(pb.NegotiateRequest(invoke=request), timeout=5)
    assert not dry.decision.accepted
    dry_subjects = [
        (
            f"{common_pb2.TypedSet.Name(g.requirement.set).removeprefix('TYPED_SET_').lower()}:{g.requirement.member}"
        )
        if g.requirement.member
        else common_pb2.Capability.Name(g.requirement.capability).removeprefix("CAPABILITY_").lower()
        for g in dry.decision.gaps
    ]
    assert dry_subjects == [subject for _, subject in expected]
    assert fake.calls == []


async def test_refusal_metadata_lists_what_the_caller_allowed(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator, make_declaration("fake", unsupported=[Capability.PERSONA]))
    options = pb.CallOptions(persona="critic", effort="low", allow_unknown=[common_pb2.CAPABILITY_EFFORT])
    error = await call_error(stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p", options=options)))
    assert error.metadata["gaps"] == "persona"
    assert error.metadata["allowedUnknown"] == "effort"
    assert fake.calls == []


async def test_scripted_harness_refuses_structured_output(stub: Stub) -> None:
    request = pb.ProduceRequest(agent="scripted-harness", prompt="p", output_schema=PLAIN_SCHEMA)
    error = await call_error(stub.Produce(request, timeout=5))
    assert error.reason == "UNSUPPORTED_CAPABILITY"
    assert error.metadata["adapter"] == "scripted-harness"
    assert [v.subject for v in error.precondition_violations] == ["structured_output"]
