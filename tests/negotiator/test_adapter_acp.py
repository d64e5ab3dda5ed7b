"""The acp adapter against a fake ACP agent (tests/negotiator/fake_acp_agent.py, the SDK's agent side).

A real negotiator on a real socket builds the adapter from its config, which starts the agent to
read its declaration; every call starts the agent again as a real, contained process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeAlias

import grpc
import pytest
import yaml
from negotiator_testkit import call_error

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters.acp import AcpAdapter
from agentsidecar.negotiator_service.model import AdapterSpec, Capability, CapabilityState

FAKE_AGENT = Path(__file__).with_name("fake_acp_agent.py")
Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
STATE_NAMES = {
    common_pb2.CAPABILITY_STATE_SUPPORTED: "supported",
    common_pb2.CAPABILITY_STATE_UNSUPPORTED: "unsupported",
    common_pb2.CAPABILITY_STATE_UNKNOWN: "unknown",
}
EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # grpc-stubs do not know it
PERMISSION_SCHEMA = json.dumps({"type": "object"})
# The capped-acp adapter's max_line_bytes: above the agent's reader buffer (64 KiB), so a line
# longer than the buffer but within the cap is joined from pieces.
MAX_LINE = 200_000


@pytest.fixture
def agent_files(tmp_path: Path) -> dict[str, Path]:
    return {"log": tmp_path / "agent-log.jsonl", "sessions": tmp_path / "agent-sessions.json"}


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    (root / "project").mkdir(parents=True)
    return root


def acp_entry(shortname: str, env: dict[str, str], **options: Any) -> dict[str, Any]:
    return {
        "shortname": shortname,
        "implementation": "acp",
        "options": {"argv": [sys.executable, str(FAKE_AGENT)], "env": env, **options},
    }


@pytest.fixture
def config_file(tmp_path: Path, agent_files: dict[str, Path], roots: Path) -> Path:
    env = {"FAKE_ACP_LOG": str(agent_files["log"]), "FAKE_ACP_SESSIONS": str(agent_files["sessions"])}
    config = {
        # The agent launches the MCP servers a call names: the operator admits their commands.
        "mcp": {"caller_stdio_commands": ["mcp-files"]},
        "adapters": [
            acp_entry("fake-acp", env, cwd_roots=[str(roots)], timeout_seconds=20, client_fs="read"),
            acp_entry("capped-acp", env, timeout_seconds=20, max_line_bytes=MAX_LINE),
        ],
    }
    path = tmp_path / "negotiator.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def logged(agent_files: dict[str, Path], method: str | None = None) -> list[dict[str, Any]]:
    path = agent_files["log"]
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    return [entry["params"] for entry in entries if method is None or entry["method"] == method]


async def wait_logged(agent_files: dict[str, Path], method: str, count: int = 1) -> list[dict[str, Any]]:
    for _ in range(200):
        found = logged(agent_files, method)
        if len(found) >= count:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"the agent never logged {method}: {logged(agent_files)}")


def invoke(prompt: str, agent: str = "fake-acp", **options: Any) -> pb.InvokeRequest:
    return pb.InvokeRequest(agent=agent, prompt=prompt, options=pb.CallOptions(**options))


def states(declaration: common_pb2.Declaration) -> dict[str, str]:
    return {
        common_pb2.Capability.Name(entry.capability).removeprefix("CAPABILITY_").lower(): STATE_NAMES[
            entry.state
        ]
        for entry in declaration.capabilities
    }


@pytest.mark.slow
async def test_the_declaration_is_the_agents_initialize_answer(stub: Stub) -> None:
    response = await stub.GetAdapter(pb.GetAdapterRequest(shortname="fake-acp"))
    assert response.adapter.implementation == "acp"
    declaration = response.adapter.declaration
    assert declaration.kind == common_pb2.ADAPTER_KIND_AGENT_HARNESS
    found = states(declaration)
    # mcpCapabilities {http: true, sse: false}; stdio is always part of ACP.
    assert found["mcp"] == "supported"
    assert sorted(declaration.mcp_transports) == ["http", "stdio"]
    # loadSession / sessionCapabilities.resume; session/update; model, thought_level, modes.
    for name in ("stateful_history", "stream_events", "model_override", "effort", "profile_override"):
        assert found[name] == "supported", name
    assert found["native_approval_handler"] == "supported"
    # ACP has no output schema; nothing here carries a depth limit, a tool filter or a persona.
    for name in ("structured_output", "tool_filter", "depth_limit", "persona", "hooks", "subagents"):
        assert found[name] == "unsupported", name
    assert sorted(declaration.accepted_settings) == ["cwd", "timeout"]


@pytest.mark.slow
async def test_an_agent_announcing_less_is_declared_with_less(tmp_path: Path) -> None:
    announced = {"loadSession": False, "mcpCapabilities": {"http": False, "sse": True}}
    spec = AdapterSpec(
        shortname="plain-acp",
        implementation="acp",
        options=MappingProxyType(
            {
                "argv": [sys.executable, str(FAKE_AGENT)],
                "env": {"FAKE_ACP_CAPABILITIES": json.dumps(announced)},
            }
        ),
    )
    adapter = await AcpAdapter.start(spec)
    declaration = adapter.declaration
    assert declaration.mcp_transports == {"stdio", "sse"}
    assert declaration.state(Capability.STATEFUL_HISTORY) is CapabilityState.UNSUPPORTED
    assert declaration.state(Capability.MODEL_OVERRIDE) is CapabilityState.SUPPORTED


async def test_an_agent_that_does_not_start_is_a_config_error(tmp_path: Path) -> None:
    spec = AdapterSpec(
        shortname="broken-acp",
        implementation="acp",
        options=MappingProxyType({"argv": [sys.executable, "-c", "import sys; sys.exit('no ACP here')"]}),
    )
    with pytest.raises(errors.ConfigError, match="initialize failed: the agent exited with 1: no ACP here"):
        await AcpAdapter.start(spec)


@pytest.mark.slow
async def test_a_prompt_streams_the_agents_text_and_events(stub: Stub, agent_files: dict[str, Path]) -> None:
    server = pb.McpServer(name="files", transport="stdio", command="mcp-files", args=["--root", "/srv"])
    response = await stub.Invoke(invoke("echo:hello world", stream_events=True, mcp_servers=[server]))
    assert response.text == "hello world"
    events = [(event.type, event.text) for event in response.events]
    assert events == [
        ("agent_thought_chunk", "thinking it over"),
        ("tool_call", "Looking around completed"),
        ("agent_message_chunk", "hello"),
        ("agent_message_chunk", " world"),
    ]
    (session,) = logged(agent_files, "session/new")[-1:]
    # No cwd set: a scratch directory of its own, removed after the call.
    assert Path(session["cwd"]).name.startswith("acp-session-")
    assert not await asyncio.to_thread(Path(session["cwd"]).exists)
    assert session["mcp_servers"] == [
        {"name": "files", "command": "mcp-files", "args": ["--root", "/srv"], "env": []}
    ]
    (initialize,) = logged(agent_files, "initialize")[-1:]
    # The operator allowed client_fs: read, and never terminals.
    assert initialize["client_capabilities"]["fs"] == {"readTextFile": True, "writeTextFile": False}
    assert initialize["client_capabilities"]["terminal"] is False


@pytest.mark.slow
async def test_model_effort_profile_and_cwd_reach_the_session(
    stub: Stub, agent_files: dict[str, Path], roots: Path
) -> None:
    settings = {"cwd": str(roots / "project")}
    response = await stub.Invoke(
        invoke("hi", model="fake-large", effort="high", profile="code", settings=settings)
    )
    assert response.text == "ok"
    assert logged(agent_files, "session/new")[-1]["cwd"] == str((roots / "project").resolve())
    assert logged(agent_files, "session/set_mode")[-1]["mode_id"] == "code"
    chosen = {
        entry["config_id"]: entry["value"] for entry in logged(agent_files, "session/set_config_option")
    }
    assert chosen == {"model": "fake-large", "reasoning": "high"}


@pytest.mark.slow
async def test_values_the_agent_does_not_offer_and_cwd_outside_the_roots_are_refused(
    stub: Stub, agent_files: dict[str, Path], tmp_path: Path
) -> None:
    before = len(logged(agent_files, "initialize"))
    error = await call_error(stub.Invoke(invoke("hi", model="gpt-unknown")))
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "ADAPTER_REFUSED"
    assert "model 'gpt-unknown' is not one the agent offers (fake-large, fake-small)" in error.message
    error = await call_error(stub.Invoke(invoke("hi", settings={"cwd": str(tmp_path)})))
    assert error.reason == "ADAPTER_REFUSED"
    assert "not inside the adapter's cwd_roots" in error.message
    assert len(logged(agent_files, "initialize")) == before  # no agent was started for either


@pytest.mark.slow
async def test_a_conversation_resumes_the_acp_session(stub: Stub, agent_files: dict[str, Path]) -> None:
    first = await stub.Invoke(invoke("history", generate_conversation_id=True))
    assert first.text == "turn 1"
    second = await stub.Invoke(invoke("history", conversation_id=first.conversation_id))
    assert second.text == "turn 2"
    (resumed,) = logged(agent_files, "session/resume")
    assert resumed["session_id"] == logged(agent_files, "session/prompt")[0]["session_id"]


@pytest.mark.slow
async def test_a_crashed_agent_is_unavailable_with_its_stderr_tail(stub: Stub) -> None:
    error = await call_error(stub.Invoke(invoke("crash")))
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert error.reason == "ADAPTER_UNAVAILABLE"
    assert "the agent exited with 3: fatal: the fake agent crashed on purpose" in error.message


@pytest.mark.slow
async def test_a_line_over_max_line_bytes_fails_the_call_and_stops_the_agent(
    stub: Stub, agent_files: dict[str, Path]
) -> None:
    # Within the cap, lines longer than the reader's buffer still arrive whole.
    text = "y" * 150_000
    assert (await stub.Invoke(invoke(f"echo:{text}", agent="capped-acp"), timeout=20)).text == text
    started = time.monotonic()
    error = await call_error(stub.Invoke(invoke(f"long-line:{MAX_LINE + 1}", agent="capped-acp"), timeout=20))
    assert time.monotonic() - started < 10
    assert error.code is grpc.StatusCode.INTERNAL
    assert error.reason == "ADAPTER_REPLY_TOO_LARGE"
    assert f"the agent wrote a line longer than max_line_bytes={MAX_LINE}; it was stopped" in error.message
    prompt = logged(agent_files, "session/prompt")[-1]
    pid = int(prompt["session_id"].rsplit("-", 1)[1])
    for _ in range(100):
        if not await asyncio.to_thread(Path(f"/proc/{pid}").exists):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"the agent process {pid} is still running")
    # A line of exactly the cap is one message like any other.
    error = await call_error(
        stub.Invoke(invoke(f"long-line:{MAX_LINE}", agent="capped-acp", settings={"timeout": 2}), timeout=20)
    )
    assert error.reason == "ADAPTER_TIMEOUT"


@pytest.mark.slow
async def test_the_deadline_sends_session_cancel(stub: Stub, agent_files: dict[str, Path]) -> None:
    error = await call_error(stub.Invoke(invoke("hang", settings={"timeout": 4})))
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert error.reason == "ADAPTER_TIMEOUT"
    assert "no answer within 4 s (the call's timeout setting)" in error.message
    assert "the agent ended its turn on session/cancel" in error.message
    assert logged(agent_files, "session/cancel")
    error = await call_error(stub.Invoke(invoke("ignore-cancel", settings={"timeout": 4})))
    assert "the agent did not end its turn within 3 s of session/cancel" in error.message


@pytest.mark.slow
async def test_a_caller_cancel_reaches_the_agent(stub: Stub, agent_files: dict[str, Path]) -> None:
    call = stub.Invoke(invoke("hang"))
    (prompt,) = await wait_logged(agent_files, "session/prompt")
    call.cancel()
    (cancel,) = await wait_logged(agent_files, "session/cancel")
    assert cancel["session_id"] == prompt["session_id"]


@pytest.mark.slow
async def test_invoke_stream_delivers_each_chunk_as_the_agent_sends_it(stub: Stub) -> None:
    arrivals: list[tuple[float, pb.InvokeStreamResponse]] = []
    async for message in stub.InvokeStream(
        pb.InvokeStreamRequest(invoke=invoke("slow:4", stream_events=True))
    ):
        arrivals.append((time.monotonic(), message))
    kinds = [message.WhichOneof("kind") for _, message in arrivals]
    assert kinds == ["decision", "delta", "event", "delta", "delta", "delta", "final"]
    deltas = [(at, message.delta) for at, message in arrivals if message.WhichOneof("kind") == "delta"]
    sent = [float(text.split(" at ")[1]) for _, text in deltas]
    # Chunks are sent 200 ms apart: each reaches the caller well before the next is sent.
    for (arrived, _), written in zip(deltas, sent, strict=True):
        assert arrived - written < 0.1
    assert deltas[0][0] < sent[-1]
    event = next(message.event for _, message in arrivals if message.WhichOneof("kind") == "event")
    assert (event.type, event.text) == ("tool_call", "Working in_progress")
    final = arrivals[-1][1].final
    assert final.text == "".join(text for _, text in deltas)
    assert not final.events


@pytest.mark.slow
async def test_invoke_stream_without_stream_events_sends_only_text(stub: Stub) -> None:
    kinds = [
        message.WhichOneof("kind")
        async for message in stub.InvokeStream(pb.InvokeStreamRequest(invoke=invoke("echo:hi there")))
    ]
    assert kinds == ["decision", "delta", "delta", "final"]


@pytest.mark.slow
async def test_closing_an_invoke_stream_cancels_the_turn_and_stops_the_agent(
    stub: Stub, agent_files: dict[str, Path]
) -> None:
    call = stub.InvokeStream(pb.InvokeStreamRequest(invoke=invoke("hang")))
    first = await call.read()
    assert isinstance(first, pb.InvokeStreamResponse)
    assert first.WhichOneof("kind") == "decision"
    (prompt,) = await wait_logged(agent_files, "session/prompt")
    call.cancel()
    (cancel,) = await wait_logged(agent_files, "session/cancel")
    assert cancel["session_id"] == prompt["session_id"]
    # The fake agent's session ids end with its process id.
    pid = int(prompt["session_id"].rsplit("-", 1)[1])
    for _ in range(100):
        if not await asyncio.to_thread(Path(f"/proc/{pid}").exists):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"the agent process {pid} is still running")


class Caller:
    """The caller's end of one ToolSession."""

    def __init__(self, stub: Stub) -> None:
        # A bidi call opened without an iterator is written to with write(); the stubs miss that form.
        self.call: Any = stub.ToolSession(timeout=20)  # type: ignore[call-arg]

    async def start(self, call: pb.InvokeRequest, tools: list[pb.ToolSpec]) -> None:
        start = pb.ToolSessionStart(tools=tools)
        start.invoke.CopyFrom(call)
        await self.call.write(pb.ToolSessionRequest(start=start))

    async def receive(self, expected: str) -> Any:
        message = await self.call.read()
        assert message is not EOF, "the stream ended"
        assert message.WhichOneof("message") == expected, message
        return getattr(message, expected)


