"""The acp adapter with the real codex-acp agent (@zed-industries/codex-acp from npm).

The agent talks to a local mock of the OpenAI Responses API on loopback (mock_responses.py),
configured through its own CODEX_HOME with a custom model provider and a dummy key, so no
login is needed and nothing leaves the machine. The package is installed by
scripts/peers/codex-acp.sh (run here when it is missing); without npm these tests skip.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import pytest
import yaml
from mock_responses import MockResponses
from negotiator_testkit import REPO, call_error

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
PEER = REPO / "tests" / "peers" / "codex-acp"
CODEX_ACP = PEER / "node_modules" / ".bin" / "codex-acp"
MARKER_MCP_SERVER = Path(__file__).with_name("marker_mcp_server.py")
EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # grpc-stubs do not know it
# A model Codex knows, so it does not prefix the reply with a "metadata not found" notice.
MODEL = "gpt-5.4"


@pytest.fixture(scope="module")
def codex_acp() -> Path:
    if not CODEX_ACP.exists():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed, so @zed-industries/codex-acp cannot be installed here")
        subprocess.run(["bash", str(REPO / "scripts" / "peers" / "codex-acp.sh")], check=True, timeout=600)
    if shutil.which("node") is None:
        pytest.skip("node is not installed, so the codex-acp launcher cannot run")
    return CODEX_ACP


@pytest.fixture
def provider() -> Iterator[MockResponses]:
    with MockResponses() as mock:
        yield mock


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def config_file(tmp_path: Path, codex_acp: Path, provider: MockResponses, work: Path) -> Path:
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        'model_provider = "mock"\n'
        "[model_providers.mock]\n"
        'name = "local mock"\n'
        f'base_url = "{provider.base_url}"\n'
        'env_key = "MOCK_PROVIDER_KEY"\n'
        'wire_api = "responses"\n'
    )
    env = {"HOME": str(home), "CODEX_HOME": str(home / ".codex"), "MOCK_PROVIDER_KEY": "sk-dummy-local"}
    entry = {
        "shortname": "codex",
        "implementation": "acp",
        "options": {"argv": [str(codex_acp)], "env": env, "cwd_roots": [str(work)], "timeout_seconds": 60},
    }
    path = tmp_path / "negotiator.yaml"
    # codex-acp launches the MCP servers a call names: the operator admits their command.
    admitted = {"mcp": {"caller_stdio_commands": [sys.executable]}}
    path.write_text(yaml.safe_dump({**admitted, "adapters": [entry]}))
    return path


def invoke(prompt: str, work: Path, **options: Any) -> pb.InvokeRequest:
    call_options = pb.CallOptions(**options)
    call_options.settings.update({"cwd": str(work)})
    return pb.InvokeRequest(agent="codex", prompt=prompt, options=call_options)


@pytest.mark.slow
async def test_the_declaration_is_built_from_codex_acps_initialize(stub: Stub) -> None:
    declaration = (await stub.GetAdapter(pb.GetAdapterRequest(shortname="codex"))).adapter.declaration
    found = {
        common_pb2.Capability.Name(entry.capability).removeprefix("CAPABILITY_").lower(): entry.state
        for entry in declaration.capabilities
    }
    supported = {name for name, state in found.items() if state == common_pb2.CAPABILITY_STATE_SUPPORTED}
    # mcpCapabilities {http: true, sse: false}; loadSession and session resume; config options
    # for the model and (for this model) its reasoning effort, and modes in its session.
    assert sorted(declaration.mcp_transports) == ["http", "stdio"]
    assert {
        "mcp",
        "stateful_history",
        "stream_events",
        "model_override",
        "effort",
        "profile_override",
    } <= supported
    assert found["structured_output"] == common_pb2.CAPABILITY_STATE_UNSUPPORTED


@pytest.mark.slow
async def test_a_prompt_is_streamed_back_and_the_model_reaches_the_provider(
    stub: Stub, provider: MockResponses, work: Path
) -> None:
    provider.reply_text = "Hello from the local provider."
    response = await stub.Invoke(
        invoke("say hello", work, model="gpt-5.4-mini", effort="low", stream_events=True)
    )
    assert response.text == "Hello from the local provider."
    chunks = [event.text for event in response.events if event.type == "agent_message_chunk"]
    assert "".join(chunks) == "Hello from the local provider."
    (request,) = provider.model_requests
    assert request.body["model"] == "gpt-5.4-mini"
    assert request.body["reasoning"]["effort"] == "low"
    assert request.headers["authorization"] == "Bearer sk-dummy-local"
    assert request.body["stream"] is True


@pytest.mark.slow
async def test_invoke_stream_streams_the_agents_reply(
    stub: Stub, provider: MockResponses, work: Path
) -> None:
    provider.reply_text = "Hello from the local provider."
    request = invoke("say hello", work, model="gpt-5.4-mini", effort="low", stream_events=True)
    messages = [message async for message in stub.InvokeStream(pb.InvokeStreamRequest(invoke=request))]
    assert messages[0].WhichOneof("kind") == "decision"
    assert messages[-1].WhichOneof("kind") == "final"
    deltas = [message.delta for message in messages if message.WhichOneof("kind") == "delta"]
    assert deltas
    assert "".join(deltas) == messages[-1].final.text == "Hello from the local provider."
    assert not messages[-1].final.events


@pytest.mark.slow
async def test_an_mcp_stdio_server_given_in_the_session_is_launched(
    stub: Stub, work: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "mcp-started"
    server = pb.McpServer(
        name="marker", transport="stdio", command=sys.executable, args=[str(MARKER_MCP_SERVER), str(marker)]
    )
    response = await stub.Invoke(invoke("hello", work, mcp_servers=[server]))
    assert response.text
    assert await asyncio.to_thread(marker.exists)


@pytest.mark.slow
async def test_a_permission_request_is_answered_by_the_caller(
    stub: Stub, provider: MockResponses, work: Path
) -> None:
    marker = work / "approved"
    # The model asks to run a command outside the sandbox; Codex asks the client's permission.
    provider.turns = [{"shell": ["touch", str(marker)], "escalate": True}, {"text": "done"}]
    session: Any = stub.ToolSession(timeout=60)  # type: ignore[call-arg]
    try:
        start = pb.ToolSessionStart(
            tools=[pb.ToolSpec(name="acp_permission", arguments_schema='{"type": "object"}')]
        )
        start.invoke.CopyFrom(invoke("make the marker", work))
        await session.write(pb.ToolSessionRequest(start=start))
        message = await session.read()
        assert message.WhichOneof("message") == "approval_request", message
        arguments = json.loads(message.approval_request.arguments_json)
        assert arguments["kind"] == "execute"
        assert str(marker) in arguments["title"]
        assert {option["kind"] for option in arguments["options"]} >= {"allow_once", "reject_once"}
        approval = pb.ToolApproval(
            call_id=message.approval_request.call_id, decision=pb.APPROVAL_DECISION_ALLOW
        )
        await session.write(pb.ToolSessionRequest(approval=approval))
        message = await session.read()
        assert message.WhichOneof("message") == "tool_call", message
        result = pb.ToolResult(call_id=message.tool_call.call_id, result_json="{}")
        await session.write(pb.ToolSessionRequest(tool_result=result))
        message = await session.read()
        assert message.WhichOneof("message") == "invoke_result", message
        assert message.invoke_result.text == "done"
    finally:
        session.cancel()
    assert await asyncio.to_thread(marker.exists)
    # The command's outcome went back to the model with the next request.
    outputs = [item for request in provider.model_requests for item in request.body.get("input", [])]
    assert any(item.get("type") == "function_call_output" for item in outputs if isinstance(item, dict))


@pytest.mark.slow
async def test_without_an_approval_channel_the_command_does_not_run(
    stub: Stub, provider: MockResponses, work: Path
) -> None:
    marker = work / "refused"
    provider.turns = [{"shell": ["touch", str(marker)], "escalate": True}, {"text": "understood"}]
    await stub.Invoke(invoke("make the marker", work))
    assert not await asyncio.to_thread(marker.exists)


@pytest.mark.slow
async def test_the_deadline_cancels_the_agents_turn(stub: Stub, provider: MockResponses, work: Path) -> None:
    provider.turns = [{"hang": True}]
    request = invoke("wait forever", work)
    request.options.settings.update({"timeout": 8})
    error = await call_error(stub.Invoke(request))
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert provider.started.is_set()
    # codex-acp got session/cancel and ended the turn (stop reason: cancelled) within the grace.
    assert "the agent ended its turn on session/cancel" in error.message
