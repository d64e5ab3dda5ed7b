"""The command harness streamed through a real negotiator: stdout lines and JSON-lines events as they come."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeAlias

import grpc
import pytest
from negotiator_testkit import call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.model import AdapterSpec
from agentsidecar.negotiator_service.registry import RegisteredAdapter
from agentsidecar.negotiator_service.server import RunningNegotiator

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"

# Prints `count` lines 200 ms apart, each with the monotonic time it was written (one clock for
# every process of the host); with --json, claude-code stream-json records instead. It first
# starts a sleeping child and writes both pids, so a test can see the whole tree stopped.
SCRIPT = r"""
import json, os, subprocess, sys, time
pidfile, count = sys.argv[1], int(sys.argv[2])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(pidfile, "w") as handle:
    handle.write(f"{os.getpid()} {child.pid}")
records = [
    {"type": "system", "subtype": "init", "session_id": "s-1"},
    {"type": "assistant", "message": {"content": [{"type": "text", "text": "working"}]}},
    {"type": "result", "result": "all done"},
]
for n in range(count):
    if n:
        time.sleep(0.2)
    if "--json" in sys.argv:
        print(json.dumps({**records[min(n, 2)], "at": time.monotonic()}), flush=True)
    else:
        print(f"line {n} at {time.monotonic()}", flush=True)
child.kill()
"""


def register(negotiator: RunningNegotiator, tmp_path: Path, count: int) -> Path:
    script = tmp_path / "lines.py"
    script.write_text(SCRIPT)
    pidfile = tmp_path / "pids"
    spec = AdapterSpec(
        shortname="lines",
        implementation="command",
        options=MappingProxyType(
            {
                "argv": [sys.executable, str(script), str(pidfile), str(count)],
                "timeout_seconds": 30,
                "map": {"events": {"argv": ["--json"], "otherwise": [], "format": "claude-code"}},
            }
        ),
    )
    negotiator.registry.add(RegisteredAdapter(adapter=build_adapter(spec), source="config"))
    return pidfile


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
async def test_each_stdout_line_is_a_delta_as_it_is_written(
    negotiator: RunningNegotiator, stub: Stub, tmp_path: Path
) -> None:
    register(negotiator, tmp_path, 3)
    arrivals: list[tuple[float, Any]] = []
    async for message in stub.InvokeStream(
        pb.InvokeStreamRequest(invoke=pb.InvokeRequest(agent="lines", prompt="go"))
    ):
        arrivals.append((time.monotonic(), message))
    kinds = [m.WhichOneof("kind") for _, m in arrivals]
    assert kinds == ["decision", "delta", "delta", "delta", "final"]
    for received, message in arrivals[1:4]:
        written = float(message.delta.split(" at ")[1])
        assert received - written < 0.1
    final = arrivals[-1][1].final.text
    assert final == "".join(m.delta for _, m in arrivals[1:4])
    assert final.count("\n") == 3


@pytest.mark.slow
async def test_json_lines_become_events_as_they_are_written(
    negotiator: RunningNegotiator, stub: Stub, tmp_path: Path
) -> None:
    register(negotiator, tmp_path, 3)
    request = pb.InvokeRequest(agent="lines", prompt="go", options=pb.CallOptions(stream_events=True))
    arrivals: list[tuple[float, Any]] = []
    async for message in stub.InvokeStream(pb.InvokeStreamRequest(invoke=request)):
        arrivals.append((time.monotonic(), message))
    kinds = [m.WhichOneof("kind") for _, m in arrivals]
    assert kinds == ["decision", "event", "event", "final"]
    assert [(m.event.type, m.event.text) for _, m in arrivals[1:3]] == [
        ("session", "s-1"),
        ("message", "working"),
    ]
    assert arrivals[-1][1].final.text == "all done"
    # The second record is written 200 ms after the first; its event arrives well before the third.
    assert arrivals[2][0] - arrivals[1][0] > 0.15
    assert arrivals[3][0] - arrivals[2][0] > 0.15


@pytest.mark.slow
async def test_cancelling_the_stream_stops_the_whole_process_tree(
    negotiator: RunningNegotiator, stub: Stub, tmp_path: Path
) -> None:
    pidfile = register(negotiator, tmp_path, 100)
    call = stub.InvokeStream(pb.InvokeStreamRequest(invoke=pb.InvokeRequest(agent="lines", prompt="go")))
    async for message in call:
        if message.WhichOneof("kind") == "delta":
            break
    pids = [int(pid) for pid in pidfile.read_text().split()]
    assert all(alive(pid) for pid in pids)
    call.cancel()
    for _ in range(100):
        if not any(alive(pid) for pid in pids):
            break
        await asyncio.sleep(0.02)
    assert not any(alive(pid) for pid in pids), "the command or its child outlived the cancelled stream"


async def test_a_failing_command_is_the_streams_error_after_its_lines(
    negotiator: RunningNegotiator, stub: Stub, tmp_path: Path
) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import sys\nprint('partial', flush=True)\nsys.stderr.write('boom')\nsys.exit(3)\n")
    spec = AdapterSpec(
        shortname="fails",
        implementation="command",
        options=MappingProxyType({"argv": [sys.executable, str(script)]}),
    )
    negotiator.registry.add(RegisteredAdapter(adapter=build_adapter(spec), source="config"))
    received: list[str] = []

    async def read() -> None:
        async for message in stub.InvokeStream(
            pb.InvokeStreamRequest(invoke=pb.InvokeRequest(agent="fails", prompt="go"))
        ):
            received.append(str(message.WhichOneof("kind")))

    error = await call_error(read())
    assert (error.code, error.reason) == (grpc.StatusCode.INTERNAL, "ADAPTER_INTERNAL")
    assert "exited with 3: boom" in error.message
    assert received == ["decision", "delta"]
