"""The openai adapter's function calling, against the local mock speaking the real wire format.

Through a real negotiator (ToolSession) where the caller's side matters, and
directly against the adapter for its own limits.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from types import MappingProxyType

import grpc
import pytest
from mock_openai import MockOpenAI
from test_tools import KEY_SCHEMA, Caller, Stub, tool

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.adapters.openai import MAX_TOOL_ROUNDS, OpenAIAdapter, tool_message
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterSpec,
    CallOptions,
    Capability,
    CapabilityState,
    DeclarationOverride,
    JsonValue,
    ToolOutcome,
    ToolSpec,
)
from agentsidecar.negotiator_service.registry import RegisteredAdapter
from agentsidecar.negotiator_service.server import RunningNegotiator

KEY_ENV = "NEGOTIATOR_TEST_OPENAI_TOOLS_KEY"
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CONVERT_SCHEMA = {"type": "object", "properties": {"celsius": {"type": "number"}}, "required": ["celsius"]}


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    with MockOpenAI() as server:
        yield server


@pytest.fixture
async def llm(mock: MockOpenAI, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[OpenAIAdapter]:
    monkeypatch.setenv(KEY_ENV, "sk-test-tools")
    spec = AdapterSpec(
        shortname="llm",
        implementation="openai",
        # The mock honours a persona (a system message); the code alone declares it UNKNOWN.
        declaration=DeclarationOverride(
            capabilities=MappingProxyType({Capability.PERSONA: CapabilityState.SUPPORTED})
        ),
        options=MappingProxyType(
            {"base_url": mock.base_url, "api_key_env": KEY_ENV, "model": "mock-model-1"}
        ),
    )
    adapter = build_adapter(spec)
    assert isinstance(adapter, OpenAIAdapter)
    yield adapter
    await adapter.close()  # idempotent: a negotiator that registered it closes it too


@pytest.fixture
def registered(negotiator: RunningNegotiator, llm: OpenAIAdapter) -> OpenAIAdapter:
    """The adapter registered in a real negotiator (which closes it on stop)."""
    negotiator.registry.add(RegisteredAdapter(adapter=llm, source="config"))
    return llm


class LocalToolBox:
    """A ToolBox answering every call itself, recording what it was asked."""

    def __init__(self, *names: str) -> None:
        self._specs = tuple(ToolSpec(name=n, arguments_schema=json.loads(KEY_SCHEMA)) for n in names)
        self.calls: list[tuple[str, JsonValue]] = []

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return self._specs

    async def call(self, name: str, arguments: JsonValue) -> ToolOutcome:
        self.calls.append((name, arguments))
        return ToolOutcome(result={"n": len(self.calls)})


@pytest.mark.slow
async def test_two_rounds_of_tool_calls_send_exactly_the_protocol_messages(
    stub: Stub, mock: MockOpenAI, registered: OpenAIAdapter
) -> None:
    mock.tool_rounds = [
        [{"name": "weather", "arguments": {"city": "Oslo"}}],
        [
            {"name": "weather", "arguments": {"city": "Bergen"}},
            {"name": "convert", "arguments": {"celsius": 4}},
        ],
    ]
    mock.reply_text = "Oslo 3 C; Bergen 4 C (39.2 F)."
    caller = Caller(stub)
    await caller.start(
        pb.InvokeRequest(
            adapter="llm", prompt="Weather in Oslo and Bergen?", options=pb.CallOptions(persona="Be terse.")
        ),
        [
            tool("weather", arguments_schema=json.dumps(CITY_SCHEMA), description="Current weather"),
            tool("convert", risk=pb.TOOL_RISK_MUTATING, arguments_schema=json.dumps(CONVERT_SCHEMA)),
        ],
    )
    oslo = await caller.receive("tool_call")
    assert (oslo.name, json.loads(oslo.arguments_json)) == ("weather", {"city": "Oslo"})
    await caller.result(oslo.call_id, {"temp_c": 3})
    bergen = await caller.receive("tool_call")  # round two, in the model's order
    assert json.loads(bergen.arguments_json) == {"city": "Bergen"}
    await caller.result(bergen.call_id, {"temp_c": 4})
    approval = await caller.receive("approval_request")
    assert (approval.tool_name, approval.adapter) == ("convert", "llm")
    await caller.decide(approval.call_id, pb.APPROVAL_DECISION_ALLOW)
    converted = await caller.receive("tool_call")
    await caller.result(converted.call_id, {"fahrenheit": 39.2})
    assert await caller.final_text() == "Oslo 3 C; Bergen 4 C (39.2 F)."

    system = {"role": "system", "content": "Be terse."}
    user = {"role": "user", "content": "Weather in Oslo and Bergen?"}
    round_one = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_mock1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    }
    round_two = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_mock2",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Bergen"}'},
            },
            {
                "id": "call_mock3",
                "type": "function",
                "function": {"name": "convert", "arguments": '{"celsius": 4}'},
            },
        ],
    }
    results = [
        {"role": "tool", "tool_call_id": "call_mock1", "content": '{"temp_c": 3}'},
        {"role": "tool", "tool_call_id": "call_mock2", "content": '{"temp_c": 4}'},
        {"role": "tool", "tool_call_id": "call_mock3", "content": '{"fahrenheit": 39.2}'},
    ]
    assert [r.body["messages"] for r in mock.requests] == [
        [system, user],
        [system, user, round_one, results[0]],
        [system, user, round_one, results[0], round_two, results[1], results[2]],
    ]
    assert mock.tool_messages == results
    expected_tools = [
        {
            "type": "function",
            "function": {"name": "weather", "description": "Current weather", "parameters": CITY_SCHEMA},
        },
        {"type": "function", "function": {"name": "convert", "parameters": CONVERT_SCHEMA}},
    ]
    assert all(r.body["tools"] == expected_tools for r in mock.requests)
    assert all(r.body["model"] == "mock-model-1" for r in mock.requests)


async def test_a_hidden_tool_is_not_offered_and_a_call_to_it_never_reaches_the_caller(
    stub: Stub, mock: MockOpenAI, registered: OpenAIAdapter
) -> None:
    mock.tool_rounds = [[{"name": "delete", "arguments": {"key": "all"}}]]
    caller = Caller(stub)
    await caller.start(
        pb.InvokeRequest(
            adapter="llm",
            prompt="tidy up",
            options=pb.CallOptions(tool_filter=pb.ToolFilter(deny=["delete"])),
        ),
        [tool("read"), tool("delete")],
    )
    assert await caller.final_text() == mock.reply_text  # no tool call, no approval in between
    assert [t["function"]["name"] for t in mock.requests[0].body["tools"]] == ["read"]
    assert mock.tool_messages == [
        {
            "role": "tool",
            "tool_call_id": "call_mock1",
            "content": 'error: there is no tool named "delete" in this call',
        }
    ]


async def test_a_denied_call_tells_the_model_why(
    stub: Stub, mock: MockOpenAI, registered: OpenAIAdapter
) -> None:
    mock.tool_rounds = [[{"name": "write", "arguments": {"key": "x"}}]]
    caller = Caller(stub)
    await caller.start(
        pb.InvokeRequest(adapter="llm", prompt="write x"), [tool("write", risk=pb.TOOL_RISK_SENSITIVE)]
    )
    request = await caller.receive("approval_request")
    await caller.decide(request.call_id, pb.APPROVAL_DECISION_DENY, reason="read-only day")
    assert await caller.final_text() == mock.reply_text
    assert mock.tool_messages == [
        {"role": "tool", "tool_call_id": "call_mock1", "content": "denied: read-only day"}
    ]


async def test_a_session_refused_for_the_adapter_sends_no_request(
    stub: Stub, negotiator: RunningNegotiator, mock: MockOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-tools")
    narrowed = DeclarationOverride(
        capabilities=MappingProxyType({Capability.TOOL_REGISTRATION: CapabilityState.UNSUPPORTED})
    )
    spec = AdapterSpec(
        shortname="llm",
        implementation="openai",
        declaration=narrowed,
        options=MappingProxyType(
            {"base_url": mock.base_url, "api_key_env": KEY_ENV, "model": "mock-model-1"}
        ),
    )
    negotiator.registry.add(RegisteredAdapter(adapter=build_adapter(spec), source="config"))
    caller = Caller(stub)
    await caller.start(pb.InvokeRequest(adapter="llm", prompt="p"), [tool("read")])
    error = await caller.error()
    assert (error.code, error.metadata["gaps"]) == (grpc.StatusCode.FAILED_PRECONDITION, "tool_registration")
    assert mock.requests == []


# --- the adapter on its own -----------------------------------------------------------


async def test_malformed_arguments_from_the_model_are_an_error_result_not_a_call(
    mock: MockOpenAI, llm: OpenAIAdapter
) -> None:
    mock.tool_rounds = [
        [{"name": "read", "arguments": "{not json"}, {"name": "read", "arguments": {"key": "k"}}]
    ]
    toolbox = LocalToolBox("read")
    reply = await llm.invoke(AdapterCall(prompt="p", options=CallOptions(), tools=toolbox))
    assert reply.text == mock.reply_text
    assert toolbox.calls == [("read", {"key": "k"})]
    first, second = mock.tool_messages
    assert first["tool_call_id"] == "call_mock1"
    assert first["content"].startswith("error: the arguments are not valid JSON (")
    assert first["content"].endswith("); the tool did not run")
    assert second == {"role": "tool", "tool_call_id": "call_mock2", "content": '{"n": 1}'}


@pytest.mark.slow
async def test_a_model_that_never_stops_calling_tools_is_cut_off(
    mock: MockOpenAI, llm: OpenAIAdapter
) -> None:
    mock.tool_rounds = [[{"name": "read", "arguments": {"key": "again"}}] for _ in range(MAX_TOOL_ROUNDS + 5)]
    toolbox = LocalToolBox("read")
    with pytest.raises(errors.AdapterInternal, match=f"no final answer after {MAX_TOOL_ROUNDS} rounds"):
        await llm.invoke(AdapterCall(prompt="p", options=CallOptions(), tools=toolbox))
    assert len(toolbox.calls) == MAX_TOOL_ROUNDS
    assert len(mock.requests) == MAX_TOOL_ROUNDS + 1


async def test_tool_calls_when_no_tools_were_offered_are_an_adapter_failure(
    mock: MockOpenAI, llm: OpenAIAdapter
) -> None:
    mock.tool_rounds = [[{"name": "read", "arguments": {}}]]
    with pytest.raises(errors.AdapterInternal, match="the model called tools, but this call offered none"):
        await llm.invoke(AdapterCall(prompt="p", options=CallOptions()))
    assert "tools" not in mock.requests[0].body


async def test_produce_with_tools_sends_both_the_schema_and_the_tools(
    mock: MockOpenAI, llm: OpenAIAdapter
) -> None:
    mock.tool_rounds = [[{"name": "read", "arguments": {"key": "k"}}]]
    mock.structured = {"answer": "1"}
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    toolbox = LocalToolBox("read")
    reply = await llm.produce(
        AdapterCall(prompt="p", options=CallOptions(), output_schema=schema, tools=toolbox)
    )
    assert json.loads(reply.text) == {"answer": "1"}
    strict = {**schema, "additionalProperties": False}  # the strict form of the caller's schema
    assert all(r.body["response_format"]["json_schema"]["schema"] == strict for r in mock.requests)
    assert all(len(r.body["tools"]) == 1 for r in mock.requests)


@pytest.mark.parametrize(
    ("outcome", "content"),
    [
        (ToolOutcome(result={"a": [1, "é"]}), '{"a": [1, "é"]}'),
        (ToolOutcome(result="text"), '"text"'),
        (ToolOutcome(error="boom"), "error: boom"),
        (ToolOutcome(denied=True, error="no"), "denied: no"),
        (ToolOutcome(denied=True), "denied: the caller denied this call"),
    ],
)
def test_tool_message_content(outcome: ToolOutcome, content: str) -> None:
    assert tool_message("call_1", outcome) == {"role": "tool", "tool_call_id": "call_1", "content": content}
