"""Hostile JSON from callers is INVALID_ARGUMENT before dispatch, never INTERNAL: deep nesting,
huge integers, and schemas whose validation would never end. Over a real negotiator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import pytest
from fakes import make_declaration
from negotiator_testkit import TEST_CONFIG, add_fake, call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.model import MAX_JSON_DEPTH, MAX_JSON_INTEGER_DIGITS, Capability
from agentsidecar.negotiator_service.negotiation import MAX_IN_PLACE_APPLICATIONS
from agentsidecar.negotiator_service.server import RunningNegotiator
from agentsidecar.sidecar_runtime.richstatus import decode_error

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
EOF_MARK: object = grpc.aio.EOF  # type: ignore[attr-defined]
KEY_SCHEMA = json.dumps({"type": "object", "properties": {"key": {"type": "string"}}})
DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INTEGER = "9" * 5_000
CONFIG = (
    TEST_CONFIG
    + """\
  - shortname: tooled
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {tool_registration: supported}
    options:
      tool_calls:
        - {name: lookup, arguments: {key: k1}}
      reply_with_tool_results: true
"""
)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "negotiator.yaml"
    path.write_text(CONFIG)
    return path


async def session_error(stub: Stub, risk: pb.ToolRisk.ValueType, answer: Any) -> Any:
    """A ToolSession on "tooled" with one tool whose first message gets `answer(kind, payload)`; its end."""
    call: Any = stub.ToolSession(timeout=10)  # type: ignore[call-arg]
    start = pb.ToolSessionStart(
        invoke=pb.InvokeRequest(adapter="tooled", prompt="go"),
        tools=[pb.ToolSpec(name="lookup", risk=risk, arguments_schema=KEY_SCHEMA)],
    )
    await call.write(pb.ToolSessionRequest(start=start))
    message = await call.read()
    assert message is not EOF_MARK
    kind = message.WhichOneof("message")
    await call.write(answer(kind, getattr(message, kind)))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await drain(call)
    return decode_error(caught.value)


async def drain(call: Any) -> None:
    while await call.read() is not EOF_MARK:
        pass


async def test_a_tool_result_nested_100000_deep_is_invalid(stub: Stub) -> None:
    def answer(kind: str, tool_call: Any) -> pb.ToolSessionRequest:
        assert kind == "tool_call"
        return pb.ToolSessionRequest(tool_result=pb.ToolResult(call_id=tool_call.call_id, result_json=DEEP))

    error = await session_error(stub, pb.TOOL_RISK_READ_ONLY, answer)
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert error.field_violations == (
        ("tool_result.result_json", f"is nested more than {MAX_JSON_DEPTH} levels deep"),
    )


async def test_edited_arguments_nested_100000_deep_are_invalid(stub: Stub) -> None:
    def answer(kind: str, approval: Any) -> pb.ToolSessionRequest:
        assert kind == "approval_request"
        return pb.ToolSessionRequest(
            approval=pb.ToolApproval(
                call_id=approval.call_id, decision=pb.APPROVAL_DECISION_EDIT, edited_arguments_json=DEEP
            )
        )

    error = await session_error(stub, pb.TOOL_RISK_MUTATING, answer)
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [field for field, _ in error.field_violations] == ["approval.edited_arguments_json"]


def produce(schema: str) -> pb.ProduceRequest:
    return pb.ProduceRequest(adapter="fake", prompt="p", output_schema=schema)


SELF_REF = {"$ref": "#"}
PROPERTY_SELF_REF = {"properties": {"a": {"$ref": "#/properties/a"}}}
REF_LOOP = {
    "$defs": {"x": {"anyOf": [{"$ref": "#/$defs/y"}]}, "y": {"not": {"$ref": "#/$defs/x"}}},
    "$ref": "#/$defs/x",
}
DOUBLING = {f"a{i}": {"allOf": [{"$ref": f"#/$defs/a{i + 1}"}] * 2} for i in range(30)}
EXPONENTIAL = {"$defs": DOUBLING | {"a30": {"type": "string"}}, "$ref": "#/$defs/a0"}
HOSTILE_SCHEMAS = {
    "5000-digit-integer": (
        '{"type": "integer", "maximum": ' + HUGE_INTEGER + "}",
        f"more than {MAX_JSON_INTEGER_DIGITS} digits",
    ),
    "100000-deep": (DEEP, f"nested more than {MAX_JSON_DEPTH} levels"),
    "self-ref": (json.dumps(SELF_REF), "refers back to itself at /"),
    "property-self-ref": (json.dumps(PROPERTY_SELF_REF), "refers back to itself at /properties/a"),
    "ref-loop": (json.dumps(REF_LOOP), "refers back to itself"),
    "exponential": (json.dumps(EXPONENTIAL), f"more than {MAX_IN_PLACE_APPLICATIONS} subschemas"),
}


@pytest.mark.parametrize(("schema", "fragment"), HOSTILE_SCHEMAS.values(), ids=HOSTILE_SCHEMAS.keys())
async def test_hostile_output_schemas_are_invalid_before_dispatch(
    stub: Stub, negotiator: RunningNegotiator, schema: str, fragment: str
) -> None:
    fake = add_fake(negotiator, make_declaration("fake", supported=[Capability.STRUCTURED_OUTPUT]))
    for call in (
        stub.Produce(produce(schema), timeout=10),
        stub.Negotiate(pb.NegotiateRequest(produce=produce(schema)), timeout=10),
    ):
        error = await call_error(call)
        assert error.code is grpc.StatusCode.INVALID_ARGUMENT
        ((field, description),) = error.field_violations
        assert field in ("output_schema", "produce.output_schema")
        assert fragment in description
    assert fake.calls == []


async def test_a_recursive_schema_that_descends_is_still_accepted(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    }
    add_fake(
        negotiator,
        make_declaration("fake", supported=[Capability.STRUCTURED_OUTPUT]),
        default=json.dumps({"kids": [{"kids": []}]}),
    )
    response = await stub.Produce(produce(json.dumps(tree)), timeout=10)
    assert json.loads(response.output_json) == {"kids": [{"kids": []}]}


async def test_a_self_referencing_tool_schema_is_invalid(stub: Stub) -> None:
    call: Any = stub.ToolSession(timeout=10)  # type: ignore[call-arg]
    start = pb.ToolSessionStart(
        invoke=pb.InvokeRequest(adapter="tooled", prompt="go"),
        tools=[pb.ToolSpec(name="lookup", risk=pb.TOOL_RISK_READ_ONLY, arguments_schema='{"$ref": "#"}')],
    )
    await call.write(pb.ToolSessionRequest(start=start))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    error = decode_error(caught.value)
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [field for field, _ in error.field_violations] == ["start.tools[0].arguments_schema"]
