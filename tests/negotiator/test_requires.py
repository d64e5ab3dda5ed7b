"""Caller-stated requirements (`options.requires`) over a real negotiator: judged like derived ones.

Each entry is a capability name or `<typed set>:<member>`; it gets its own verdict
named `options.requires[i]`, an unmet one refuses the call before dispatch, and
an entry that names nothing is INVALID_ARGUMENT on that field. Negotiate,
Produce, Invoke and ToolSession all take it; so do the Python client, the
`negotiator` CLI (`--require`) and the Node client (clients/node/test).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeAlias

import grpc
import pytest
from fakes import make_declaration
from negotiator_testkit import EVERYTHING, add_fake, call_error
from test_tools import Caller

from agentsidecar.clients import NegotiatorClient, call_options
from agentsidecar.clients.errors import InvalidArgumentError, UnsupportedCapabilityError
from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.cli import main
from agentsidecar.negotiator_service.convert import CAPABILITY_TO_PROTO
from agentsidecar.negotiator_service.model import Capability
from agentsidecar.negotiator_service.server import RunningNegotiator

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"

SCHEMA = json.dumps({"type": "object"})

# Declares codemode unsupported, hooks supported for one event, and nothing else.
NO_CODEMODE = make_declaration(
    "no-codemode",
    supported=[Capability.HOOKS, Capability.STRUCTURED_OUTPUT],
    unsupported=[Capability.CODEMODE],
    hook_events=["pre_tool_use"],
)


def invoke(adapter: str, *requires: str, **options: Any) -> pb.InvokeRequest:
    return pb.InvokeRequest(
        adapter=adapter, prompt="p", options=pb.CallOptions(requires=list(requires), **options)
    )


async def test_a_required_capability_the_declaration_refuses_is_named_by_its_entry(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator, NO_CODEMODE)
    error = await call_error(stub.Invoke(invoke("no-codemode", "codemode")))
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UNSUPPORTED_CAPABILITY")
    [gap] = error.precondition_violations
    assert (gap.type, gap.subject) == ("UNSUPPORTED_CAPABILITY", "codemode")
    assert gap.description.startswith("options.requires[0] needs codemode;")
    assert error.metadata["gaps"] == "codemode"
    assert fake.calls == []


async def test_a_required_hook_event_is_judged_as_a_member_of_hook_events(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator, NO_CODEMODE)
    reply = await stub.Invoke(invoke("no-codemode", "hooks", "hook_events:pre_tool_use"))
    assert reply.text == "p"
    assert [(v.requirement.request_field, v.state) for v in reply.decision.verdicts] == [
        ("options.requires[0]", common_pb2.CAPABILITY_STATE_SUPPORTED),
        ("options.requires[1]", common_pb2.CAPABILITY_STATE_SUPPORTED),
        ("options.requires[1]", common_pb2.CAPABILITY_STATE_SUPPORTED),
    ]
    member = reply.decision.verdicts[2].requirement
    assert (member.set, member.member) == (common_pb2.TYPED_SET_HOOK_EVENTS, "pre_tool_use")
    [(_, call)] = fake.calls
    assert call.options.requires == ("hooks", "hook_events:pre_tool_use")

    error = await call_error(
        stub.Invoke(invoke("no-codemode", "hook_events:pre_tool_use", "hook_events:stop"))
    )
    [gap] = error.precondition_violations
    assert (gap.type, gap.subject) == ("UNSUPPORTED_CAPABILITY", "hook_events:stop")
    assert gap.description.startswith("options.requires[1] needs hook_events:stop;")
    assert len(fake.calls) == 1


async def test_unknown_names_are_invalid_argument_on_their_entry(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator, EVERYTHING)
    error = await call_error(
        stub.Invoke(
            invoke("fake", "codemode", "telepathy", "hook_events:", "codemode", "mcp_transports:pigeon")
        )
    )
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert [path for path, _ in error.field_violations] == [
        "options.requires[1]",
        "options.requires[2]",
        "options.requires[3]",
        "options.requires[4]",
    ]
    described = dict(error.field_violations)
    assert described["options.requires[1]"].startswith(
        '"telepathy" is not a capability or <typed set>:<member>'
    )
    assert "repeats options.requires[0]" in described["options.requires[3]"]
    # Negotiate names the field from the top of its request.
    error = await call_error(stub.Negotiate(pb.NegotiateRequest(invoke=invoke("fake", "telepathy"))))
    assert [path for path, _ in error.field_violations] == ["invoke.options.requires[0]"]
    assert fake.calls == []


@pytest.mark.slow
@pytest.mark.parametrize("capability", list(Capability), ids=lambda c: c.value)
async def test_every_capability_is_requirable(
    stub: Stub, negotiator: RunningNegotiator, capability: Capability
) -> None:
    add_fake(negotiator, EVERYTHING)
    add_fake(negotiator, make_declaration("without", unsupported=[capability]))
    accepted = await stub.Negotiate(pb.NegotiateRequest(invoke=invoke("fake", capability.value)))
    refused = await stub.Negotiate(pb.NegotiateRequest(invoke=invoke("without", capability.value)))
    assert accepted.decision.accepted
    assert not refused.decision.accepted
    for decision in (accepted.decision, refused.decision):
        [verdict] = decision.verdicts
        assert verdict.requirement.capability == CAPABILITY_TO_PROTO[capability]
        assert verdict.requirement.request_field == "options.requires[0]"
    [gap] = refused.decision.gaps
    assert gap.state == common_pb2.CAPABILITY_STATE_UNSUPPORTED


async def test_a_requirement_a_field_also_derives_is_reported_for_both(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    add_fake(negotiator, make_declaration("no-model", unsupported=[Capability.MODEL_OVERRIDE]))
    response = await stub.Negotiate(
        pb.NegotiateRequest(invoke=invoke("no-model", "model_override", model="m"))
    )
    assert [g.requirement.request_field for g in response.decision.gaps] == [
        "options.model",
        "options.requires[0]",
    ]


async def test_produce_and_tool_session_take_it_too(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator, NO_CODEMODE)
    produce = pb.ProduceRequest(
        adapter="no-codemode", prompt="p", output_schema=SCHEMA, options=pb.CallOptions(requires=["codemode"])
    )
    error = await call_error(stub.Produce(produce))
    assert error.precondition_violations[0].description.startswith("options.requires[0] needs codemode;")

    caller = Caller(stub)
    await caller.start(invoke("no-codemode", "history_replay"))
    error = await caller.error()
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UNSUPPORTED_CAPABILITY")
    [gap] = error.precondition_violations
    assert (gap.type, gap.subject) == ("UNKNOWN_CAPABILITY", "history_replay")
    assert gap.description.startswith("options.requires[0] needs history_replay;")

    caller = Caller(stub)
    await caller.start(invoke("no-codemode", "telepathy"))
    error = await caller.error()
    assert [path for path, _ in error.field_violations] == ["start.invoke.options.requires[0]"]
    assert fake.calls == []


async def test_an_allowed_unknown_requirement_passes_like_a_derived_one(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator, NO_CODEMODE)
    allow = [CAPABILITY_TO_PROTO[Capability.NATIVE_ARTIFACTS]]
    reply = await stub.Invoke(invoke("no-codemode", "native_artifacts", allow_unknown=allow))
    [verdict] = reply.decision.verdicts
    assert verdict.allowed_unknown
    assert len(fake.calls) == 1


async def test_the_python_client_passes_requires(negotiator: RunningNegotiator) -> None:
    add_fake(negotiator, NO_CODEMODE)

    def call(*requires: str) -> Any:
        with NegotiatorClient(negotiator.bound[0]) as client:
            return client.invoke(adapter="no-codemode", prompt="p", options=call_options(requires=requires))

    reply = await asyncio.to_thread(call, "hook_events:pre_tool_use")
    assert reply.decision.verdicts[0].requirement.request_field == "options.requires[0]"
    with pytest.raises(UnsupportedCapabilityError) as refused:
        await asyncio.to_thread(call, "codemode")
    assert [gap.request_field for gap in refused.value.gaps] == ["options.requires[0]"]
    with pytest.raises(InvalidArgumentError):
        await asyncio.to_thread(call, "telepathy")


async def test_the_cli_require_flag(
    capsys: pytest.CaptureFixture[str], negotiator: RunningNegotiator
) -> None:
    add_fake(negotiator, NO_CODEMODE)
    server = negotiator.bound[0]

    async def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["--server", server, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = await run("invoke", "--adapter", "no-codemode", "p", "--require", "hooks")
    assert code == 0
    assert [v["request_field"] for v in json.loads(out)["verdicts"]] == ["options.requires[0]"]

    code, _, err = await run(
        "invoke", "--adapter", "no-codemode", "p", "--require", "hooks", "--require", "codemode"
    )
    assert code == 3
    assert json.loads(err.splitlines()[-1])["error"]["gaps"] == [
        {
            "capability": "codemode",
            "set": None,
            "member": None,
            "request_field": "options.requires[1]",
            "state": "unsupported",
        }
    ]
