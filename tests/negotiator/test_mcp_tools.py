"""The negotiator's MCP client against real MCP servers, with the mock model calling their tools.

A real negotiator serves an `openai` adapter pointed at the mock; the MCP
servers are the FastMCP server of mcp_test_server.py (over stdio as a
profile's server, and over streamable HTTP as a caller-supplied one) and
@modelcontextprotocol/server-everything from npm (tests/peers/node) over
stdio and SSE. Every FastMCP tool that runs writes a journal line, so the
tests see what really reached the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from mock_openai import MockOpenAI
from negotiator_testkit import call_error
from test_tools import Caller, Stub, tool

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from tests.procs import start_process, stop_process

KEY_ENV = "NEGOTIATOR_TEST_MCP_KEY"
HERE = Path(__file__).parent
SERVER = HERE / "mcp_test_server.py"
PEERS = HERE.parent / "peers" / "node"
EVERYTHING = PEERS / "node_modules" / ".bin" / "mcp-server-everything"


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    with MockOpenAI() as server:
        yield server


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return tmp_path / "journal.jsonl"


def journaled(journal: Path) -> list[str]:
    """The tools that ran on the FastMCP server, in order."""
    if not journal.exists():
        return []
    return [json.loads(line)["tool"] for line in journal.read_text().splitlines()]


def stdio_server(name: str, journal: Path, extra: str = "", args: str = "") -> str:
    return (
        f"      - name: {name}\n"
        "        transport: stdio\n"
        f"        command: {sys.executable}\n"
        f"        args: [{SERVER}, --journal, {journal}{args}]\n"
        f"{extra}"
    )


@pytest.fixture
def config_file(tmp_path: Path, mock: MockOpenAI, journal: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(KEY_ENV, "sk-test-mcp")
    everything = f"command: node\n        args: [{EVERYTHING}, stdio]\n"
    text = (
        "adapters:\n"
        "  - shortname: llm\n"
        "    implementation: openai\n"
        f"    options: {{base_url: '{mock.base_url}', api_key_env: {KEY_ENV}, model: mock-model-1}}\n"
        "profiles:\n"
        "  local:\n"
        "    mcp_servers:\n" + stdio_server("t", journal, args=", --page-size, '2'") + "  trusting:\n"
        "    mcp_servers:\n"
        + stdio_server("t", journal, extra="        preapproved: [write_note]\n")
        + "  regex:\n"
        "    mcp_servers:\n" + stdio_server("t", journal, args=", --regex-tools") + "  everything:\n"
        "    mcp_servers:\n"
        f"      - name: everything\n        transport: stdio\n        {everything}"
        "  broken:\n"
        "    mcp_servers:\n"
        "      - {name: gone, transport: stdio, command: /nonexistent/mcp-server}\n"
        "mcp:\n"
        "  caller_hosts: [127.0.0.1]\n"
    )
    path = tmp_path / "negotiator.yaml"
    path.write_text(text)
    return path


def invoke(**options: Any) -> pb.InvokeRequest:
    return pb.InvokeRequest(adapter="llm", prompt="Use the tools.", options=pb.CallOptions(**options))


def offered(mock: MockOpenAI, index: int = 0) -> list[str]:
    """The function names the model was offered in request `index`."""
    return [t["function"]["name"] for t in mock.requests[index].body.get("tools", [])]


def tool_contents(mock: MockOpenAI) -> list[str]:
    return [str(m["content"]) for m in mock.tool_messages]


# --- plain Invoke: no ToolSession -------------------------------------------------------------


@pytest.mark.slow
async def test_a_read_only_mcp_tool_runs_in_plain_invoke(stub: Stub, mock: MockOpenAI, journal: Path) -> None:
    mock.tool_rounds = [[{"name": "t__lookup", "arguments": {"key": "k1"}}]]
    mock.reply_text = "K1 it is."
    response = await stub.Invoke(invoke(profile="local"), timeout=20)
    assert response.text == "K1 it is."
    # Listed over three pages of tools/list (page size 2), name-spaced by server.
    assert offered(mock) == ["t__lookup", "t__write_note", "t__drop_table", "t__explode", "t__grow"]
    assert journaled(journal) == ["lookup"]
    assert json.loads(tool_contents(mock)[0]) == {"key": "k1", "value": "K1"}


@pytest.mark.slow
async def test_a_mutating_mcp_tool_without_a_session_is_denied_audited_and_never_reaches_the_server(
    stub: Stub, mock: MockOpenAI, journal: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mock.tool_rounds = [
        [
            {"name": "t__write_note", "arguments": {"text": "hello"}},
            {"name": "t__drop_table", "arguments": {"name": "users"}},
        ]
    ]
    with caplog.at_level(logging.INFO, logger="agentsidecar.negotiator_service.mcp"):
        await stub.Invoke(invoke(profile="local"), timeout=20)
    contents = tool_contents(mock)
    assert contents[0].startswith(
        'denied: "t__write_note" is a mutating tool and this call has no ToolSession'
    )
    assert contents[1].startswith('denied: "t__drop_table" is a sensitive tool')
    assert journaled(journal) == []
    records = [
        json.loads(r.getMessage()) for r in caplog.records if r.name == "agentsidecar.negotiator_service.mcp"
    ]
    assert [(r["function"], r["decision"], r["risk"]) for r in records] == [
        ("t__write_note", "denied", "mutating"),
        ("t__drop_table", "denied", "sensitive"),
    ]


@pytest.mark.slow
async def test_a_tool_the_operator_preapproved_runs_without_a_session(
    stub: Stub, mock: MockOpenAI, journal: Path
) -> None:
    mock.tool_rounds = [
        [
            {"name": "t__write_note", "arguments": {"text": "hello"}},
            {"name": "t__drop_table", "arguments": {"name": "users"}},
        ]
    ]
    await stub.Invoke(invoke(profile="trusting"), timeout=20)
    assert journaled(journal) == ["write_note"]
    assert json.loads(tool_contents(mock)[0]) == {"result": "noted: hello"}
    assert tool_contents(mock)[1].startswith("denied:")


@pytest.mark.slow
async def test_a_filtered_mcp_tool_is_never_offered_and_never_runs(
    stub: Stub, mock: MockOpenAI, journal: Path
) -> None:
    mock.tool_rounds = [[{"name": "t__lookup", "arguments": {"key": "k"}}]]
    await stub.Invoke(invoke(profile="local", tool_filter=pb.ToolFilter(deny=["t__lookup"])), timeout=20)
    assert "t__lookup" not in offered(mock)
    assert "t__write_note" in offered(mock)
    assert tool_contents(mock) == ['error: there is no tool named "t__lookup" in this call']
    assert journaled(journal) == []


@pytest.mark.slow
async def test_a_tool_error_goes_back_to_the_model_and_the_call_goes_on(
    stub: Stub, mock: MockOpenAI, journal: Path
) -> None:
    mock.tool_rounds = [[{"name": "t__explode", "arguments": {}}]]
    mock.reply_text = "It failed."
    response = await stub.Invoke(invoke(profile="local"), timeout=20)
    assert response.text == "It failed."
    assert journaled(journal) == ["explode"]
    assert tool_contents(mock)[0].startswith("error: ")
    assert "the tool blew up" in tool_contents(mock)[0]


@pytest.mark.slow
async def test_mcp_tool_schemas_are_applied_as_ecma_262_patterns(
    stub: Stub, mock: MockOpenAI, journal: Path
) -> None:
    # A tool is offered only when the validator that checks its arguments can apply its
    # schema: \\p{L} (ECMA-262) is, \\Z (Python's alone) is not, and that tool is never offered.
    mock.tool_rounds = [
        [
            {"name": "t__letters", "arguments": {"word": "h\u00e9llo"}},
            {"name": "t__letters", "arguments": {"word": "h3llo"}},
            {"name": "t__python_only", "arguments": {"key": "a"}},
        ]
    ]
    mock.reply_text = "done"
    response = await stub.Invoke(invoke(profile="regex"), timeout=20)
    assert response.text == "done"
    assert "t__letters" in offered(mock)
    assert "t__python_only" not in offered(mock)
    assert journaled(journal) == ["letters"]
    ran, mismatched, missing = tool_contents(mock)
    assert json.loads(ran) == {"result": "h\u00e9llo"}
    assert mismatched.startswith('error: the arguments do not match the schema of "t__letters": /word: ')
    assert missing == 'error: there is no tool named "t__python_only" in this call'


@pytest.mark.slow
async def test_tools_list_changed_is_listed_again_before_the_next_round(
    stub: Stub, mock: MockOpenAI, journal: Path
) -> None:
    mock.tool_rounds = [
        [{"name": "t__grow", "arguments": {}}],
        [{"name": "t__extra", "arguments": {}}],
    ]
    await stub.Invoke(invoke(profile="local"), timeout=20)
    assert "t__extra" not in offered(mock, 0)
    assert "t__extra" in offered(mock, 1)
    assert journaled(journal) == ["grow", "extra"]


async def test_a_server_that_cannot_start_fails_the_call(stub: Stub, mock: MockOpenAI) -> None:
    error = await call_error(stub.Invoke(invoke(profile="broken"), timeout=20))
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert error.reason == "MCP_SERVER_UNAVAILABLE"
    assert (error.metadata["adapter"], error.metadata["server"]) == ("llm", "gone")
    assert "cannot start" in error.message
    assert mock.requests == []


@pytest.mark.slow
async def test_cancelling_the_call_stops_the_stdio_server(
    stub: Stub, mock: MockOpenAI, journal: Path
) -> None:
    mock.mode = "hang"
    call = stub.Invoke(invoke(profile="local"), timeout=60)
    # The model is asked only once the server has started and listed its tools.
    for _ in range(400):
        if mock.requests:
            break
        await asyncio.sleep(0.05)
    assert mock.requests, "the call never reached the model"
    pids = served(journal)
    assert len(pids) == 1
    assert _alive(pids[0])
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    for _ in range(100):
        if not _alive(pids[0]):
            break
        await asyncio.sleep(0.05)
    assert not _alive(pids[0]), "the MCP server outlived its call"


def served(journal: Path) -> list[int]:
    """The pids of the FastMCP servers started for this test."""
    pids = journal.parent / "pids.jsonl"
    return [json.loads(line)["pid"] for line in pids.read_text().splitlines()] if pids.exists() else []


def journaled_arguments(journal: Path) -> list[Any]:
    return [json.loads(line)["arguments"] for line in journal.read_text().splitlines()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for every purpose but its table entry.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    return False


# --- ToolSession: approvals by the caller ----------------------------------------------------


@pytest.mark.slow
async def test_a_mutating_mcp_tool_goes_through_an_approval_round_on_a_tool_session(
    stub: Stub, mock: MockOpenAI, journal: Path
) -> None:
    mock.tool_rounds = [
        [{"name": "t__lookup", "arguments": {"key": "a"}}],
        [{"name": "t__write_note", "arguments": {"text": "hello"}}],
        [{"name": "t__drop_table", "arguments": {"name": "users"}}],
        [{"name": "mine", "arguments": {"key": "b"}}],
    ]
    mock.reply_text = "done"
    caller = Caller(stub, timeout=20)
    await caller.start(invoke(profile="local"), [tool("mine", risk=pb.TOOL_RISK_READ_ONLY)])
    # lookup is read_only: it runs unasked. write_note is asked about, and edited.
    approval = await caller.receive("approval_request")
    assert (approval.tool_name, approval.risk, approval.adapter) == (
        "t__write_note",
        pb.TOOL_RISK_MUTATING,
        "llm",
    )
    assert dict(approval.metadata) == {"mcp_server": "t", "mcp_tool": "write_note"}
    await caller.decide(approval.call_id, pb.APPROVAL_DECISION_EDIT, edited=json.dumps({"text": "edited"}))
    sensitive = await caller.receive("approval_request")
    assert (sensitive.tool_name, sensitive.risk) == ("t__drop_table", pb.TOOL_RISK_SENSITIVE)
    await caller.decide(sensitive.call_id, pb.APPROVAL_DECISION_DENY, reason="not today")
    # The caller's own tool still comes to the caller, beside the MCP tools.
    mine = await caller.receive("tool_call")
    assert mine.name == "mine"
    await caller.result(mine.call_id, {"n": 1})
    assert await caller.final_text() == "done"
    assert offered(mock)[0] == "mine"
    assert journaled(journal) == ["lookup", "write_note"]
    assert journaled_arguments(journal)[1] == {"text": "edited"}
    assert tool_contents(mock)[2] == "denied: not today"


@pytest.mark.slow
async def test_a_session_without_caller_tools_still_asks_about_mcp_tools(
    stub: Stub, mock: MockOpenAI, journal: Path
) -> None:
    mock.tool_rounds = [[{"name": "t__write_note", "arguments": {"text": "x"}}]]
    caller = Caller(stub, timeout=20)
    await caller.start(invoke(profile="local"))
    approval = await caller.receive("approval_request")
    await caller.decide(approval.call_id, pb.APPROVAL_DECISION_ALLOW)
    await caller.final_text()
    assert journaled(journal) == ["write_note"]


@pytest.mark.slow
async def test_a_session_filter_may_name_an_mcp_tool(stub: Stub, mock: MockOpenAI, journal: Path) -> None:
    mock.tool_rounds = [[{"name": "t__lookup", "arguments": {"key": "k"}}]]
    caller = Caller(stub, timeout=20)
    await caller.start(
        invoke(profile="local", tool_filter=pb.ToolFilter(allow=["t__lookup", "mine"])),
        [tool("mine", risk=pb.TOOL_RISK_READ_ONLY)],
    )
    await caller.final_text()
    assert offered(mock) == ["mine", "t__lookup"]
    assert journaled(journal) == ["lookup"]


# --- the audit: every tool call of a brokered call ---------------------------------------------

Watch = Any  # grpc.aio.UnaryStreamCall[pb.WatchAuditRequest, pb.WatchAuditResponse]


async def start_watch(stub: Stub) -> Watch:
    """A WatchAudit stream that is registered: every later decision reaches it."""
    watch = stub.WatchAudit(pb.WatchAuditRequest())
    await asyncio.wait_for(watch.initial_metadata(), 5)
    return watch


async def next_record(watch: Watch) -> pb.AuditRecord:
    response = await asyncio.wait_for(watch.read(), 10)
    assert isinstance(response, pb.WatchAuditResponse), "the audit stream ended"
    return response.record


def tool_calls(record: pb.AuditRecord) -> list[tuple[str, str, str, str, str, int]]:
    """(function, server, tool, decision, approval, risk) of each tool call the record holds."""
    return [(c.function, c.server, c.tool, c.decision, c.approval, c.risk) for c in record.tool_calls]


async def test_every_mcp_tool_call_of_a_plain_invoke_is_in_its_audit_record(
    stub: Stub, mock: MockOpenAI, journal: Path
) -> None:
    mock.tool_rounds = [
        [
            {"name": "t__lookup", "arguments": {"key": "k1"}},
            {"name": "t__write_note", "arguments": {"text": "hello"}},
            {"name": "t__drop_table", "arguments": {"name": "users"}},
            {"name": "t__lookup", "arguments": {"wrong": 1}},
            {"name": "t__explode", "arguments": {}},
            {"name": "nothing", "arguments": {}},
        ]
    ]
    watch = await start_watch(stub)
    try:
        await stub.Invoke(
            invoke(profile="local", tool_filter=pb.ToolFilter(deny=["t__drop_table"])), timeout=20
        )
        record = await next_record(watch)
    finally:
        watch.cancel()
    assert (record.operation, record.outcome) == ("invoke", "succeeded")
    read_only, mutating, sensitive = pb.TOOL_RISK_READ_ONLY, pb.TOOL_RISK_MUTATING, pb.TOOL_RISK_SENSITIVE
    assert tool_calls(record) == [
        ("t__lookup", "t", "lookup", "ran", "not_required", read_only),
        ("t__write_note", "t", "write_note", "denied", "no_channel", mutating),
        ("t__drop_table", "t", "drop_table", "filtered", "", sensitive),
        ("t__lookup", "t", "lookup", "invalid_arguments", "", read_only),
        ("t__explode", "t", "explode", "ran", "not_required", read_only),
        ("nothing", "", "", "filtered", "", pb.TOOL_RISK_UNSPECIFIED),
    ]
    errors = [c.error for c in record.tool_calls]
    assert errors[0] == ""
    assert errors[1].startswith('"t__write_note" is a mutating tool and this call has no ToolSession')
    assert "the tool blew up" in errors[4]
    assert all(c.HasField("duration") for c in record.tool_calls)
    # Only the tools that ran reached the server.
    assert journaled(journal) == ["lookup", "explode"]


async def test_caller_and_mcp_tool_calls_of_a_tool_session_are_audited_in_order(
    stub: Stub, mock: MockOpenAI, journal: Path
) -> None:
    mock.tool_rounds = [
        [{"name": "t__write_note", "arguments": {"text": "hello"}}],
        [{"name": "mine", "arguments": {"key": "b"}}],
        [{"name": "t__drop_table", "arguments": {"name": "users"}}],
        [{"name": "guarded", "arguments": {"key": "c"}}],
    ]
    mock.reply_text = "done"
    watch = await start_watch(stub)
    try:
        caller = Caller(stub, timeout=20)
        await caller.start(
            invoke(profile="local"),
            [tool("mine", risk=pb.TOOL_RISK_READ_ONLY), tool("guarded", risk=pb.TOOL_RISK_SENSITIVE)],
        )
        approval = await caller.receive("approval_request")
        await caller.decide(approval.call_id, pb.APPROVAL_DECISION_EDIT, edited=json.dumps({"text": "e"}))
        mine = await caller.receive("tool_call")
        await caller.result(mine.call_id, {"n": 1})
        sensitive = await caller.receive("approval_request")
        await caller.decide(sensitive.call_id, pb.APPROVAL_DECISION_DENY, reason="not today")
        guarded = await caller.receive("approval_request")
        await caller.decide(guarded.call_id, pb.APPROVAL_DECISION_ALLOW)
        run = await caller.receive("tool_call")
        await caller.send(
            pb.ToolSessionRequest(tool_result=pb.ToolResult(call_id=run.call_id, error="disk full"))
        )
        assert await caller.final_text() == "done"
        record = await next_record(watch)
    finally:
        watch.cancel()
    assert (record.operation, record.outcome) == ("tool_session", "succeeded")
    assert tool_calls(record) == [
        ("t__write_note", "t", "write_note", "ran", "edited", pb.TOOL_RISK_MUTATING),
        ("mine", "", "mine", "ran", "not_required", pb.TOOL_RISK_READ_ONLY),
        ("t__drop_table", "t", "drop_table", "denied", "denied", pb.TOOL_RISK_SENSITIVE),
        ("guarded", "", "guarded", "ran", "allowed", pb.TOOL_RISK_SENSITIVE),
    ]
    assert [c.error for c in record.tool_calls] == ["", "", "not today", "disk full"]
    assert journaled(journal) == ["write_note"]


# --- caller-supplied servers ----------------------------------------------------------------


@pytest.fixture
def http_server(journal: Path) -> Iterator[str]:
    """mcp_test_server.py over streamable HTTP; its endpoint URL."""
    process, line = start_process([sys.executable, str(SERVER), "--journal", str(journal), "--http"])
    try:
        assert line.startswith("READY "), line
        yield f"http://127.0.0.1:{line.split()[1]}/mcp"
    finally:
        stop_process(process)


@pytest.mark.slow
async def test_a_caller_supplied_streamable_http_server_on_an_allowed_host(
    stub: Stub, mock: MockOpenAI, journal: Path, http_server: str
) -> None:
    mock.tool_rounds = [[{"name": "web__lookup", "arguments": {"key": "h"}}]]
    server = pb.McpServer(name="web", transport="streamable-http", url=http_server)
    await stub.Invoke(invoke(mcp_servers=[server]), timeout=20)
    assert journaled(journal) == ["lookup"]
    assert json.loads(tool_contents(mock)[0]) == {"key": "h", "value": "H"}


async def test_a_caller_supplied_stdio_server_is_refused_before_dispatch(
    stub: Stub, mock: MockOpenAI, journal: Path
) -> None:
    server = pb.McpServer(
        name="mine", transport="stdio", command=sys.executable, args=[str(SERVER), "--journal", str(journal)]
    )
    error = await call_error(stub.Invoke(invoke(mcp_servers=[server]), timeout=20))
    assert error.code is grpc.StatusCode.PERMISSION_DENIED
    assert error.reason == "MCP_SERVER_NOT_ALLOWED"
    assert dict(error.metadata) == {"server": "mine", "rule": "caller-stdio-command-allowlist"}
    assert mock.requests == []
    assert journaled(journal) == []
    assert served(journal) == []


async def test_negotiate_refuses_an_unadmitted_server_as_invoke_does(
    stub: Stub, mock: MockOpenAI, journal: Path
) -> None:
    stdio = pb.McpServer(name="mine", transport="stdio", command=sys.executable, args=[str(SERVER)])
    far = pb.McpServer(name="far", transport="sse", url="http://mcp.example:8000/sse")
    watch = await start_watch(stub)
    try:
        for server, rule in ((stdio, "caller-stdio-command-allowlist"), (far, "caller-host-allowlist")):
            # Behind a profile's own (admitted) stdio server: the request's server is index 0.
            call = invoke(profile="local", mcp_servers=[server])
            dry = await call_error(stub.Negotiate(pb.NegotiateRequest(invoke=call), timeout=20))
            real = await call_error(stub.Invoke(call, timeout=20))
            for error in (dry, real):
                assert error.code is grpc.StatusCode.PERMISSION_DENIED
                assert error.reason == "MCP_SERVER_NOT_ALLOWED"
                assert dict(error.metadata) == {"server": server.name, "rule": rule}
            assert "invoke.options.mcp_servers[0]: " in dry.message
            assert "options.mcp_servers[0]: " in real.message
            records = [await next_record(watch), await next_record(watch)]
            assert [(r.operation, r.outcome, r.error_reason) for r in records] == [
                ("negotiate", "refused", "MCP_SERVER_NOT_ALLOWED"),
                ("invoke", "refused", "MCP_SERVER_NOT_ALLOWED"),
            ]
    finally:
        watch.cancel()
    assert mock.requests == []
    assert served(journal) == []


async def test_negotiate_judges_gaps_before_the_mcp_admission(stub: Stub) -> None:
    far = pb.McpServer(name="far", transport="sse", url="http://mcp.example:8000/sse")
    call = invoke(mcp_servers=[far], requires=["hooks"])
    response = await stub.Negotiate(pb.NegotiateRequest(invoke=call), timeout=20)
    assert not response.decision.accepted
    error = await call_error(stub.Invoke(call, timeout=20))
    assert error.reason == "UNSUPPORTED_CAPABILITY"


async def test_a_caller_supplied_http_server_on_another_host_is_refused(stub: Stub, mock: MockOpenAI) -> None:
    server = pb.McpServer(name="far", transport="sse", url="http://mcp.example:8000/sse")
    error = await call_error(stub.Invoke(invoke(mcp_servers=[server]), timeout=20))
    assert error.code is grpc.StatusCode.PERMISSION_DENIED
    assert dict(error.metadata) == {"server": "far", "rule": "caller-host-allowlist"}
    assert '"mcp.example"' in error.message
    assert mock.requests == []


# --- @modelcontextprotocol/server-everything (npm) ----------------------------------------------


@pytest.fixture
def everything() -> Path:
    if not EVERYTHING.exists():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed, so @modelcontextprotocol/server-everything cannot be")
        pytest.fail(f"{EVERYTHING} is missing: run `npm ci` in {PEERS} (scripts/test.sh does)")
    return EVERYTHING


@pytest.mark.slow
async def test_server_everything_over_stdio(stub: Stub, mock: MockOpenAI, everything: Path) -> None:
    mock.tool_rounds = [[{"name": "everything__echo", "arguments": {"message": "hi there"}}]]
    await stub.Invoke(invoke(profile="everything"), timeout=30)
    assert "everything__get-sum" in offered(mock)
    assert tool_contents(mock) == [json.dumps("Echo: hi there")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def everything_sse(everything: Path) -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen(
        ["node", str(everything), "sse"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as probe, contextlib.suppress(OSError):
                probe.connect(("127.0.0.1", port))
                break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/sse"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.slow
async def test_server_everything_over_sse(stub: Stub, mock: MockOpenAI, everything_sse: str) -> None:
    mock.tool_rounds = [[{"name": "ev__get-sum", "arguments": {"a": 2, "b": 3}}]]
    server = pb.McpServer(name="ev", transport="sse", url=everything_sse)
    await stub.Invoke(invoke(mcp_servers=[server]), timeout=30)
    assert "5" in tool_contents(mock)[0]