def permission_tool(name: str = "acp_permission") -> pb.ToolSpec:
    return pb.ToolSpec(name=name, arguments_schema=PERMISSION_SCHEMA, risk=pb.TOOL_RISK_MUTATING)


@pytest.fixture
async def caller(stub: Stub) -> AsyncIterator[Caller]:
    caller = Caller(stub)
    try:
        yield caller
    finally:
        caller.call.cancel()


@pytest.mark.slow
async def test_a_permission_request_is_answered_by_the_caller(caller: Caller) -> None:
    await caller.start(invoke("permission"), [permission_tool()])
    request = await caller.receive("approval_request")
    assert request.tool_name == "acp_permission"
    arguments = json.loads(request.arguments_json)
    assert arguments["title"] == "rm -rf build"
    assert arguments["kind"] == "execute"
    assert arguments["raw_input"] == {"cmd": "rm -rf build"}
    assert [option["option_id"] for option in arguments["options"]] == ["yes", "always", "no"]
    await caller.call.write(
        pb.ToolSessionRequest(
            approval=pb.ToolApproval(call_id=request.call_id, decision=pb.APPROVAL_DECISION_ALLOW)
        )
    )
    tool_call = await caller.receive("tool_call")
    await caller.call.write(
        pb.ToolSessionRequest(
            tool_result=pb.ToolResult(
                call_id=tool_call.call_id, result_json=json.dumps({"option_id": "always"})
            )
        )
    )
    result = await caller.receive("invoke_result")
    assert result.text == "permission: always"


