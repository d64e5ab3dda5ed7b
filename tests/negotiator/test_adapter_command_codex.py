"""The codex-cli preset with the real Codex CLI from npm, against a local Responses API mock.

`scripts/peers/codex-cli.sh` installs @openai/codex (pinned in tests/peers/codex-cli) with
`npm ci`. The CLI is configured as an operator would: a CODEX_HOME whose config.toml selects a
`model_providers` entry pointing at the mock on 127.0.0.1 (`env_key` names the variable holding
a key the mock ignores), with analytics and update checks off, so nothing leaves the machine.
A real `negotiator serve` runs the preset; calls go over gRPC, so the broker judges them and
validates Produce output as it does for every adapter.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from mock_responses import MockResponses
from negotiator_testkit import NEGOTIATOR_BIN, REPO

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.sidecar_runtime.richstatus import decode_error
from tests.procs import start_process, stop_process

CODEX_BIN_DIR = REPO / "tests" / "peers" / "codex-cli" / "node_modules" / ".bin"
CODEX = CODEX_BIN_DIR / "codex"

pytestmark = pytest.mark.skipif(
    not CODEX.exists() or shutil.which("node") is None,
    reason=(
        "the Codex CLI is not installed: scripts/peers/codex-cli.sh installs @openai/codex with npm ci"
        + ("" if shutil.which("npm") else " (npm is not on PATH here)")
    ),
)

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}

CODEX_CONFIG = """\
model = "mock-default-model"
model_provider = "mock"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.mock]
name = "local responses mock"
base_url = "{base_url}"
env_key = "MOCK_PROVIDER_KEY"
wire_api = "responses"
"""

NEGOTIATOR_CONFIG = """\
adapters:
  - shortname: codex
    implementation: command
    options:
      preset: codex-cli
      timeout_seconds: 60
      env: {env}
