"""The openai adapter in front of llmock (0.2.2), a third-party OpenAI-compatible mock that
generates structured output from the schema it is sent. What it receives is recorded in front of it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from tests.peers.negotiator_kit import KEY_ENV, negotiator_stub
from tests.peers.peer_support import Peer, RecordingProxy, free_port, peer_binary, running_peer

pytestmark = pytest.mark.peers
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string"},
        "count": {"type": "integer"},
        "note": {"type": ["string", "null"]},  # optional but nullable: required in the strict form
    },
    "required": ["answer", "count"],
}


@pytest.fixture(scope="module")
def llmock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    binary = peer_binary("llmock", "llmock")
    directory = tmp_path_factory.mktemp("llmock")
    port = free_port()
    argv = [str(binary), "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    with running_peer(argv, port, "/v1/models", directory / "llmock.log") as peer:
        print(f"llmock answered after {peer.startup_seconds:.1f} s")
        yield peer


@pytest.fixture(scope="module")
def proxy(llmock: Peer) -> Iterator[RecordingProxy]:
    with RecordingProxy(llmock.base_url.removesuffix("/v1")) as recording:
        yield recording


@pytest.fixture
async def stub(
    proxy: RecordingProxy, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[negotiator_pb2_grpc.NegotiatorServiceAsyncStub]:
    monkeypatch.setenv(KEY_ENV, "sk-llmock")
    proxy.clear()
    config = f"""\
adapters:
  - shortname: llmock
    implementation: openai
    options: {{base_url: "{proxy.base_url}", api_key_env: {KEY_ENV}, model: gpt-4o}}
"""
    async with negotiator_stub(config, tmp_path_factory.mktemp("n")) as negotiator:
        yield negotiator


async def test_structured_output_through_llmock_uses_the_strict_form(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, proxy: RecordingProxy
) -> None:
    request = pb.ProduceRequest(adapter="llmock", prompt="Answer.", output_schema=json.dumps(SCHEMA))
    response = await stub.Produce(request, timeout=30)
    output = json.loads(response.output_json)
    assert isinstance(output["answer"], str)
    assert isinstance(output["count"], int)
    [sent] = proxy.chat_requests()
    format_sent = sent["response_format"]["json_schema"]
    assert format_sent["strict"] is True
    assert format_sent["schema"] == {
        **SCHEMA,
        "required": ["answer", "count", "note"],
        "additionalProperties": False,
    }


async def test_effort_and_persona_are_refused_before_dispatch_for_a_generic_server(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, proxy: RecordingProxy
) -> None:
    for options in (pb.CallOptions(effort="low"), pb.CallOptions(persona="terse")):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Invoke(pb.InvokeRequest(adapter="llmock", prompt="p", options=options), timeout=10)
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert proxy.chat_requests() == []
    response = await stub.Invoke(pb.InvokeRequest(adapter="llmock", prompt="hello"), timeout=30)
    assert response.text
    assert len(proxy.chat_requests()) == 1


async def test_probing_llmock_keeps_evidence_and_settles_only_what_was_unknown(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, proxy: RecordingProxy
) -> None:
    assert proxy.received == []  # no probe: section, so nothing was probed at start-up
    response = await stub.ProbeAdapter(pb.ProbeAdapterRequest(shortname="llmock"), timeout=60)
    for item in response.evidence:
        print(f"{item.probe} {pb.ProbeVerdict.Name(item.verdict)}: {item.detail} | {item.reply}")
    verdicts = {item.probe: item.verdict for item in response.evidence}
    passed = pb.PROBE_VERDICT_PASSED
    # llmock lists the model, answers the schema and calls the tool, but shows no reasoning tokens.
    assert verdicts == {
        "models": passed,
        "structured_output": passed,
        "tool_call": passed,
        "effort": pb.PROBE_VERDICT_FAILED,
    }
    assert all(item.model == "gpt-4o" and item.request for item in response.evidence)
    [entry] = response.adapter.declaration.models
    states = {c.capability: c.state for c in entry.capabilities}
    assert states[common_pb2.CAPABILITY_EFFORT] == common_pb2.CAPABILITY_STATE_UNSUPPORTED
    # What the code enforces itself stays SUPPORTED whatever a probe showed.
    assert states[common_pb2.CAPABILITY_STRUCTURED_OUTPUT] == common_pb2.CAPABILITY_STATE_SUPPORTED
    shown = (await stub.GetAdapter(pb.GetAdapterRequest(shortname="llmock"))).adapter
    assert list(shown.probe_evidence) == list(response.evidence)
    assert [r.path for r in proxy.received] == ["/v1/models"] + ["/v1/chat/completions"] * 3