@pytest.mark.slow
async def test_a_denied_permission_selects_the_reject_option(caller: Caller) -> None:
    await caller.start(invoke("permission"), [permission_tool()])
    request = await caller.receive("approval_request")
    await caller.call.write(
        pb.ToolSessionRequest(
            approval=pb.ToolApproval(call_id=request.call_id, decision=pb.APPROVAL_DECISION_DENY, reason="no")
        )
    )
    result = await caller.receive("invoke_result")
    assert result.text == "permission: no"


@pytest.mark.slow
async def test_without_an_approval_channel_a_permission_is_refused(stub: Stub) -> None:
    response = await stub.Invoke(invoke("permission"))
    assert response.text == "permission: no"


@pytest.mark.slow
async def test_caller_tools_the_agent_cannot_see_are_refused(caller: Caller) -> None:
    lookup = pb.ToolSpec(name="lookup", arguments_schema=PERMISSION_SCHEMA, risk=pb.TOOL_RISK_READ_ONLY)
    await caller.start(invoke("hi"), [permission_tool(), lookup])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await caller.receive("invoke_result")
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "an ACP agent cannot see caller tools (lookup)" in str(caught.value.details())


@pytest.mark.slow
async def test_file_reads_are_served_only_inside_the_session_cwd(
    stub: Stub, roots: Path, tmp_path: Path
) -> None:
    project = roots / "project"
    (project / "notes.txt").write_text("inside the project\n")
    (tmp_path / "secret.txt").write_text("outside\n")
    settings = {"cwd": str(project)}
    response = await stub.Invoke(invoke(f"read:{project / 'notes.txt'}", settings=settings))
    assert response.text == "inside the project\n"
    error = await call_error(stub.Invoke(invoke(f"read:{tmp_path / 'secret.txt'}", settings=settings)))
    assert error.reason == "ADAPTER_REFUSED"
    assert "outside the session's directory" in error.message
