"""Streamed ToolSessions (`start.stream`) through a real negotiator: the SSE mock and scripted adapters.

The openai adapter streams each round over SSE; the mock sends content
chunks `chunk_interval` apart before a round's tool call (`tool_round_chunks`)
and in the answer after it (`stream_chunks`), recording when it wrote each.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import grpc
import pytest
from mock_openai import MockOpenAI
from test_tools import EOF, TOOLS_CONFIG, Caller, Stub, tool

from agentsidecar.clients import NegotiatorClient
from agentsidecar.clients.aio import AsyncNegotiatorClient
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.adapters.openai import OpenAIAdapter
from agentsidecar.negotiator_service.model import AdapterSpec
from agentsidecar.negotiator_service.registry import RegisteredAdapter
from agentsidecar.negotiator_service.server import RunningNegotiator
from agentsidecar.sidecar_runtime.richstatus import decode_error

KEY_ENV = "NEGOTIATOR_TEST_OPENAI_TOOL_STREAM_KEY"
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "negotiator.yaml"
    path.write_text(TOOLS_CONFIG)
    return path


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    with MockOpenAI() as server:
        yield server


@pytest.fixture
async def llm(
    mock: MockOpenAI, monkeypatch: pytest.MonkeyPatch, negotiator: RunningNegotiator
) -> AsyncIterator[OpenAIAdapter]:
    """The openai adapter against the mock, registered in the negotiator (which closes it on stop)."""
    monkeypatch.setenv(KEY_ENV, "sk-test-tool-stream")
    spec = AdapterSpec(
        shortname="llm",
        implementation="openai",
        options=MappingProxyType(
            {"base_url": mock.base_url, "api_key_env": KEY_ENV, "model": "mock-model-1"}
        ),
    )
    adapter = build_adapter(spec)
    assert isinstance(adapter, OpenAIAdapter)
    negotiator.registry.add(RegisteredAdapter(adapter=adapter, source="config"))
    yield adapter
    await adapter.close()


def streamed_start(
    call: pb.InvokeRequest | pb.ProduceRequest, tools: Sequence[pb.ToolSpec] = (), *, stream: bool = True
) -> pb.ToolSessionRequest:
    start = pb.ToolSessionStart(tools=list(tools), stream=stream)
    if isinstance(call, pb.ProduceRequest):
        start.produce.CopyFrom(call)
    else:
        start.invoke.CopyFrom(call)
    return pb.ToolSessionRequest(start=start)


class Received:
    """Every message of one session as it arrived: (time.monotonic(), kind, payload)."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller
        self.log: list[tuple[float, str, Any]] = []

    async def until(self, *kinds: str) -> Any:
        """Read until a message of one of `kinds` arrives; its payload."""
        while True:
            message = await self.caller.call.read()
            assert message is not EOF, f"the stream ended before {kinds}: {self.kinds}"
            kind = str(message.WhichOneof("message"))
            self.log.append((time.monotonic(), kind, getattr(message, kind)))
            if kind in kinds:
                return getattr(message, kind)

    async def to_the_end(self) -> None:
        assert await self.caller.call.read() is EOF
        assert await self.caller.call.code() is grpc.StatusCode.OK

    @property
    def kinds(self) -> list[str]:
        return [kind for _, kind, _ in self.log]

    @property
    def deltas(self) -> list[tuple[float, str]]:
        return [(when, payload) for when, kind, payload in self.log if kind == "delta"]


def lookup_round() -> list[list[dict[str, Any]]]:
    return [[{"id": "call_up1", "name": "lookup", "arguments": {"key": "a"}}]]


