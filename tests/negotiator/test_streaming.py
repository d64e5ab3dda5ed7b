"""InvokeStream / ProduceStream through a real negotiator, against the SSE mock and scripted adapters."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeAlias

import grpc
import pytest
from mock_openai import MockOpenAI
from negotiator_testkit import NEGOTIATOR_BIN, call_error
from test_tools_openai import LocalToolBox

from agentsidecar.clients import NegotiatorClient
from agentsidecar.clients.aio import AsyncNegotiatorClient
from agentsidecar.clients.errors import UnsupportedCapabilityError
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.adapters.openai import OpenAIAdapter, SseReader
from agentsidecar.negotiator_service.conversations import ConversationStore
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterReply,
    AdapterSpec,
    CallKind,
    CallOptions,
    StreamDelta,
    StreamEvent,
)
from agentsidecar.negotiator_service.registry import RegisteredAdapter
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server
from agentsidecar.sidecar_runtime import limits
from agentsidecar.sidecar_runtime.server import ServerOptions

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
KEY_ENV = "NEGOTIATOR_TEST_OPENAI_STREAM_KEY"
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    with MockOpenAI() as server:
        yield server


def openai_spec(base_url: str) -> AdapterSpec:
    return AdapterSpec(
        shortname="llm",
        implementation="openai",
        options=MappingProxyType({"base_url": base_url, "api_key_env": KEY_ENV, "model": "mock-model-1"}),
    )


@pytest.fixture
async def llm(mock: MockOpenAI, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[OpenAIAdapter]:
    monkeypatch.setenv(KEY_ENV, "sk-test-stream")
    adapter = build_adapter(openai_spec(mock.base_url))
    assert isinstance(adapter, OpenAIAdapter)
    yield adapter
    await adapter.close()


@pytest.fixture
def registered(negotiator: RunningNegotiator, llm: OpenAIAdapter) -> OpenAIAdapter:
    negotiator.registry.add(RegisteredAdapter(adapter=llm, source="config"))
    return llm


def kinds(messages: list[Any]) -> list[str]:
    return [str(m.WhichOneof("kind")) for m in messages]


@pytest.mark.slow
async def test_the_first_delta_reaches_the_caller_as_the_upstream_sends_it(
    registered: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    mock.stream_chunks = ["Hel", "lo, ", "world"]
    mock.chunk_interval = 0.2
    arrivals: list[tuple[float, Any]] = []
    async for message in stub.InvokeStream(
        pb.InvokeStreamRequest(invoke=pb.InvokeRequest(adapter="llm", prompt="hi"))
    ):
        arrivals.append((time.monotonic(), message))
    messages = [m for _, m in arrivals]
    assert kinds(messages) == ["decision", "delta", "delta", "delta", "final"]
    assert messages[0].decision.adapter == "llm"
    assert messages[0].decision.accepted
    assert [m.delta for m in messages[1:4]] == ["Hel", "lo, ", "world"]
    assert messages[-1].final.text == "Hello, world"
    assert messages[-1].final.decision.adapter == "llm"
    # Each delta within 100 ms of the mock writing its chunk (the next one is 200 ms later).
    for (received, _), sent in zip(arrivals[1:4], mock.chunk_times, strict=True):
        assert received - sent < 0.1
    body = mock.requests[0].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


async def test_cancelling_mid_stream_closes_the_upstream_connection(
    registered: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    mock.stream_chunks = [f"part {n} " for n in range(20)]
    mock.chunk_interval = 0.2
    call = stub.InvokeStream(pb.InvokeStreamRequest(invoke=pb.InvokeRequest(adapter="llm", prompt="hi")))
    seen = []
    async for message in call:
        seen.append(message.WhichOneof("kind"))
        if message.WhichOneof("kind") == "delta":
            break
    cancelled = time.monotonic()
    call.cancel()
    # The mock sees its client hang up long before its next chunk was due.
    assert await asyncio.to_thread(mock.stream_closed.wait, 2.0)
    assert mock.closed_at is not None
    assert mock.closed_at - cancelled < 0.15
    assert len(mock.chunk_times) < 3
    assert seen == ["decision", "delta"]


async def test_a_refusal_ends_the_stream_before_anything_is_sent(
    registered: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    # A persona is UNKNOWN for the openai code (the upstream alone honours it): refused.
    request = pb.InvokeRequest(adapter="llm", prompt="hi", options=pb.CallOptions(persona="a pirate"))
    received: list[Any] = []

    async def read() -> None:
        async for message in stub.InvokeStream(pb.InvokeStreamRequest(invoke=request)):
            received.append(message)

    error = await call_error(read())
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "UNSUPPORTED_CAPABILITY"
    assert received == []
    assert mock.requests == []


async def test_a_streams_errors_point_into_the_call_it_holds(
    registered: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    async def read(request: Any) -> None:
        async for _ in stub.InvokeStream(request):
            pass

    missing = await call_error(read(pb.InvokeStreamRequest()))
    assert (missing.code, missing.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert [field for field, _ in missing.field_violations] == ["invoke"]
    empty_prompt = await call_error(read(pb.InvokeStreamRequest(invoke=pb.InvokeRequest(adapter="llm"))))
    assert [field for field, _ in empty_prompt.field_violations] == ["invoke.prompt"]
    assert mock.requests == []


async def test_a_schema_violation_is_the_streams_error_never_an_empty_final(
    registered: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    mock.structured = {"answer": 42}
    request = pb.ProduceRequest(adapter="llm", prompt="hi", output_schema=json.dumps(SCHEMA))
    received: list[Any] = []

    async def read() -> None:
        async for message in stub.ProduceStream(pb.ProduceStreamRequest(produce=request)):
            received.append(message)

    error = await call_error(read())
    assert error.code is grpc.StatusCode.INTERNAL
    assert error.reason == "OUTPUT_SCHEMA_VIOLATION"
    assert kinds(received)[0] == "decision"
    assert "final" not in kinds(received)
    assert "".join(m.delta for m in received[1:]) == '{"answer": 42}'


async def test_produce_stream_ends_with_the_validated_output(
    registered: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    request = pb.ProduceRequest(adapter="llm", prompt="hi", output_schema=json.dumps(SCHEMA))
    messages = [m async for m in stub.ProduceStream(pb.ProduceStreamRequest(produce=request))]
    assert kinds(messages)[0] == "decision"
    assert kinds(messages)[-1] == "final"
    assert json.loads(messages[-1].final.output_json) == {"answer": "42"}
    assert "".join(m.delta for m in messages[1:-1]) == messages[-1].final.output_json


async def test_an_adapter_that_does_not_stream_is_served_by_its_unary_call(stub: Stub) -> None:
    request = pb.InvokeRequest(
        adapter="scripted-fw", prompt="echo me", options=pb.CallOptions(stream_events=True)
    )
    messages = [m async for m in stub.InvokeStream(pb.InvokeStreamRequest(invoke=request))]
    assert kinds(messages) == ["decision", "event", "final"]
    assert (messages[1].event.type, messages[1].event.text) == ("message", "thinking")
    assert messages[2].final.text.endswith("echo me")
    assert list(messages[2].final.events) == []


@pytest.mark.slow
async def test_a_streamed_conversation_turn_commits_after_the_final_message(
    registered: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    first = pb.InvokeRequest(
        adapter="llm", prompt="remember this", options=pb.CallOptions(generate_conversation_id=True)
    )
    messages = [m async for m in stub.InvokeStream(pb.InvokeStreamRequest(invoke=first))]
    conversation = messages[-1].final.conversation_id
    assert conversation
    second = pb.InvokeRequest(
        adapter="llm", prompt="and now?", options=pb.CallOptions(conversation_id=conversation)
    )
    [m async for m in stub.InvokeStream(pb.InvokeStreamRequest(invoke=second))]
    sent = mock.requests[1].body["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("user", "remember this"),
        ("assistant", mock.reply_text),
        ("user", "and now?"),
    ]


async def test_tool_calls_inside_a_stream_run_through_the_toolbox(
    llm: OpenAIAdapter, mock: MockOpenAI
) -> None:
    mock.tool_rounds = [[{"id": "call_1", "name": "lookup", "arguments": {"key": "a"}}]]
    toolbox = LocalToolBox("lookup")
    call = AdapterCall(prompt="use the tool", options=CallOptions(stream_events=True), tools=toolbox)
    items = [item async for item in llm.stream(call, CallKind.INVOKE)]
    assert toolbox.calls == [("lookup", {"key": "a"})]
    events = [item for item in items if isinstance(item, StreamEvent)]
    assert [e.type for e in events] == ["tool_call", "tool_result"]
    assert json.loads(events[0].text) == {"id": "call_1", "name": "lookup", "arguments": '{"key": "a"}'}
    assert json.loads(events[1].text) == {"id": "call_1", "name": "lookup", "denied": False, "error": None}
    assert isinstance(items[-1], AdapterReply)
    assert items[-1].text == mock.reply_text
    assert "".join(i.text for i in items if isinstance(i, StreamDelta)) == mock.reply_text
    # The second request carried the assembled tool call and its result.
    followup = mock.requests[1].body["messages"]
    assert followup[1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"key": "a"}'}
    assert followup[2] == {"role": "tool", "tool_call_id": "call_1", "content": '{"n": 1}'}


async def test_breaking_out_of_the_sync_clients_iterator_cancels_the_call(
    registered: OpenAIAdapter, negotiator: RunningNegotiator, mock: MockOpenAI
) -> None:
    mock.stream_chunks = [f"part {n} " for n in range(20)]
    mock.chunk_interval = 0.2

    def read() -> list[str]:
        seen = []
        with NegotiatorClient(negotiator.bound[0]) as client:
            for message in client.invoke_stream(adapter="llm", prompt="hi"):
                seen.append(str(message.WhichOneof("kind")))
                if message.WhichOneof("kind") == "delta":
                    break
        return seen

    assert await asyncio.to_thread(read) == ["decision", "delta"]
    assert await asyncio.to_thread(mock.stream_closed.wait, 2.0)
    assert len(mock.chunk_times) < 5


async def test_breaking_out_of_the_aio_clients_iterator_cancels_the_call(
    registered: OpenAIAdapter, negotiator: RunningNegotiator, mock: MockOpenAI
) -> None:
    mock.stream_chunks = [f"part {n} " for n in range(20)]
    mock.chunk_interval = 0.2
    seen = []
    async with AsyncNegotiatorClient(negotiator.bound[0]) as client:
        async for message in client.invoke_stream(adapter="llm", prompt="hi"):
            seen.append(message.WhichOneof("kind"))
            if message.WhichOneof("kind") == "delta":
                break
        assert await asyncio.to_thread(mock.stream_closed.wait, 2.0)
    assert seen == ["decision", "delta"]
    assert len(mock.chunk_times) < 5


async def test_the_clients_map_a_refusal_mid_iteration(
    registered: OpenAIAdapter, negotiator: RunningNegotiator
) -> None:
    async with AsyncNegotiatorClient(negotiator.bound[0]) as client:
        stream = client.invoke_stream(adapter="llm", prompt="hi", options=pb.CallOptions(persona="a pirate"))
        with pytest.raises(UnsupportedCapabilityError):
            async for _ in stream:
                pass


@pytest.mark.slow
async def test_the_cli_prints_each_delta_as_it_arrives(
    registered: OpenAIAdapter, negotiator: RunningNegotiator, mock: MockOpenAI
) -> None:
    mock.stream_chunks = ["one ", "two ", "three"]
    mock.chunk_interval = 0.2
    process = await asyncio.create_subprocess_exec(
        str(NEGOTIATOR_BIN),
        "--server",
        negotiator.bound[0],
        "invoke",
        "--adapter",
        "llm",
        "--stream",
        "hi",
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    lines: list[tuple[float, Any]] = []
    while line := await process.stdout.readline():
        lines.append((time.monotonic(), json.loads(line)))
    assert await process.wait() == 0
    assert [value for _, value in lines[:3]] == [{"delta": "one "}, {"delta": "two "}, {"delta": "three"}]
    for (printed, _), sent in zip(lines[:3], mock.chunk_times, strict=True):
        assert printed - sent < 0.1
    final = lines[3][1]
    assert (final["adapter"], final["text"], final["events"]) == ("llm", "one two three", [])
    assert len(lines) == 4


async def test_a_stream_read_to_its_end_leaves_its_connection_for_the_next_call(
    registered: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    for _ in range(2):
        [
            m
            async for m in stub.InvokeStream(
                pb.InvokeStreamRequest(invoke=pb.InvokeRequest(adapter="llm", prompt="hi"))
            )
        ]
    first, second = (request.client_port for request in mock.requests)
    assert first == second


def test_the_sse_reader_splits_events_as_the_format_defines_wherever_chunks_break() -> None:
    stream = b': keep-alive\r\ndata: {"a":\r\ndata:1}\r\n\r\nevent: x\ndata: two\n\ndata: [DONE]\r\n\r\n'
    whole = SseReader().feed(stream)
    assert whole == ['{"a":\n1}', "two", "[DONE]"]
    for size in (1, 2, 3, 7):
        reader = SseReader()
        pieces = [reader.feed(stream[i : i + size]) for i in range(0, len(stream), size)]
        assert [event for piece in pieces for event in piece] + reader.finish() == whole
    unterminated = SseReader()
    assert unterminated.feed("data: caf\u00e9".encode()[:-1]) == []
    assert unterminated.feed("data: caf\u00e9".encode()[-1:]) == []
    assert unterminated.finish() == ["caf\u00e9"]


@pytest.mark.slow
async def test_a_stream_without_a_deadline_is_bounded_by_the_default_timeout(
    socket_dir: Path, config_file: Path, state_home: Path, llm: OpenAIAdapter, mock: MockOpenAI
) -> None:
    mock.stream_chunks = [f"part {n} " for n in range(20)]
    mock.chunk_interval = 0.2
    settings = Settings(
        listen=(f"unix:{socket_dir / 'limits.sock'}",),
        config_path=config_file,
        grace_seconds=0.5,
        server_options=ServerOptions(listen=(), default_timeout=0.5),
    )
    running = await create_server(settings, conversation_store=ConversationStore(state_home / "c"))
    running.registry.add(RegisteredAdapter(adapter=llm, source="config"))
    received: list[str] = []
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)

            async def read() -> None:
                async for message in stub.InvokeStream(
                    pb.InvokeStreamRequest(invoke=pb.InvokeRequest(adapter="llm", prompt="hi"))
                ):
                    received.append(str(message.WhichOneof("kind")))

            error = await call_error(read())
    finally:
        await running.stop()
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert (error.domain, error.reason) == (limits.DOMAIN, limits.DEFAULT_TIMEOUT_EXCEEDED)
    assert received[:2] == ["decision", "delta"]
    assert "final" not in received
    assert await asyncio.to_thread(mock.stream_closed.wait, 2.0)


@pytest.mark.slow
async def test_the_callers_deadline_bounds_the_whole_stream(
    registered: OpenAIAdapter, stub: Stub, mock: MockOpenAI
) -> None:
    mock.stream_chunks = [f"part {n} " for n in range(20)]
    mock.chunk_interval = 0.2
    started = time.monotonic()

    async def read() -> None:
        async for _ in stub.InvokeStream(
            pb.InvokeStreamRequest(invoke=pb.InvokeRequest(adapter="llm", prompt="hi")), timeout=0.5
        ):
            pass

    error = await call_error(read())
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 1.0
    assert await asyncio.to_thread(mock.stream_closed.wait, 2.0)
