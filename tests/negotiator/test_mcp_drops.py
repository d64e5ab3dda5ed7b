"""MCP servers that go away: the call fails UNAVAILABLE naming the server, never INTERNAL, never hangs.

A real negotiator serves an `openai` adapter pointed at the mock model; the
MCP server is mcp_drop_server.py (FastMCP over streamable HTTP, its own
process), which the tests SIGKILL at a moment it marks: while a tools/call
runs, between two tool calls, while the client closes the session; and
@modelcontextprotocol/server-everything over streamable HTTP, killed during
its long-running tool. The SDK's streamable-HTTP client runs in anyio task
groups, which wrap what leaves them in exception groups; these tests see the
status the caller gets.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from mock_openai import MockOpenAI
from negotiator_testkit import call_error
from test_tools import Caller, Stub, tool

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator_service.mcp_tools import CLOSE_TIMEOUT_SECONDS
from tests.procs import start_process, stop_process

KEY_ENV = "NEGOTIATOR_TEST_MCP_DROP_KEY"
HERE = Path(__file__).parent
DROP_SERVER = HERE / "mcp_drop_server.py"
STDIO_SERVER = HERE / "mcp_test_server.py"
PEERS = HERE.parent / "peers" / "node"
EVERYTHING = PEERS / "node_modules" / ".bin" / "mcp-server-everything"


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    with MockOpenAI() as server:
        yield server


@pytest.fixture
def config_file(tmp_path: Path, mock: MockOpenAI, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(KEY_ENV, "sk-test-mcp-drop")
    path = tmp_path / "negotiator.yaml"
    path.write_text(
        "adapters:\n"
        "  - shortname: llm\n"
        "    implementation: openai\n"
        f"    options: {{base_url: '{mock.base_url}', api_key_env: {KEY_ENV}, model: mock-model-1}}\n"
        "profiles:\n"
        "  local:\n"
        "    mcp_servers:\n"
        "      - name: t\n"
        "        transport: stdio\n"
        f"        command: {sys.executable}\n"
        f"        args: [{STDIO_SERVER}, --journal, {tmp_path / 'journal.jsonl'}]\n"
        "mcp:\n"
        "  caller_hosts: [127.0.0.1]\n"
    )
    return path


class DropServer:
    """mcp_drop_server.py in its own process: its endpoint, and the moments it marks."""

    def __init__(self, marks: Path, flags: list[str]) -> None:
        self.marks = marks
        self.process, line = start_process([sys.executable, str(DROP_SERVER), "--marks", str(marks), *flags])
        assert line.startswith("READY "), line
        self.url = f"http://127.0.0.1:{line.split()[1]}/mcp"

    def mcp_server(self) -> pb.McpServer:
        return pb.McpServer(name="web", transport="streamable-http", url=self.url)

    async def wait_for_mark(self, name: str, seconds: float = 15.0) -> None:
        deadline = time.monotonic() + seconds
        while not (self.marks / name).exists():
            assert time.monotonic() < deadline, f"the server never marked {name!r}"
            await asyncio.sleep(0.02)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=5)


@pytest.fixture
def drop_server(tmp_path: Path) -> Iterator[Callable[..., DropServer]]:
    started: list[DropServer] = []

    def start(*flags: str) -> DropServer:
        marks = tmp_path / f"marks-{len(started)}"
        marks.mkdir()
        server = DropServer(marks, list(flags))
        started.append(server)
        return server

    yield start
    for server in started:
        # Killed, not stopped: a server holding a DELETE open would make uvicorn wait for it.
        if server.process.poll() is None:
            server.kill()
        stop_process(server.process)


def invoke(**options: Any) -> pb.InvokeRequest:
    return pb.InvokeRequest(adapter="llm", prompt="Use the tools.", options=pb.CallOptions(**options))


def tool_contents(mock: MockOpenAI) -> list[str]:
    return [str(m["content"]) for m in mock.tool_messages]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def start_watch(stub: Stub) -> Any:
    watch = stub.WatchAudit(pb.WatchAuditRequest())
    await asyncio.wait_for(watch.initial_metadata(), 5)
    return watch


async def next_record(watch: Any, seconds: float) -> pb.AuditRecord:
    response = await asyncio.wait_for(watch.read(), seconds)
    assert isinstance(response, pb.WatchAuditResponse), "the audit stream ended"
    return response.record


# --- a server that is not there ------------------------------------------------------------------


async def test_a_streamable_http_server_nobody_listens_on_fails_the_call_unavailable(
    stub: Stub, mock: MockOpenAI
) -> None:
    server = pb.McpServer(
        name="web", transport="streamable-http", url=f"http://127.0.0.1:{_closed_port()}/mcp"
    )
    error = await call_error(stub.Invoke(invoke(mcp_servers=[server]), timeout=20))
    assert error.code is grpc.StatusCode.UNAVAILABLE, error.message
    assert error.reason == "MCP_SERVER_UNAVAILABLE"
    assert (error.metadata["adapter"], error.metadata["server"]) == ("llm", "web")
    assert 'MCP server "web": cannot start: ConnectError' in error.message
    assert mock.requests == []


# --- killed mid-call, between calls, while closing -----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "cause"),
    [
        # The reply is an SSE stream, cut off: the SDK drops it and would leave tools/call unanswered.
        ((), 'the connection broke during tools/call "hang": RemoteProtocolError'),
        # The reply is one JSON body that never comes: the SDK's request task fails its task group.
        (("--json-response",), "the connection broke"),
    ],
    ids=["sse-reply", "json-reply"],
)
async def test_a_server_killed_during_a_tool_call_fails_the_call_unavailable_at_once(
    stub: Stub,
    mock: MockOpenAI,
    drop_server: Callable[..., DropServer],
    flags: tuple[str, ...],
    cause: str,
) -> None:
    server = drop_server(*flags)
    mock.tool_rounds = [[{"name": "web__hang", "arguments": {}}]]
    call = stub.Invoke(invoke(mcp_servers=[server.mcp_server()]), timeout=30)
    await server.wait_for_mark("hang")
    server.kill()
    killed = time.monotonic()
    error = await call_error(call)
    assert error.code is grpc.StatusCode.UNAVAILABLE, error.message
    assert error.reason == "MCP_SERVER_UNAVAILABLE"
    assert (error.metadata["adapter"], error.metadata["server"]) == ("llm", "web")
    assert f'MCP server "web": {cause}' in error.message
    # Not the call's deadline: the break ends the wait.
    assert time.monotonic() - killed < 10
    # The model was asked once, for the tool call; nothing went back to it.
    assert len(mock.requests) == 1


@pytest.mark.slow
async def test_a_server_killed_between_two_tool_calls_fails_the_call_unavailable(
    stub: Stub, mock: MockOpenAI, drop_server: Callable[..., DropServer]
) -> None:
    server = drop_server()
    mock.tool_rounds = [
        [{"name": "web__echo", "arguments": {"text": "first"}}],
        [{"name": "mine", "arguments": {"key": "k"}}],
        [{"name": "web__echo", "arguments": {"text": "second"}}],
    ]
    caller = Caller(stub, timeout=30)
    await caller.start(invoke(mcp_servers=[server.mcp_server()]), [tool("mine")])
    # The caller's own tool is the pause between the two MCP calls: the server dies in it.
    mine = await caller.receive("tool_call")
    server.kill()
    await caller.result(mine.call_id, {"n": 1})
    error = await caller.error()
    assert error.code is grpc.StatusCode.UNAVAILABLE, error.message
    assert error.reason == "MCP_SERVER_UNAVAILABLE"
    assert error.metadata["server"] == "web"
    assert 'MCP server "web": the connection broke' in error.message
    assert json.loads(tool_contents(mock)[0]) == {"result": "first"}


@pytest.mark.slow
async def test_a_server_killed_while_the_call_closes_its_session_leaves_the_answer_alone(
    stub: Stub, mock: MockOpenAI, drop_server: Callable[..., DropServer]
) -> None:
    server = drop_server("--stall-delete")
    mock.tool_rounds = [[{"name": "web__echo", "arguments": {"text": "hi"}}]]
    mock.reply_text = "It echoed."
    call = stub.Invoke(invoke(mcp_servers=[server.mcp_server()]), timeout=30)
    await server.wait_for_mark("delete")
    server.kill()
    response = await call
    assert response.text == "It echoed."
    assert json.loads(tool_contents(mock)[0]) == {"result": "hi"}


@pytest.mark.slow
async def test_a_server_that_never_answers_the_close_holds_the_call_only_for_the_close_timeout(
    stub: Stub, mock: MockOpenAI, drop_server: Callable[..., DropServer]
) -> None:
    server = drop_server("--stall-delete")
    mock.tool_rounds = [[{"name": "web__echo", "arguments": {"text": "hi"}}]]
    mock.reply_text = "It echoed."
    started = time.monotonic()
    response = await stub.Invoke(invoke(mcp_servers=[server.mcp_server()]), timeout=30)
    assert response.text == "It echoed."
    assert (server.marks / "delete").exists()
    assert time.monotonic() - started < CLOSE_TIMEOUT_SECONDS + 8


# --- the call's own errors and cancellation go through as they were ------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
async def test_a_model_error_in_a_call_with_an_mcp_server_keeps_its_own_status(
    stub: Stub, mock: MockOpenAI, drop_server: Callable[..., DropServer], transport: str
) -> None:
    mock.mode = "429"
    request = (
        invoke(profile="local") if transport == "stdio" else invoke(mcp_servers=[drop_server().mcp_server()])
    )
    error = await call_error(stub.Invoke(request, timeout=30))
    # The rate limit of the model, not the task group that wrapped it on the way out.
    assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED, error.message
    assert error.reason == "ADAPTER_RATE_LIMITED"
    assert len(mock.requests) == 1


@pytest.mark.slow
async def test_a_caller_that_cancels_during_a_tool_call_ends_the_call_as_cancelled(
    stub: Stub, mock: MockOpenAI, drop_server: Callable[..., DropServer]
) -> None:
    # The server also never answers the close: the cancelled call still ends within its timeout.
    server = drop_server("--stall-delete")
    mock.tool_rounds = [[{"name": "web__hang", "arguments": {}}]]
    watch = await start_watch(stub)
    try:
        call = stub.Invoke(invoke(mcp_servers=[server.mcp_server()]), timeout=30)
        await server.wait_for_mark("hang")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        record = await next_record(watch, CLOSE_TIMEOUT_SECONDS + 8)
    finally:
        watch.cancel()
    assert (record.operation, record.outcome, record.error_reason) == ("invoke", "failed", "CANCELLED")
    assert (server.marks / "delete").exists()
    assert server.process.poll() is None, "the server died; only the call was to end"


# --- @modelcontextprotocol/server-everything (npm) over streamable HTTP ----------------------------


@pytest.fixture
def everything_http() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    if not EVERYTHING.exists():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed, so @modelcontextprotocol/server-everything cannot be")
        pytest.fail(f"{EVERYTHING} is missing: run `npm ci` in {PEERS} (scripts/test.sh does)")
    port = _closed_port()
    process = subprocess.Popen(
        ["node", str(EVERYTHING), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert time.monotonic() < deadline, "server-everything never listened"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.mark.slow
async def test_server_everything_killed_during_its_long_running_tool_fails_the_call_unavailable(
    stub: Stub, mock: MockOpenAI, everything_http: tuple[str, subprocess.Popen[bytes]]
) -> None:
    url, process = everything_http
    operation = {"name": "ev__trigger-long-running-operation", "arguments": {"duration": 20, "steps": 20}}
    mock.tool_rounds = [[operation]]
    server = pb.McpServer(name="ev", transport="streamable-http", url=url)
    call = stub.Invoke(invoke(mcp_servers=[server]), timeout=60)
    # The model is asked once the server has listed its tools; the 20 s operation starts then.
    deadline = time.monotonic() + 20
    while not mock.requests:
        assert time.monotonic() < deadline, "the call never reached the model"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    process.kill()
    killed = time.monotonic()
    error = await call_error(call)
    assert error.code is grpc.StatusCode.UNAVAILABLE, error.message
    assert error.reason == "MCP_SERVER_UNAVAILABLE"
    assert error.metadata["server"] == "ev"
    assert 'MCP server "ev": the connection broke' in error.message
    assert time.monotonic() - killed < 10