async def test_deltas_around_a_tool_call_reach_the_caller_in_order_as_the_upstream_sends_them(
    llm: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    mock.tool_round_chunks = ["Let me ", "look."]
    mock.tool_rounds = lookup_round()
    mock.stream_chunks = ["Found ", "it", "."]
    mock.chunk_interval = 0.2
    caller = Caller(stub)
    received = Received(caller)
    await caller.send(
        streamed_start(
            pb.InvokeRequest(adapter="llm", prompt="find a", options=pb.CallOptions(stream_events=True)),
            [tool("lookup")],
        )
    )
    tool_call = await received.until("tool_call")
    await caller.result(tool_call.call_id, {"value": 1})
    result = await received.until("invoke_result")
    await received.to_the_end()
    assert received.kinds == [
        "decision",
        "delta",
        "delta",
        "event",
        "tool_call",
        "event",
        "delta",
        "delta",
        "delta",
        "invoke_result",
    ]
    decision = received.log[0][2]
    assert (decision.adapter, decision.accepted) == ("llm", True)
    assert [text for _, text in received.deltas] == ["Let me ", "look.", "Found ", "it", "."]
    events = [payload for _, kind, payload in received.log if kind == "event"]
    assert [event.type for event in events] == ["tool_call", "tool_result"]
    assert json.loads(events[0].text)["name"] == "lookup"
    assert (tool_call.name, json.loads(tool_call.arguments_json)) == ("lookup", {"key": "a"})
    # Each delta within 100 ms of the mock writing it: none waited for the upstream to finish.
    for (arrived, _), sent in zip(received.deltas, mock.chunk_times, strict=True):
        assert arrived - sent < 0.1
    assert received.deltas[0][0] < mock.chunk_times[1]
    assert result.text == "Found it."
    assert list(result.events) == []  # they were streamed
    assert result.decision.adapter == "llm"
    assert all(request.body["stream"] is True for request in mock.requests)
    assert mock.tool_messages == [{"role": "tool", "tool_call_id": "call_up1", "content": '{"value": 1}'}]


async def test_an_approval_round_in_the_middle_of_a_streamed_session(
    llm: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    mock.tool_round_chunks = ["Writing."]
    mock.tool_rounds = [
        [{"name": "write", "arguments": {"key": "b"}}],
        [{"name": "write", "arguments": {"key": "c"}}],
    ]
    mock.stream_chunks = ["Done", "."]
    caller = Caller(stub)
    received = Received(caller)
    await caller.send(
        streamed_start(
            pb.InvokeRequest(adapter="llm", prompt="write b"), [tool("write", pb.TOOL_RISK_MUTATING)]
        )
    )
    first = await received.until("approval_request")
    assert (first.tool_name, json.loads(first.arguments_json), first.adapter) == (
        "write",
        {"key": "b"},
        "llm",
    )
    await caller.decide(first.call_id, pb.APPROVAL_DECISION_ALLOW)
    tool_call = await received.until("tool_call")
    assert tool_call.call_id == first.call_id
    await caller.result(tool_call.call_id, {"written": True})
    second = await received.until("approval_request")
    await caller.decide(second.call_id, pb.APPROVAL_DECISION_DENY, reason="not c")
    result = await received.until("invoke_result")
    await received.to_the_end()
    assert received.kinds == [
        "decision",
        "delta",
        "approval_request",
        "tool_call",
        "delta",
        "approval_request",
        "delta",
        "delta",
        "invoke_result",
    ]
    assert result.text == "Done."
    assert [m["content"] for m in mock.tool_messages] == ['{"written": true}', "denied: not c"]


async def test_a_session_without_stream_is_unchanged(
    llm: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    mock.tool_round_chunks = ["Let me ", "look."]
    mock.tool_rounds = lookup_round()
    caller = Caller(stub)
    received = Received(caller)
    await caller.send(
        streamed_start(pb.InvokeRequest(adapter="llm", prompt="find a"), [tool("lookup")], stream=False)
    )
    tool_call = await received.until("tool_call")
    await caller.result(tool_call.call_id, {"value": 1})
    result = await received.until("invoke_result")
    await received.to_the_end()
    assert received.kinds == ["tool_call", "invoke_result"]
    assert result.text == mock.reply_text
    # The unary path: no SSE asked for.
    assert all("stream" not in request.body for request in mock.requests)


async def test_cancelling_a_streamed_session_mid_stream_closes_the_upstream(
    llm: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    mock.tool_rounds = lookup_round()
    mock.stream_chunks = [f"part {n} " for n in range(20)]
    mock.chunk_interval = 0.2
    caller = Caller(stub)
    received = Received(caller)
    await caller.send(streamed_start(pb.InvokeRequest(adapter="llm", prompt="find a"), [tool("lookup")]))
    tool_call = await received.until("tool_call")
    await caller.result(tool_call.call_id, {"value": 1})
    await received.until("delta")
    cancelled = time.monotonic()
    caller.call.cancel()
    # The mock sees its client hang up long before its next chunk was due.
    assert await asyncio.to_thread(mock.stream_closed.wait, 2.0)
    assert mock.closed_at is not None
    assert mock.closed_at - cancelled < 0.15
    assert len(mock.chunk_times) < 3
    assert received.kinds == ["decision", "tool_call", "delta"]


async def test_a_streamed_session_is_refused_before_anything_is_sent(
    llm: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    # A persona is UNKNOWN for the openai code (the upstream alone honours it): refused.
    request = pb.InvokeRequest(adapter="llm", prompt="hi", options=pb.CallOptions(persona="a pirate"))
    statuses = []
    for stream in (False, True):
        caller = Caller(stub)
        await caller.send(streamed_start(request, [tool("lookup")], stream=stream))
        received = Received(caller)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await received.until("decision")
        assert received.kinds == []
        error = decode_error(caught.value)
        statuses.append((error.code, error.reason, error.metadata))
    assert statuses[0] == statuses[1]
    assert statuses[0][:2] == (grpc.StatusCode.FAILED_PRECONDITION, "UNSUPPORTED_CAPABILITY")
    assert mock.requests == []


async def test_a_streamed_produce_is_validated_once_at_the_end(
    llm: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    request = pb.ProduceRequest(adapter="llm", prompt="hi", output_schema=json.dumps(SCHEMA))
    caller = Caller(stub)
    received = Received(caller)
    await caller.send(streamed_start(request))
    result = await received.until("produce_result")
    await received.to_the_end()
    assert json.loads(result.output_json) == {"answer": "42"}
    assert "".join(text for _, text in received.deltas) == result.output_json

    mock.structured = {"answer": 42}
    caller = Caller(stub)
    received = Received(caller)
    await caller.send(streamed_start(request))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await received.until("produce_result")
    error = decode_error(caught.value)
    assert (error.code, error.reason) == (grpc.StatusCode.INTERNAL, "OUTPUT_SCHEMA_VIOLATION")
    assert "produce_result" not in received.kinds
    assert received.kinds[0] == "decision"
    assert "".join(text for _, text in received.deltas) == '{"answer": 42}'


async def test_a_streamed_session_commits_its_conversation_turn(
    llm: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    mock.tool_rounds = lookup_round()
    caller = Caller(stub)
    received = Received(caller)
    first = pb.InvokeRequest(
        adapter="llm", prompt="find a", options=pb.CallOptions(generate_conversation_id=True)
    )
    await caller.send(streamed_start(first, [tool("lookup")]))
    tool_call = await received.until("tool_call")
    await caller.result(tool_call.call_id, {"value": 1})
    result = await received.until("invoke_result")
    await received.to_the_end()
    assert result.conversation_id
    follow = pb.InvokeRequest(
        adapter="llm", prompt="and now?", options=pb.CallOptions(conversation_id=result.conversation_id)
    )
    await stub.Invoke(follow)
    sent = mock.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "user"]
    assert sent[-2]["content"] == mock.reply_text


async def test_an_adapter_that_does_not_stream_sends_the_decision_first(stub: Stub) -> None:
    caller = Caller(stub)
    received = Received(caller)
    await caller.send(
        streamed_start(
            pb.InvokeRequest(
                adapter="tooled",
                prompt="go",
                options=pb.CallOptions(tool_filter=pb.ToolFilter(deny=["hidden"])),
            ),
            [tool("lookup"), tool("hidden")],
        )
    )
    tool_call = await received.until("tool_call")
    await caller.result(tool_call.call_id, {"value": 7})
    result = await received.until("invoke_result")
    await received.to_the_end()
    assert received.kinds == ["decision", "tool_call", "invoke_result"]
    assert json.loads(result.text)["tool_results"][0] == {"name": "lookup", "result": {"value": 7}}


# --- the Python clients ----------------------------------------------------------------


async def test_the_sync_client_hands_each_delta_to_on_delta_as_it_arrives(
    llm: OpenAIAdapter, negotiator: RunningNegotiator, mock: MockOpenAI
) -> None:
    mock.tool_round_chunks = ["Let me ", "look."]
    mock.tool_rounds = lookup_round()
    mock.stream_chunks = ["Found ", "it."]
    mock.chunk_interval = 0.2
    seen: list[tuple[float, str, Any]] = []

    def run_tool(call: pb.ToolCall) -> Any:
        seen.append((time.monotonic(), "tool", call.name))
        return {"value": 1}

    def run() -> pb.InvokeResponse:
        with NegotiatorClient(negotiator.bound[0]) as client:
            return client.tool_session(
                pb.InvokeRequest(adapter="llm", prompt="find a", options=pb.CallOptions(stream_events=True)),
                tools=[tool("lookup")],
                run_tool=run_tool,
                on_delta=lambda text: seen.append((time.monotonic(), "delta", text)),
                on_event=lambda event: seen.append((time.monotonic(), "event", event.type)),
            )

    result = await asyncio.to_thread(run)
    assert result.text == "Found it."
    assert [(kind, value) for _, kind, value in seen] == [
        ("delta", "Let me "),
        ("delta", "look."),
        ("event", "tool_call"),
        ("tool", "lookup"),
        ("event", "tool_result"),
        ("delta", "Found "),
        ("delta", "it."),
    ]
    # Each delta reached on_delta before the mock sent the next chunk: handed on as it arrived,
    # not collected (a bound of the chunk interval holds on a loaded machine too).
    deltas = [when for when, kind, _ in seen if kind == "delta"]
    for arrived, sent in zip(deltas, mock.chunk_times, strict=True):
        assert arrived - sent < mock.chunk_interval


async def test_the_aio_client_hands_each_delta_to_on_delta(
    llm: OpenAIAdapter, negotiator: RunningNegotiator, mock: MockOpenAI
) -> None:
    mock.tool_rounds = lookup_round()
    mock.stream_chunks = ["Found ", "it."]
    seen: list[tuple[str, Any]] = []

    async def on_delta(text: str) -> None:
        seen.append(("delta", text))

    def run_tool(call: pb.ToolCall) -> Any:
        seen.append(("tool", call.name))
        return {"value": 1}

    async def approve(request: pb.ApprovalRequest) -> bool:
        seen.append(("approve", request.tool_name))
        return True

    async with AsyncNegotiatorClient(negotiator.bound[0]) as client:
        result = await client.tool_session(
            pb.InvokeRequest(adapter="llm", prompt="find a"),
            tools=[tool("lookup", pb.TOOL_RISK_SENSITIVE)],
            run_tool=run_tool,
            approve=approve,
            on_delta=on_delta,
        )
    assert result.text == "Found it."
    assert seen == [("approve", "lookup"), ("tool", "lookup"), ("delta", "Found "), ("delta", "it.")]
    assert all(request.body["stream"] is True for request in mock.requests)


async def test_the_clients_without_on_delta_do_not_stream(
    llm: OpenAIAdapter, negotiator: RunningNegotiator, mock: MockOpenAI
) -> None:
    mock.tool_rounds = lookup_round()
    async with AsyncNegotiatorClient(negotiator.bound[0]) as client:
        result = await client.tool_session(
            pb.InvokeRequest(adapter="llm", prompt="find a"),
            tools=[tool("lookup")],
            run_tool=lambda call: {"value": 1},
        )
    assert result.text == mock.reply_text
    assert all("stream" not in request.body for request in mock.requests)
