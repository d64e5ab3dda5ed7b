"""Streamed calls to remote adapters: a real negotiator and tests/negotiator/remote_double.py processes.

The double runs with --stream (declares stream_events, serves InvokeStream /
ProduceStream), with --stream --no-stream-rpc (declares it, lacks the RPCs),
or plain (declares stream_events unsupported); --log-rpcs makes it print
"RPC <method>" as each call arrives, so the tests see which RPC served a call.
"""

from __future__ import annotations

import asyncio
import json
import queue
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeAlias

import grpc
import pytest
from negotiator_testkit import call_error
from test_adapter_remote import SCHEMA, ExampleProcess
from test_tools_remote import LocalToolBox

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.adapters.remote import RemoteAdapter, connect_remote
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterReply,
    CallKind,
    CallOptions,
    StreamDelta,
    StreamEvent,
)
from agentsidecar.negotiator_service.server import RunningNegotiator

pytestmark = pytest.mark.slow

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
CALLS = ("RPC Invoke", "RPC Produce", "RPC CallWithTools")
INTERNAL = grpc.StatusCode.INTERNAL


def start(tmp_path_factory: pytest.TempPathFactory, shortname: str, *flags: str) -> ExampleProcess:
    socket_path = tmp_path_factory.mktemp("stream") / "adapter.sock"
    return ExampleProcess(f"unix:{socket_path}", shortname, "--log-rpcs", *flags)


@pytest.fixture(scope="module")
def streaming(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleProcess]:
    running = start(tmp_path_factory, "streamer", "--stream")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def unary_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleProcess]:
    running = start(tmp_path_factory, "old-streamer", "--stream", "--no-stream-rpc")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def unstreamed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleProcess]:
    running = start(tmp_path_factory, "plain")
    yield running
    running.stop()


def drain(example: ExampleProcess) -> None:
    """Forget the lines printed so far (by earlier tests)."""
    while True:
        try:
            example.lines.get_nowait()
        except queue.Empty:
            return