"""


@pytest.fixture
def mock() -> Iterator[MockResponses]:
    with MockResponses() as server:
        yield server


@pytest.fixture
def codex_negotiator(
    mock: MockResponses, tmp_path: Path
) -> Iterator[negotiator_pb2_grpc.NegotiatorServiceStub]:
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(CODEX_CONFIG.format(base_url=mock.base_url))
    env = {"CODEX_HOME": str(home), "HOME": str(home), "MOCK_PROVIDER_KEY": "not-a-real-key"}
    config = tmp_path / "negotiator.yaml"
    config.write_text(NEGOTIATOR_CONFIG.format(env=json.dumps(env)))
    sockets = Path(tempfile.mkdtemp(prefix="codex-", dir="/tmp"))
    target = f"unix:{sockets / 'negotiator.sock'}"
    # `codex` is found on the negotiator's own PATH, as an operator's installed CLI would be.
    path = f"{CODEX_BIN_DIR}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    process, _ = start_process(
        [str(NEGOTIATOR_BIN), "serve", "--listen", target, "--config", str(config)], env={"PATH": path}
    )
    try:
        with grpc.insecure_channel(target) as channel:
            yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)
    finally:
        stop_process(process)
        shutil.rmtree(sockets, ignore_errors=True)


def produce(**options: Any) -> pb.ProduceRequest:
    request = pb.ProduceRequest(
        agent="codex", prompt="Answer the question.", output_schema=json.dumps(SCHEMA)
    )
    for name, value in options.items():
        setattr(request.options, name, value)
    return request


@pytest.mark.slow
def test_the_preset_declares_what_it_passes_on(
    codex_negotiator: negotiator_pb2_grpc.NegotiatorServiceStub,
) -> None:
    adapter = codex_negotiator.GetAdapter(pb.GetAdapterRequest(shortname="codex"), timeout=20).adapter
    declaration = adapter.declaration
    states = {
        common_pb2.Capability.Name(c.capability).removeprefix("CAPABILITY_").lower(): c.state
        for c in declaration.capabilities
    }
    supported = sorted(
        name for name, state in states.items() if state == common_pb2.CAPABILITY_STATE_SUPPORTED
    )
    assert supported == [
        "depth_limit",
        "effort",
        "model_override",
        "persona",
        "settings",
        "stream_events",
        "structured_output",
        "subagents",
    ]
    # No stdio_commands or url_origins listed: MCP is not passed on.
    assert states["mcp"] == common_pb2.CAPABILITY_STATE_UNSUPPORTED
    assert states["tool_filter"] == common_pb2.CAPABILITY_STATE_UNSUPPORTED
    assert sorted(declaration.accepted_settings) == ["sandbox", "timeout"]


@pytest.mark.slow
def test_produce_with_a_schema_reaches_the_provider_and_is_validated(
    codex_negotiator: negotiator_pb2_grpc.NegotiatorServiceStub, mock: MockResponses
) -> None:
    mock.structured = {"answer": "forty-two", "confidence": 0.9}
    reply = codex_negotiator.Produce(
        produce(model="mock-model-7", effort="low", stream_events=True), timeout=60
    )
    assert json.loads(reply.output_json) == {"answer": "forty-two", "confidence": 0.9}
    (request,) = mock.responses_requests()
    body = request.body
    assert body["model"] == "mock-model-7"
    assert body["reasoning"]["effort"] == "low"
    text_format = body["text"]["format"]
    assert text_format["type"] == "json_schema"
    assert text_format["schema"] == SCHEMA
    assert request.headers["authorization"] == "Bearer not-a-real-key"
    # codex exec --json, as semantic events.
    events = [(event.type, event.text) for event in reply.events]
    assert events[0][0] == "session"
    assert ("message", '{"answer": "forty-two", "confidence": 0.9}') in events
    assert events[-1] == ("turn_completed", "")


@pytest.mark.slow
def test_output_that_does_not_match_the_schema_is_an_output_schema_violation(
    codex_negotiator: negotiator_pb2_grpc.NegotiatorServiceStub, mock: MockResponses
) -> None:
    mock.structured = {"answer": 42}
    with pytest.raises(grpc.RpcError) as raised:
        codex_negotiator.Produce(produce(), timeout=60)
    error = decode_error(raised.value)
    assert error.code is grpc.StatusCode.INTERNAL, error
    assert error.reason == "OUTPUT_SCHEMA_VIOLATION", error
    assert len(mock.responses_requests()) == 1


@pytest.mark.slow
def test_invoke_passes_the_persona_and_returns_the_last_message(
    codex_negotiator: negotiator_pb2_grpc.NegotiatorServiceStub, mock: MockResponses
) -> None:
    mock.reply_text = "plain answer"
    request = pb.InvokeRequest(agent="codex", prompt="-- say hi; $(id)")
    request.options.persona = 'You answer "briefly".\nNever more.'
    request.options.settings.update({"sandbox": "workspace-write"})
    reply = codex_negotiator.Invoke(request, timeout=60)
    assert reply.text == "plain answer"
    (sent,) = mock.responses_requests()
    texts = json.dumps(sent.body["input"])
    assert json.dumps('You answer "briefly".\nNever more.')[1:-1] in texts
    assert "-- say hi; $(id)" in texts
    assert "workspace-write" in json.dumps(sent.body)


@pytest.mark.slow
def test_an_unmapped_capability_is_refused_before_codex_runs(
    codex_negotiator: negotiator_pb2_grpc.NegotiatorServiceStub, mock: MockResponses
) -> None:
    request = pb.InvokeRequest(agent="codex", prompt="hi")
    request.options.tool_filter.allow.append("shell")
    with pytest.raises(grpc.RpcError) as raised:
        codex_negotiator.Invoke(request, timeout=60)
    error = decode_error(raised.value)
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "UNSUPPORTED_CAPABILITY"
    assert error.metadata["gaps"] == "tool_filter"
    assert mock.responses_requests() == []
