"""ToolSession over a real socket: caller tools, approvals, filters, isolation, protocol errors."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any, TypeAlias

import grpc
import pytest
from fakes import ReplyFn, make_declaration
from negotiator_testkit import TEST_CONFIG, add_fake

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.errors import ConfigError
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterKind,
    AdapterReply,
    AdapterSpec,
    Capability,
    DeclarationOverride,
    ToolOutcome,
)
from agentsidecar.negotiator_service.server import RunningNegotiator
from agentsidecar.sidecar_runtime.richstatus import DecodedError, decode_error

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # grpc-stubs do not know it

KEY_SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"key": {"type": "string"}},
        "required": ["key"],
        "additionalProperties": False,
    }
)
PATH_SCHEMA = json.dumps(
    {"type": "object", "properties": {"path": {"type": "string", "pattern": "^/"}}, "required": ["path"]}
)
VALUE_SCHEMA = json.dumps(
    {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]}
)

TOOLS_CONFIG = (
    TEST_CONFIG
    + """\
  - shortname: tooled
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {tool_registration: supported, tool_filter: supported, persona: supported}
    options:
      tool_calls:
        - {name: lookup, arguments: {key: k1}}
        - {name: hidden, arguments: {key: k2}}
      reply_with_tool_results: true
"""
)


@pytest.fixture
def config_file(tmp_path: Any) -> Any:
    path = tmp_path / "negotiator.yaml"
    path.write_text(TOOLS_CONFIG)
    return path


def tool(
    name: str,
    risk: pb.ToolRisk.ValueType = pb.TOOL_RISK_READ_ONLY,
    arguments_schema: str = KEY_SCHEMA,
    return_schema: str = "",
    description: str = "",
    metadata: dict[str, str] | None = None,
) -> pb.ToolSpec:
    return pb.ToolSpec(
        name=name,
        risk=risk,
        arguments_schema=arguments_schema,
        return_schema=return_schema,
        description=description,
        metadata=metadata or {},
    )


def invoke(adapter: str = "fake", prompt: str = "use the tools", **options: Any) -> pb.InvokeRequest:
    return pb.InvokeRequest(adapter=adapter, prompt=prompt, options=pb.CallOptions(**options))


class Caller:
    """The caller's end of one ToolSession."""

    def __init__(self, stub: Stub, timeout: float = 10.0) -> None:
        # A bidi call opened without an iterator is written to with write(); the stubs miss that form.
        self.call: Any = stub.ToolSession(timeout=timeout)  # type: ignore[call-arg]

    async def start(
        self, call: pb.InvokeRequest | pb.ProduceRequest, tools: Sequence[pb.ToolSpec] = ()
    ) -> None:
        start = pb.ToolSessionStart(tools=list(tools))
        if isinstance(call, pb.ProduceRequest):
            start.produce.CopyFrom(call)
        else:
            start.invoke.CopyFrom(call)
        await self.send(pb.ToolSessionRequest(start=start))

    async def send(self, message: pb.ToolSessionRequest) -> None:
        await self.call.write(message)

    async def receive(self, expected: str) -> Any:
        """The next message, which must be of kind `expected` (a oneof name); its payload."""
        message = await self.call.read()
        assert message is not EOF, "the stream ended"
        assert message.WhichOneof("message") == expected, message
        return getattr(message, expected)

    async def result(self, call_id: str, value: Any) -> None:
        await self.send(
            pb.ToolSessionRequest(tool_result=pb.ToolResult(call_id=call_id, result_json=json.dumps(value)))
        )

    async def decide(
        self,
        call_id: str,
        decision: pb.ApprovalDecision.ValueType,
        edited: str = "",
        reason: str = "",
    ) -> None:
        approval = pb.ToolApproval(
            call_id=call_id, decision=decision, edited_arguments_json=edited, reason=reason
        )
        await self.send(pb.ToolSessionRequest(approval=approval))

    async def final_text(self) -> str:
        """The invoke result's text; the stream must then end OK."""
        result = await self.receive("invoke_result")
        assert await self.call.read() is EOF
        assert await self.call.code() is grpc.StatusCode.OK
        return str(result.text)

    async def error(self) -> DecodedError:
        """The status the stream ends with, which must be an error."""
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await self._read_to_the_end()
        return decode_error(caught.value)

    async def _read_to_the_end(self) -> None:
        while await self.call.read() is not EOF:
            pass