def next_call(example: ExampleProcess, within: float = 5) -> str:
    """The method of the next Produce/Invoke/CallWithTools-family call the remote received."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = example.lines.get(timeout=left)
        except queue.Empty:
            break
        if line.startswith(CALLS):
            return line.removeprefix("RPC ")
    raise AssertionError(f"no call reached the remote within {within} s")


async def register(stub: Stub, example: ExampleProcess, shortname: str) -> None:
    drain(example)
    request = pb.RegisterAdapterRequest(target=example.address, shortname=shortname)
    await stub.RegisterAdapter(request, timeout=10)


def invoke_stream(stub: Stub, adapter: str, prompt: str, **options: Any) -> Any:
    request = pb.InvokeRequest(adapter=adapter, prompt=prompt, options=pb.CallOptions(**options))
    return stub.InvokeStream(pb.InvokeStreamRequest(invoke=request), timeout=10)


def kinds(messages: list[Any]) -> list[str]:
    return [str(m.WhichOneof("kind")) for m in messages]


async def test_deltas_reach_the_caller_as_the_remote_sends_them(
    negotiator: RunningNegotiator, stub: Stub, streaming: ExampleProcess
) -> None:
    await register(stub, streaming, "streamer")
    arrivals: list[tuple[float, Any]] = []
    async for message in invoke_stream(stub, "streamer", "chunks:3:0.2", stream_events=True):
        arrivals.append((time.monotonic(), message))
    messages = [m for _, m in arrivals]
    assert kinds(messages) == ["decision", "delta", "event", "delta", "event", "delta", "event", "final"]
    assert [m.delta for m in messages if m.WhichOneof("kind") == "delta"] == ["part1 ", "part2 ", "part3 "]
    assert [(m.event.type, m.event.text) for m in messages if m.WhichOneof("kind") == "event"] == [
        ("progress", "1"),
        ("progress", "2"),
        ("progress", "3"),
    ]
    assert messages[-1].final.text == "part1 part2 part3 "
    assert next_call(streaming) == "InvokeStream"
    # CLOCK_MONOTONIC is one clock for every process on the machine: each delta reached the
    # caller within 100 ms of the remote writing it (the next one was 200 ms later).
    sent = [float(streaming.expect(f"DELTA {n} ").split()[2]) for n in (1, 2, 3)]
    received = [t for t, m in arrivals if m.WhichOneof("kind") == "delta"]
    for got, wrote in zip(received, sent, strict=True):
        assert 0 <= got - wrote < 0.1


async def test_produce_streams_its_json_and_the_final_is_validated(
    negotiator: RunningNegotiator, stub: Stub, streaming: ExampleProcess
) -> None:
    await register(stub, streaming, "streamer")
    request = pb.ProduceRequest(adapter="streamer", prompt="q", output_schema=json.dumps(SCHEMA))
    messages = [m async for m in stub.ProduceStream(pb.ProduceStreamRequest(produce=request), timeout=10)]
    assert kinds(messages) == ["decision", "delta", "delta", "final"]
    assert json.loads(messages[1].delta + messages[2].delta) == {"echo": "q"}
    assert json.loads(messages[-1].final.output_json) == {"echo": "q"}
    assert next_call(streaming) == "ProduceStream"


async def test_a_remote_without_the_stream_rpc_is_served_unary_until_it_registers_again(
    negotiator: RunningNegotiator, stub: Stub, unary_only: ExampleProcess
) -> None:
    await register(stub, unary_only, "old-streamer")
    for _ in range(2):
        messages = [m async for m in invoke_stream(stub, "old-streamer", "hi")]
        assert kinds(messages) == ["decision", "final"]
        assert messages[-1].final.text == "remote:hi"
    # Asked once, then remembered: the second call went straight to Invoke.
    assert [next_call(unary_only) for _ in range(3)] == ["InvokeStream", "Invoke", "Invoke"]
    await stub.DeregisterAdapter(pb.DeregisterAdapterRequest(shortname="old-streamer"), timeout=5)
    await register(stub, unary_only, "old-streamer")
    messages = [m async for m in invoke_stream(stub, "old-streamer", "again")]
    assert messages[-1].final.text == "remote:again"
    assert [next_call(unary_only) for _ in range(2)] == ["InvokeStream", "Invoke"]


async def test_a_remote_that_does_not_declare_stream_events_is_never_streamed(
    negotiator: RunningNegotiator, stub: Stub, unstreamed: ExampleProcess
) -> None:
    await register(stub, unstreamed, "plain")
    messages = [m async for m in invoke_stream(stub, "plain", "hi")]
    assert kinds(messages) == ["decision", "final"]
    assert messages[-1].final.text == "remote:hi"
    assert next_call(unstreamed) == "Invoke"


async def test_cancelling_the_stream_cancels_the_remotes_rpc_at_once(
    negotiator: RunningNegotiator, stub: Stub, streaming: ExampleProcess
) -> None:
    await register(stub, streaming, "streamer")
    call = invoke_stream(stub, "streamer", "chunks:50:0.2")
    async for message in call:
        if message.WhichOneof("kind") == "delta":
            break
    cancelled = time.monotonic()
    call.cancel()
    await asyncio.to_thread(streaming.expect, "CANCELLED InvokeStream chunks:50:0.2", 5)
    # Long before the remote's next delta was due.
    assert time.monotonic() - cancelled < 0.2
    with pytest.raises(AssertionError):
        streaming.expect("DELTA 2 ", within=0.3)


async def test_the_callers_deadline_bounds_the_remote_stream(
    negotiator: RunningNegotiator, stub: Stub, streaming: ExampleProcess
) -> None:
    await register(stub, streaming, "streamer")
    request = pb.InvokeRequest(adapter="streamer", prompt="chunks:50:0.2")
    seen: list[str] = []

    async def read() -> None:
        async for message in stub.InvokeStream(pb.InvokeStreamRequest(invoke=request), timeout=0.7):
            seen.append(str(message.WhichOneof("kind")))

    error = await call_error(read())
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert seen[:2] == ["decision", "delta"]
    assert "final" not in seen
    await asyncio.to_thread(streaming.expect, "CANCELLED InvokeStream chunks:50:0.2", 5)


@pytest.mark.parametrize(
    ("prompt", "code", "reason", "cause"),
    [
        ("nofinal:", INTERNAL, "ADAPTER_INTERNAL", "InvokeStream ended without its final"),
        ("twofinals:", INTERNAL, "ADAPTER_INTERNAL", "InvokeStream sent final after its final"),
        ("deltaafterfinal:", INTERNAL, "ADAPTER_INTERNAL", "InvokeStream sent delta after its final"),
        # Five 1 MiB deltas: each message is within grpc's limit, together they exceed one reply's.
        ("flood:5", INTERNAL, "ADAPTER_REPLY_TOO_LARGE", f"more than {4 * 1024 * 1024} bytes"),
        ("deltathenfail:RESOURCE_EXHAUSTED", grpc.StatusCode.RESOURCE_EXHAUSTED, "ADAPTER_RATE_LIMITED", ""),
        ("deltathenfail:UNIMPLEMENTED", grpc.StatusCode.FAILED_PRECONDITION, "ADAPTER_REFUSED", ""),
    ],
)
async def test_a_malformed_or_failing_remote_stream_is_the_callers_error(
    negotiator: RunningNegotiator,
    stub: Stub,
    streaming: ExampleProcess,
    prompt: str,
    code: grpc.StatusCode,
    reason: str,
    cause: str,
) -> None:
    await register(stub, streaming, "streamer")
    seen: list[str] = []

    async def read() -> None:
        async for message in invoke_stream(stub, "streamer", prompt):
            seen.append(str(message.WhichOneof("kind")))

    error = await call_error(read())
    assert (error.code, error.reason, error.metadata["adapter"]) == (code, reason, "streamer")
    assert cause in error.metadata["cause"]
    assert seen[0] == "decision"
    assert "final" not in seen


async def test_unimplemented_before_any_message_falls_back_to_the_unary_call(
    negotiator: RunningNegotiator, stub: Stub, streaming: ExampleProcess
) -> None:
    await register(stub, streaming, "streamer")
    messages = [m async for m in invoke_stream(stub, "streamer", "unimplemented:")]
    assert kinds(messages) == ["decision", "final"]
    assert messages[-1].final.text == "remote:unimplemented:"
    assert [next_call(streaming) for _ in range(2)] == ["InvokeStream", "Invoke"]


@pytest.fixture
async def streamer(streaming: ExampleProcess) -> AsyncIterator[RemoteAdapter]:
    adapter = await connect_remote(streaming.address, "streamer")
    yield adapter
    await adapter.close()


async def test_tool_calls_and_deltas_share_the_call_with_tools_stream(streamer: RemoteAdapter) -> None:
    tools = LocalToolBox("lookup")
    call = AdapterCall(
        prompt='tool:lookup:{"key": "k"}',
        options=CallOptions(stream_events=True),
        time_budget=10,
        tools=tools,
    )
    items = [item async for item in streamer.stream(call, CallKind.INVOKE)]
    assert items[:2] == [StreamDelta("calling lookup "), StreamEvent("tool", "lookup")]
    reply = items[-1]
    assert isinstance(reply, AdapterReply)
    assert json.loads(reply.text.removeprefix("remote:")) == {"tool": "lookup", "result": {"n": 1}}
    assert len(items) == 3
    assert tools.calls == [("lookup", {"key": "k"})]
    # Without stream_events the deltas still come, the events do not.
    plain = AdapterCall(prompt='tool:lookup:{"key": "k"}', options=CallOptions(), time_budget=10, tools=tools)
    items = [item async for item in streamer.stream(plain, CallKind.INVOKE)]
    assert items[0] == StreamDelta("calling lookup ")
    assert len(items) == 2


async def serving_status(stub: Stub, shortname: str, status: int, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while True:
        response = await stub.GetAdapter(pb.GetAdapterRequest(shortname=shortname), timeout=5)
        if response.adapter.serving_status == status:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not {status} within {within} s: {response.adapter}")
        await asyncio.sleep(0.05)


async def test_a_remote_that_comes_back_with_the_stream_rpc_is_asked_again(
    negotiator: RunningNegotiator, stub: Stub, tmp_path_factory: pytest.TempPathFactory
) -> None:
    listen = f"unix:{tmp_path_factory.mktemp('restart') / 'adapter.sock'}"
    old = ExampleProcess(listen, "restarted", "--log-rpcs", "--stream", "--no-stream-rpc")
    try:
        await register(stub, old, "restarted")
        messages = [m async for m in invoke_stream(stub, "restarted", "hi")]
        assert kinds(messages) == ["decision", "final"]
        assert [next_call(old) for _ in range(2)] == ["InvokeStream", "Invoke"]
    finally:
        old.stop()
    await serving_status(stub, "restarted", pb.ADAPTER_SERVING_STATUS_NOT_SERVING)
    # Another build at the same address, with the same declaration: connected to again, it is asked again.
    new = ExampleProcess(listen, "restarted", "--log-rpcs", "--stream")
    try:
        await serving_status(stub, "restarted", pb.ADAPTER_SERVING_STATUS_SERVING)
        messages = [m async for m in invoke_stream(stub, "restarted", "hi")]
        assert kinds(messages) == ["decision", "delta", "delta", "final"]
        assert messages[-1].final.text == "remote:hi"
        assert next_call(new) == "InvokeStream"
    finally:
        new.stop()
