"""examples/remote_adapter.py as its own process, registered with a real negotiator and streamed."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import pytest
from negotiator_testkit import REPO, call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.server import RunningNegotiator
from tests.procs import start_process, stop_process

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
EXAMPLE = REPO / "examples" / "remote_adapter.py"


@pytest.fixture
def example(socket_dir: Path) -> Iterator[str]:
    target = f"unix:{socket_dir / 'example.sock'}"
    process, _ = start_process([sys.executable, str(EXAMPLE), "--listen", target, "--shortname", "echo"])
    try:
        yield target
    finally:
        stop_process(process)


def kinds(messages: list[Any]) -> list[str]:
    return [str(m.WhichOneof("kind")) for m in messages]


async def test_the_example_streams_its_reply_word_by_word(
    negotiator: RunningNegotiator, stub: Stub, example: str
) -> None:
    await stub.RegisterAdapter(pb.RegisterAdapterRequest(target=example, shortname="echo"), timeout=10)
    request = pb.InvokeRequest(
        adapter="echo", prompt="hello world", options=pb.CallOptions(stream_events=True)
    )
    arrivals = [
        (time.monotonic(), m)
        async for m in stub.InvokeStream(pb.InvokeStreamRequest(invoke=request), timeout=10)
    ]
    messages = [m for _, m in arrivals]
    assert kinds(messages) == ["decision", "event", "delta", "delta", "delta", "final"]
    assert messages[1].event.type == "started"
    assert [m.delta for m in messages[2:5]] == ["echo: ", "hello ", "world "]
    assert messages[-1].final.text == "echo: hello world "
    # Streamed as made, not all at the end: the example takes 50 ms per word.
    assert arrivals[4][0] - arrivals[2][0] > 0.08

    unary = await stub.Invoke(pb.InvokeRequest(adapter="echo", prompt="hi"), timeout=10)
    assert unary.text == "echo: hi "
    produced = await stub.Produce(
        pb.ProduceRequest(
            adapter="echo", prompt="q", output_schema='{"type": "object", "required": ["echo"]}'
        ),
        timeout=10,
    )
    assert json.loads(produced.output_json) == {"echo": "q"}
    # What it declares unsupported is refused before it is reached.
    refused = await call_error(
        stub.Invoke(pb.InvokeRequest(adapter="echo", prompt="x", options=pb.CallOptions(persona="p")))
    )
    assert (refused.code, refused.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UNSUPPORTED_CAPABILITY")