def outcome_json(outcome: ToolOutcome) -> dict[str, Any]:
    return {"result": outcome.result, "error": outcome.error, "denied": outcome.denied}


def calls_tools(*calls: tuple[str, Any]) -> ReplyFn:
    """A "model" that calls the tools in order and answers with the JSON of the outcomes."""

    async def model(kind: str, call: AdapterCall) -> str:
        assert call.tools is not None
        return json.dumps([outcome_json(await call.tools.call(name, args)) for name, args in calls])

    return model


async def wait_for(condition: Any, seconds: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        assert loop.time() < deadline, "condition never held"
        await asyncio.sleep(0.01)


# --- round trips -----------------------------------------------------------------


async def test_a_read_only_tool_round_trip_through_the_scripted_adapter(stub: Stub) -> None:
    caller = Caller(stub)
    await caller.start(
        invoke("tooled", persona="critic", tool_filter=pb.ToolFilter(deny=["hidden"])),
        [tool("lookup", return_schema=VALUE_SCHEMA), tool("hidden")],
    )
    tool_call = await caller.receive("tool_call")
    assert (tool_call.name, json.loads(tool_call.arguments_json)) == ("lookup", {"key": "k1"})
    assert tool_call.risk == pb.TOOL_RISK_READ_ONLY
    assert tool_call.call_id
    await caller.result(tool_call.call_id, {"value": 7})
    # The scripted model then calls the filtered-out tool: it never reaches the caller.
    result = await caller.receive("invoke_result")
    assert json.loads(result.text) == {
        "tool_results": [
            {"name": "lookup", "result": {"value": 7}},
            {"name": "hidden", "error": 'there is no tool named "hidden" in this call'},
        ],
        "persona": "critic",
    }
    verdicts = {v.requirement.request_field: v.requirement.capability for v in result.decision.verdicts}
    assert verdicts == {
        "options.tool_filter": common_pb2.CAPABILITY_TOOL_FILTER,
        "options.persona": common_pb2.CAPABILITY_PERSONA,
        "tools": common_pb2.CAPABILITY_TOOL_REGISTRATION,
    }
    assert result.decision.accepted
    assert await caller.call.read() is EOF
    assert await caller.call.code() is grpc.StatusCode.OK


async def test_the_adapter_gets_the_call_tools_and_a_result_per_call(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    seen: list[AdapterCall] = []

    async def model(kind: str, call: AdapterCall) -> str:
        seen.append(call)
        return await calls_tools(("lookup", {"key": "a"}))(kind, call)  # type: ignore[misc, no-any-return]

    add_fake(negotiator, default=model)
    caller = Caller(stub)
    await caller.start(invoke(), [tool("lookup", description="Finds a value", metadata={"team": "ops"})])
    tool_call = await caller.receive("tool_call")
    await caller.result(tool_call.call_id, "found")
    assert json.loads(await caller.final_text()) == [{"result": "found", "error": None, "denied": False}]
    [call] = seen
    assert call.tools is not None
    [spec] = call.tools.specs
    assert (spec.name, spec.description, dict(spec.metadata)) == ("lookup", "Finds a value", {"team": "ops"})
    assert spec.arguments_schema == json.loads(KEY_SCHEMA)


async def test_a_session_without_tools_is_a_plain_call(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator, make_declaration("plain"))  # declares nothing at all
    caller = Caller(stub)
    await caller.start(invoke("plain", prompt="just text"))
    assert await caller.final_text() == "just text"
    [(_, call)] = fake.calls
    assert call.tools is None


async def test_produce_output_is_validated_against_the_schema(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    async def model(kind: str, call: AdapterCall) -> str:
        assert call.tools is not None
        outcome = await call.tools.call("lookup", {"key": "n"})
        return json.dumps({"n": outcome.result})

    add_fake(negotiator, default=model)
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    produce = pb.ProduceRequest(adapter="fake", prompt="count", output_schema=schema)

    caller = Caller(stub)
    await caller.start(produce, [tool("lookup")])
    await caller.result((await caller.receive("tool_call")).call_id, 3)
    result = await caller.receive("produce_result")
    assert json.loads(result.output_json) == {"n": 3}
    assert await caller.call.read() is EOF

    caller = Caller(stub)
    await caller.start(produce, [tool("lookup")])
    await caller.result((await caller.receive("tool_call")).call_id, "three")
    error = await caller.error()
    assert (error.code, error.reason) == (grpc.StatusCode.INTERNAL, "OUTPUT_SCHEMA_VIOLATION")
    assert error.precondition_violations[0].subject == "/n"


async def test_concurrent_tool_calls_of_one_session_get_their_own_results(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    async def model(kind: str, call: AdapterCall) -> str:
        assert call.tools is not None
        outcomes = await asyncio.gather(*(call.tools.call("lookup", {"key": k}) for k in ("a", "b")))
        return json.dumps([o.result for o in outcomes])

    add_fake(negotiator, default=model)
    caller = Caller(stub)
    await caller.start(invoke(), [tool("lookup")])
    calls = [await caller.receive("tool_call") for _ in range(2)]
    assert len({c.call_id for c in calls}) == 2
    for tool_call in reversed(calls):  # answered out of order
        await caller.result(tool_call.call_id, "got " + json.loads(tool_call.arguments_json)["key"])
    assert json.loads(await caller.final_text()) == ["got a", "got b"]


# --- validation of arguments and results -----------------------------------------


async def test_arguments_that_break_the_schema_never_reach_the_caller(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    add_fake(negotiator, default=calls_tools(("lookup", {"key": 5}), ("lookup", {"key": "ok"})))
    caller = Caller(stub)
    await caller.start(invoke(), [tool("lookup")])
    tool_call = await caller.receive("tool_call")  # the first call was never sent
    assert json.loads(tool_call.arguments_json) == {"key": "ok"}
    await caller.result(tool_call.call_id, 1)
    first, second = json.loads(await caller.final_text())
    assert first["result"] is None
    assert first["error"].startswith('the arguments do not match the schema of "lookup": /key: ')
    assert second == {"result": 1, "error": None, "denied": False}


async def test_a_result_that_breaks_the_return_schema_is_an_error_outcome(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    add_fake(negotiator, default=calls_tools(("lookup", {"key": "k"})))
    caller = Caller(stub)
    await caller.start(invoke(), [tool("lookup", return_schema=VALUE_SCHEMA)])
    await caller.result((await caller.receive("tool_call")).call_id, {"value": "seven"})
    [outcome] = json.loads(await caller.final_text())
    assert outcome["result"] is None
    assert outcome["error"] == (
        'the result of "lookup" violates its return schema: /value: "seven" is not of type "integer"'
    )


async def test_a_tool_error_from_the_caller_reaches_the_model(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    add_fake(negotiator, default=calls_tools(("lookup", {"key": "k"})))
    caller = Caller(stub)
    await caller.start(invoke(), [tool("lookup")])
    call_id = (await caller.receive("tool_call")).call_id
    await caller.send(pb.ToolSessionRequest(tool_result=pb.ToolResult(call_id=call_id, error="disk on fire")))
    assert json.loads(await caller.final_text()) == [
        {"result": None, "error": "disk on fire", "denied": False}
    ]


# --- approvals --------------------------------------------------------------------


async def test_approvals_allow_deny_and_edit(stub: Stub, negotiator: RunningNegotiator) -> None:
    add_fake(
        negotiator,
        default=calls_tools(
            ("write", {"path": "/etc/one"}),
            ("write", {"path": "/etc/two"}),
            ("write", {"path": "/etc/three"}),
        ),
    )
    caller = Caller(stub)
    write = tool(
        "write",
        risk=pb.TOOL_RISK_MUTATING,
        arguments_schema=PATH_SCHEMA,
        description="Writes a file",
        metadata={"scope": "fs"},
    )
    await caller.start(invoke(), [write])

    request = await caller.receive("approval_request")
    assert (request.tool_name, json.loads(request.arguments_json)) == ("write", {"path": "/etc/one"})
    assert (request.risk, request.adapter, request.description) == (
        pb.TOOL_RISK_MUTATING,
        "fake",
        "Writes a file",
    )
    assert dict(request.metadata) == {"scope": "fs"}
    await caller.decide(request.call_id, pb.APPROVAL_DECISION_ALLOW)
    tool_call = await caller.receive("tool_call")
    assert tool_call.call_id == request.call_id
    assert json.loads(tool_call.arguments_json) == {"path": "/etc/one"}
    await caller.result(tool_call.call_id, "wrote one")

    request = await caller.receive("approval_request")
    await caller.decide(request.call_id, pb.APPROVAL_DECISION_DENY, reason="not /etc/two")

    # Denied: the next thing the caller sees is the third approval, not a tool call.
    request = await caller.receive("approval_request")
    assert json.loads(request.arguments_json) == {"path": "/etc/three"}
    await caller.decide(request.call_id, pb.APPROVAL_DECISION_EDIT, edited=json.dumps({"path": "/tmp/three"}))
    tool_call = await caller.receive("tool_call")
    assert json.loads(tool_call.arguments_json) == {"path": "/tmp/three"}
    await caller.result(tool_call.call_id, "wrote three elsewhere")

    assert json.loads(await caller.final_text()) == [
        {"result": "wrote one", "error": None, "denied": False},
        {"result": None, "error": "not /etc/two", "denied": True},
        {"result": "wrote three elsewhere", "error": None, "denied": False},
    ]


@pytest.mark.slow
async def test_an_edit_that_breaks_the_schema_does_not_run_and_a_retry_is_asked_again(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    add_fake(negotiator, default=calls_tools(("write", {"path": "/a"}), ("write", {"path": "/b"})))
    caller = Caller(stub)
    await caller.start(invoke(), [tool("write", risk=pb.TOOL_RISK_MUTATING, arguments_schema=PATH_SCHEMA)])
    request = await caller.receive("approval_request")
    await caller.decide(request.call_id, pb.APPROVAL_DECISION_EDIT, edited=json.dumps({"path": "relative"}))
    # No tool call for the bad edit: the model's next call is asked afresh.
    request = await caller.receive("approval_request")
    assert json.loads(request.arguments_json) == {"path": "/b"}
    await caller.decide(request.call_id, pb.APPROVAL_DECISION_DENY)
    first, second = json.loads(await caller.final_text())
    assert first["denied"] is False
    assert first["error"].startswith('the caller edited the arguments of "write" into ones that do not match')
    assert '"relative" does not match "^/"' in first["error"]
    assert first["error"].endswith("the tool did not run")
    assert second == {"result": None, "error": 'the caller denied the call of "write"', "denied": True}


@pytest.mark.parametrize(
    ("risk", "expected"),
    [
        (pb.TOOL_RISK_SENSITIVE, pb.TOOL_RISK_SENSITIVE),
        (pb.TOOL_RISK_UNSPECIFIED, pb.TOOL_RISK_MUTATING),  # unspecified is the safe default
    ],
)
async def test_sensitive_and_unspecified_risks_need_approval(
    stub: Stub, negotiator: RunningNegotiator, risk: pb.ToolRisk.ValueType, expected: pb.ToolRisk.ValueType
) -> None:
    add_fake(negotiator, default=calls_tools(("pay", {"key": "invoice-1"})))
    caller = Caller(stub)
    await caller.start(invoke(), [tool("pay", risk=risk)])
    request = await caller.receive("approval_request")
    assert request.risk == expected
    await caller.decide(request.call_id, pb.APPROVAL_DECISION_ALLOW)
    tool_call = await caller.receive("tool_call")
    assert tool_call.risk == expected
    await caller.result(tool_call.call_id, "paid")
    assert json.loads(await caller.final_text())[0]["result"] == "paid"


# --- tool filters -----------------------------------------------------------------


async def test_a_filtered_tool_is_invisible_and_never_runs(stub: Stub, negotiator: RunningNegotiator) -> None:
    seen_specs: list[tuple[str, ...]] = []

    async def model(kind: str, call: AdapterCall) -> str:
        assert call.tools is not None
        seen_specs.append(tuple(spec.name for spec in call.tools.specs))
        hidden = await call.tools.call("delete", {"key": "everything"})
        shown = await call.tools.call("read", {"key": "x"})
        return json.dumps([outcome_json(hidden), outcome_json(shown)])

    add_fake(negotiator, default=model)
    caller = Caller(stub)
    # allow first (read, delete), then deny (delete).
    await caller.start(
        invoke(tool_filter=pb.ToolFilter(allow=["read", "delete"], deny=["delete"])),
        [tool("read"), tool("delete", risk=pb.TOOL_RISK_READ_ONLY), tool("write")],
    )
    tool_call = await caller.receive("tool_call")
    assert tool_call.name == "read"  # "delete" never reached the caller
    await caller.result(tool_call.call_id, "r")
    hidden, shown = json.loads(await caller.final_text())
    assert hidden == {
        "result": None,
        "error": 'there is no tool named "delete" in this call',
        "denied": False,
    }
    assert shown["result"] == "r"
    assert seen_specs == [("read",)]


async def test_a_tool_filter_naming_unknown_tools_fails_loudly(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator)
    caller = Caller(stub)
    await caller.start(invoke(tool_filter=pb.ToolFilter(allow=["read"], deny=["rm", "read"])), [tool("read")])
    error = await caller.error()
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert error.field_violations == (
        ("start.invoke.options.tool_filter.deny[0]", 'names no tool of this call: "rm"'),
    )

    caller = Caller(stub)
    await caller.start(invoke(tool_filter=pb.ToolFilter()), [tool("read")])
    error = await caller.error()
    assert [f for f, _ in error.field_violations] == ["start.invoke.options.tool_filter"]
    assert fake.calls == []


# --- validation of the start ------------------------------------------------------


async def test_invalid_tool_specs_are_all_named(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator)
    caller = Caller(stub)
    await caller.start(
        pb.InvokeRequest(adapter="fake"),  # no prompt either
        [
            tool("has space"),
            tool("dup"),
            tool("dup"),
            tool("not_json", arguments_schema="{nope"),
            tool("bad_schema", arguments_schema='{"type": 12}'),
            tool("no_schema", arguments_schema=""),
            tool("bad_return", return_schema='{"$ref": "#/$defs/missing"}'),
            tool("x" * 65),
        ],
    )
    error = await caller.error()
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert [f for f, _ in error.field_violations] == [
        "start.invoke.prompt",
        "start.tools[0].name",
        "start.tools[2].name",
        "start.tools[3].arguments_schema",
        "start.tools[4].arguments_schema",
        "start.tools[5].arguments_schema",
        "start.tools[6].return_schema",
        "start.tools[7].name",
    ]
    descriptions = dict(error.field_violations)
    assert 'duplicate tool name "dup" (also start.tools[1])' in descriptions["start.tools[2].name"]
    assert "is not valid JSON" in descriptions["start.tools[3].arguments_schema"]
    assert "draft 2020-12" in descriptions["start.tools[4].arguments_schema"]
    assert "does not resolve" in descriptions["start.tools[6].return_schema"]
    assert fake.calls == []


BAD_PATTERN_SCHEMA = '{"type": "object", "properties": {"key": {"type": "string", "pattern": "["}}}'


@pytest.mark.parametrize("field", ["arguments_schema", "return_schema"])
async def test_a_tool_schema_the_validator_cannot_apply_is_refused_before_dispatch(
    stub: Stub, negotiator: RunningNegotiator, field: str
) -> None:
    # Valid draft 2020-12 to the metaschema, but its pattern is no regular expression: found
    # out when the tools are offered, not when the model calls the tool.
    fake = add_fake(negotiator, default=calls_tools(("lookup", {"key": "k"})))
    caller = Caller(stub)
    spec = (
        tool("lookup", arguments_schema=BAD_PATTERN_SCHEMA)
        if field == "arguments_schema"
        else tool("lookup", return_schema=BAD_PATTERN_SCHEMA)
    )
    await caller.start(invoke(), [spec])
    error = await caller.error()
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    [(where, description)] = error.field_violations
    assert where == f"start.tools[0].{field}"
    assert "pattern" in description or "/properties/key" in description, description
    assert fake.calls == []


async def test_arguments_are_checked_as_produce_output_is(stub: Stub, negotiator: RunningNegotiator) -> None:
    # One validator for tool arguments and Produce output: its pattern's \d (ECMA-262) is ASCII digits only.
    digits = '{"type": "object", "properties": {"key": {"type": "string", "pattern": "^\\\\d+$"}}}'
    add_fake(negotiator, default=calls_tools(("lookup", {"key": "\u0663"}), ("lookup", {"key": "7"})))
    caller = Caller(stub)
    await caller.start(invoke(), [tool("lookup", arguments_schema=digits)])
    tool_call = await caller.receive("tool_call")
    assert json.loads(tool_call.arguments_json) == {"key": "7"}
    await caller.result(tool_call.call_id, 1)
    first, second = json.loads(await caller.final_text())
    assert first["error"].startswith('the arguments do not match the schema of "lookup": /key: ')
    assert second["result"] == 1


async def test_an_unknown_risk_value_is_refused(stub: Stub) -> None:
    caller = Caller(stub)
    await caller.start(invoke(), [tool("read", risk=9)])  # type: ignore[arg-type]
    error = await caller.error()
    assert error.field_violations == (("start.tools[0].risk", "is not a tool risk (enum value 9)"),)


@pytest.mark.parametrize(
    ("declaration", "expected_gaps"),
    [
        (make_declaration("fake", supported=[Capability.PERSONA], unsupported=[Capability.TOOL_REGISTRATION]),
         ["UNSUPPORTED_CAPABILITY"]),
        (make_declaration("fake", supported=[Capability.PERSONA]), ["UNKNOWN_CAPABILITY"]),
    ],
)  # fmt: skip
async def test_an_adapter_without_tool_registration_is_refused_before_dispatch(
    stub: Stub, negotiator: RunningNegotiator, declaration: Any, expected_gaps: list[str]
) -> None:
    fake = add_fake(negotiator, declaration)
    caller = Caller(stub)
    await caller.start(invoke(persona="critic"), [tool("read")])
    error = await caller.error()
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UNSUPPORTED_CAPABILITY")
    assert error.metadata["gaps"] == "tool_registration"
    [gap] = error.precondition_violations
    assert [gap.type] == expected_gaps
    assert gap.subject == "tool_registration"
    assert gap.description.startswith("tools needs tool_registration")
    assert fake.calls == []


async def test_filter_and_persona_are_gated_by_their_capabilities(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(
        negotiator,
        make_declaration(
            "fake",
            supported=[Capability.TOOL_REGISTRATION],
            unsupported=[Capability.TOOL_FILTER, Capability.PERSONA],
        ),
    )
    caller = Caller(stub)
    await caller.start(
        invoke(persona="critic", tool_filter=pb.ToolFilter(deny=["b"])), [tool("a"), tool("b")]
    )
    error = await caller.error()
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert error.metadata["gaps"] == "tool_filter,persona"
    assert fake.calls == []


# --- isolation --------------------------------------------------------------------


@pytest.mark.slow
async def test_twenty_concurrent_sessions_with_the_same_tool_names_never_cross(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    rng = random.Random(5)

    async def model(kind: str, call: AdapterCall) -> str:
        assert call.tools is not None
        await asyncio.sleep(rng.uniform(0, 0.02))
        outcome = await call.tools.call("lookup", {"key": call.prompt})
        return json.dumps(outcome_json(outcome))

    fake = add_fake(negotiator, default=model)

    async def session(index: int) -> dict[str, Any]:
        caller = Caller(stub)
        # Each session's own return schema accepts only its own value: a result
        # validated against another session's tool would be an error outcome.
        own_schema = json.dumps({"const": f"value-{index}"})
        await caller.start(invoke(prompt=f"session-{index}"), [tool("lookup", return_schema=own_schema)])
        tool_call = await caller.receive("tool_call")
        assert json.loads(tool_call.arguments_json) == {"key": f"session-{index}"}
        await asyncio.sleep(rng.uniform(0, 0.02))
        await caller.result(tool_call.call_id, f"value-{index}")
        return dict(json.loads(await caller.final_text()))

    outcomes = await asyncio.gather(*(session(i) for i in range(20)))
    assert outcomes == [{"result": f"value-{i}", "error": None, "denied": False} for i in range(20)]
    assert len(fake.completed) == 20


# --- protocol errors, cancellation and deadlines ----------------------------------


def _start(tools: Sequence[pb.ToolSpec] = ()) -> pb.ToolSessionRequest:
    return pb.ToolSessionRequest(start=pb.ToolSessionStart(invoke=invoke(), tools=list(tools)))


async def test_the_first_message_must_be_start(stub: Stub) -> None:
    caller = Caller(stub)
    await caller.send(pb.ToolSessionRequest(tool_result=pb.ToolResult(call_id="call_1", result_json="1")))
    error = await caller.error()
    assert (error.code, error.field_violations) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        (("start", "the first message must be start"),),
    )

    caller = Caller(stub)
    await caller.call.done_writing()
    error = await caller.error()
    assert error.field_violations == (("start", "the stream ended before start was sent"),)

    caller = Caller(stub)
    await caller.send(pb.ToolSessionRequest())
    error = await caller.error()
    assert [f for f, _ in error.field_violations] == ["message"]


# (what the caller sends once the model's first tool call has arrived, the field named)
PROTOCOL_ERRORS = [
    ("second start", lambda call_id: _start(), "start"),
    (
        "unknown call id",
        lambda call_id: pb.ToolSessionRequest(tool_result=pb.ToolResult(call_id="call_99", result_json="1")),
        "tool_result.call_id",
    ),
    (
        "malformed result",
        lambda call_id: pb.ToolSessionRequest(tool_result=pb.ToolResult(call_id=call_id, result_json="{x")),
        "tool_result.result_json",
    ),
    (
        "no outcome",
        lambda call_id: pb.ToolSessionRequest(tool_result=pb.ToolResult(call_id=call_id)),
        "tool_result.outcome",
    ),
    (
        "approval for a tool call",
        lambda call_id: pb.ToolSessionRequest(
            approval=pb.ToolApproval(call_id=call_id, decision=pb.APPROVAL_DECISION_ALLOW)
        ),
        "approval.call_id",
    ),
]


@pytest.mark.parametrize(("case", "build", "field"), PROTOCOL_ERRORS, ids=[c[0] for c in PROTOCOL_ERRORS])
async def test_a_bad_caller_message_ends_the_session_and_cancels_the_work(
    stub: Stub, negotiator: RunningNegotiator, case: str, build: Any, field: str
) -> None:
    fake = add_fake(negotiator, default=calls_tools(("lookup", {"key": "k"})))
    caller = Caller(stub)
    await caller.start(invoke(), [tool("lookup")])
    tool_call = await caller.receive("tool_call")
    await caller.send(build(tool_call.call_id))
    error = await caller.error()
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert [f for f, _ in error.field_violations] == [field]
    await wait_for(lambda: len(fake.cancelled) == 1)
    assert fake.completed == []


APPROVAL_ERRORS = [
    (
        "result while an approval is awaited",
        lambda call_id: pb.ToolSessionRequest(tool_result=pb.ToolResult(call_id=call_id, result_json="1")),
        "tool_result.call_id",
        "waits for an approval, not a tool result",
    ),
    (
        "unspecified decision",
        lambda call_id: pb.ToolSessionRequest(approval=pb.ToolApproval(call_id=call_id)),
        "approval.decision",
        "must be ALLOW, DENY or EDIT",
    ),
    (
        "edit without arguments",
        lambda call_id: pb.ToolSessionRequest(
            approval=pb.ToolApproval(call_id=call_id, decision=pb.APPROVAL_DECISION_EDIT)
        ),
        "approval.edited_arguments_json",
        "is required when decision is EDIT",
    ),
    (
        "edit with malformed JSON",
        lambda call_id: pb.ToolSessionRequest(
            approval=pb.ToolApproval(
                call_id=call_id, decision=pb.APPROVAL_DECISION_EDIT, edited_arguments_json="{path"
            )
        ),
        "approval.edited_arguments_json",
        "is not valid JSON",
    ),
    (
        "edit with NaN, which only Python's json reads",
        lambda call_id: pb.ToolSessionRequest(
            approval=pb.ToolApproval(
                call_id=call_id, decision=pb.APPROVAL_DECISION_EDIT, edited_arguments_json='{"path": NaN}'
            )
        ),
        "approval.edited_arguments_json",
        "is not valid JSON: NaN is not a JSON number",
    ),
    (
        "arguments beside allow",
        lambda call_id: pb.ToolSessionRequest(
            approval=pb.ToolApproval(
                call_id=call_id, decision=pb.APPROVAL_DECISION_ALLOW, edited_arguments_json='{"path": "/x"}'
            )
        ),
        "approval.edited_arguments_json",
        "is only for EDIT",
    ),
]


@pytest.mark.parametrize(
    ("case", "build", "field", "text"), APPROVAL_ERRORS, ids=[c[0] for c in APPROVAL_ERRORS]
)
async def test_a_bad_approval_ends_the_session(
    stub: Stub, negotiator: RunningNegotiator, case: str, build: Any, field: str, text: str
) -> None:
    fake = add_fake(negotiator, default=calls_tools(("write", {"path": "/a"})))
    caller = Caller(stub)
    await caller.start(invoke(), [tool("write", risk=pb.TOOL_RISK_MUTATING, arguments_schema=PATH_SCHEMA)])
    request = await caller.receive("approval_request")
    await caller.send(build(request.call_id))
    error = await caller.error()
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    [(where, description)] = error.field_violations
    assert where == field
    assert text in description
    await wait_for(lambda: len(fake.cancelled) == 1)


async def test_half_closing_before_the_result_cancels_the_work(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator, default=calls_tools(("lookup", {"key": "k"})))
    caller = Caller(stub)
    await caller.start(invoke(), [tool("lookup")])
    await caller.receive("tool_call")
    await caller.call.done_writing()
    error = await caller.error()
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    [(where, description)] = error.field_violations
    assert where == "stream"
    assert "half-closed the stream before the result" in description
    await wait_for(lambda: len(fake.cancelled) == 1)


async def test_a_caller_that_cancels_cancels_the_work(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator, default=calls_tools(("lookup", {"key": "k"})))
    caller = Caller(stub)
    await caller.start(invoke(), [tool("lookup")])
    await caller.receive("tool_call")
    caller.call.cancel()
    await wait_for(lambda: len(fake.cancelled) == 1)
    assert fake.completed == []


@pytest.mark.slow
async def test_the_deadline_covers_the_whole_session(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator, default=calls_tools(("lookup", {"key": "k"})))
    caller = Caller(stub, timeout=0.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await caller.start(invoke(), [tool("lookup")])
    await caller.receive("tool_call")  # and never answered
    error = await caller.error()
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert loop.time() - started < 3
    await wait_for(lambda: len(fake.cancelled) == 1)


async def test_sessions_are_judged_like_produce_and_invoke(stub: Stub) -> None:
    """The same refusal Invoke gives, for the same call, with the same status."""
    request = invoke("scripted-fw", persona="critic")
    direct = await _invoke_error(stub, request)
    caller = Caller(stub)
    await caller.start(request)
    streamed = await caller.error()
    assert (streamed.code, streamed.reason, streamed.metadata) == (
        direct.code,
        direct.reason,
        direct.metadata,
    )
    assert streamed.precondition_violations == direct.precondition_violations


async def _invoke_error(stub: Stub, request: pb.InvokeRequest) -> DecodedError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Invoke(request, timeout=5)
    return decode_error(caught.value)


# --- the scripted adapter's tool options --------------------------------------------


@pytest.mark.parametrize(
    ("tool_calls", "problem"),
    [
        ("lookup", "`tool_calls`: must be a list of {name, arguments}, not a string"),
        ([{"arguments": {}}], "`tool_calls[0].name`: is required"),
        ([{"name": "lookup", "args": {}}], "unknown scripted option `tool_calls[0].args`"),
    ],
)
def test_scripted_tool_calls_are_checked_at_start_up(tool_calls: Any, problem: str) -> None:
    spec = AdapterSpec(
        shortname="s",
        implementation="scripted",
        declaration=DeclarationOverride(kind=AdapterKind.FRAMEWORK),
        options=MappingProxyType({"tool_calls": tool_calls}),
    )
    with pytest.raises(ConfigError) as raised:
        build_adapter(spec)
    assert problem in raised.value.message


# --- conversations ------------------------------------------------------------------


@pytest.fixture(autouse=True)
def private_state_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Conversation state of these tests goes to tmp_path, not the user's state directory."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


async def test_a_tool_session_is_a_conversation_turn_committed_only_on_success(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    async def model(kind: str, call: AdapterCall) -> AdapterReply:
        assert call.tools is not None
        turn = (call.conversation_state or {"turn": 0})["turn"] + 1
        outcome = await call.tools.call("lookup", {"key": call.prompt})
        return AdapterReply(text=f"{turn}:{outcome.result}", conversation_state={"turn": turn})

    declaration = make_declaration(
        "fake", supported=[Capability.TOOL_REGISTRATION, Capability.STATEFUL_HISTORY]
    )
    add_fake(negotiator, declaration, default=model)
    in_conversation = pb.CallOptions(conversation_id="tools-c1")

    async def turn(prompt: str, *, finish: bool) -> str | None:
        caller = Caller(stub)
        await caller.start(
            pb.InvokeRequest(adapter="fake", prompt=prompt, options=in_conversation), [tool("lookup")]
        )
        tool_call = await caller.receive("tool_call")
        if not finish:
            await caller.call.done_writing()  # abandons the turn
            assert (await caller.error()).code is grpc.StatusCode.INVALID_ARGUMENT
            return None
        await caller.result(tool_call.call_id, prompt.upper())
        return await caller.final_text()

    assert await turn("a", finish=True) == "1:A"
    assert await turn("b", finish=False) is None
    assert await turn("c", finish=True) == "2:C"  # the abandoned turn committed nothing
