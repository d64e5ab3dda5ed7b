"""The openai adapter in front of a real LiteLLM proxy (1.80.0) serving `mock_response` models.

`mock-drop` is LiteLLM's gpt-3.5-turbo with `drop_params: true`: LiteLLM silently drops
`reasoning_effort` for it and answers as if nothing happened. `mock-nodrop` is the same model
without drop_params: LiteLLM refuses the parameter (HTTP 400). `mock-strict` answers structured
output. Whatever the proxy receives is recorded in front of it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from tests.peers.negotiator_kit import KEY_ENV, negotiator_stub
from tests.peers.peer_support import Peer, RecordingProxy, free_port, peer_binary, running_peer

MASTER_KEY = "sk-peer-test-master"
LITELLM_CONFIG = """\
model_list:
  - model_name: mock-strict
    litellm_params:
      model: openai/gpt-4o
      api_key: sk-not-used
      mock_response: '{"answer": "from litellm", "tags": []}'
  - model_name: mock-drop
    litellm_params:
      model: openai/gpt-3.5-turbo
      api_key: sk-not-used
      mock_response: "answered without effort"
      drop_params: true
  - model_name: mock-nodrop
    litellm_params:
      model: openai/gpt-3.5-turbo
      api_key: sk-not-used
      mock_response: "never seen"
general_settings:
  master_key: MASTER_KEY
""".replace("MASTER_KEY", MASTER_KEY)
# Nothing may reach the network: the cost map is the packaged one, telemetry is off.
OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "NO_DOCS": "True",
    "DISABLE_SCHEMA_UPDATE": "True",
}
pytestmark = pytest.mark.peers
STRICT_READY = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["answer", "tags"],
}


@pytest.fixture(scope="module")
def litellm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    binary = peer_binary("litellm", "litellm")
    directory = tmp_path_factory.mktemp("litellm")
    (directory / "config.yaml").write_text(LITELLM_CONFIG)
    port = free_port()
    argv = [str(binary), "--config", "config.yaml", "--host", "127.0.0.1", "--port", str(port)]
    with running_peer(argv, port, "/health/liveliness", directory / "litellm.log", OFFLINE_ENV) as peer:
        print(f"LiteLLM proxy answered after {peer.startup_seconds:.1f} s")
        yield peer


@pytest.fixture(scope="module")
def proxy(litellm: Peer) -> Iterator[RecordingProxy]:
    with RecordingProxy(litellm.base_url.removesuffix("/v1")) as recording:
        yield recording


def config(base_url: str) -> str:
    options = f'{{base_url: "{base_url}", api_key_env: {KEY_ENV}, model: mock-strict}}'
    return f"""\
adapters:
  - shortname: litellm
    implementation: openai
    options: {options}
  - shortname: litellm-vouched
    implementation: openai
    options: {options}
    declaration:
      models:
        mock-drop:
          capabilities: {{effort: supported}}
          effort_levels: [low, medium, high]
  - shortname: litellm-settings
    implementation: openai
    options: {{base_url: "{base_url}", api_key_env: {KEY_ENV}, model: mock-strict,
               models: {{mock-drop: {{max_tokens_field: max_completion_tokens}}}}}}
    declaration:
      capabilities: {{settings: supported, model_override: supported}}
"""


@pytest.fixture
async def stub(
    proxy: RecordingProxy, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[negotiator_pb2_grpc.NegotiatorServiceAsyncStub]:
    monkeypatch.setenv(KEY_ENV, MASTER_KEY)
    proxy.clear()
    async with negotiator_stub(config(proxy.base_url), tmp_path_factory.mktemp("n")) as negotiator:
        yield negotiator


def invoke(adapter: str, **options: object) -> pb.InvokeRequest:
    return pb.InvokeRequest(adapter=adapter, prompt="Think hard.", options=pb.CallOptions(**options))  # type: ignore[arg-type]


async def test_effort_for_the_drop_params_model_is_unknown_and_refused_before_dispatch(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, proxy: RecordingProxy
) -> None:
    declaration = (await stub.GetAdapter(pb.GetAdapterRequest(shortname="litellm"))).adapter.declaration
    states = {c.capability: c.state for c in declaration.capabilities}
    assert states[common_pb2.CAPABILITY_EFFORT] == common_pb2.CAPABILITY_STATE_UNKNOWN
    assert list(declaration.models) == []  # nothing stated for mock-drop: the code's word holds

    call = invoke("litellm", model="mock-drop", effort="high")
    decision = (await stub.Negotiate(pb.NegotiateRequest(invoke=call))).decision
    assert not decision.accepted
    assert [(g.requirement.request_field, g.state) for g in decision.gaps] == [
        ("options.effort", common_pb2.CAPABILITY_STATE_UNKNOWN)
    ]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Invoke(call, timeout=10)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert proxy.chat_requests() == []  # refused: LiteLLM received nothing


async def test_config_stating_effort_for_the_model_lets_it_through(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, proxy: RecordingProxy
) -> None:
    declaration = (
        await stub.GetAdapter(pb.GetAdapterRequest(shortname="litellm-vouched"))
    ).adapter.declaration
    [entry] = declaration.models
    assert entry.model == "mock-drop"
    assert {c.capability: c.state for c in entry.capabilities}[common_pb2.CAPABILITY_EFFORT] == (
        common_pb2.CAPABILITY_STATE_SUPPORTED
    )
    response = await stub.Invoke(invoke("litellm-vouched", model="mock-drop", effort="high"), timeout=30)
    assert response.text == "answered without effort"
    assert response.decision.model == "mock-drop"
    [sent] = proxy.chat_requests()
    assert (sent["model"], sent["reasoning_effort"]) == ("mock-drop", "high")
    # A level the config does not list for the model is refused, and not sent.
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Invoke(invoke("litellm-vouched", model="mock-drop", effort="minimal"), timeout=10)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "effort_levels:minimal" in (caught.value.details() or "")
    # Other models keep the code's UNKNOWN.
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.Invoke(invoke("litellm-vouched", model="mock-nodrop", effort="high"), timeout=10)
    assert len(proxy.chat_requests()) == 1


async def test_an_allowed_unknown_goes_to_the_upstream_which_may_refuse_it(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, proxy: RecordingProxy
) -> None:
    call = invoke("litellm", model="mock-nodrop", effort="high", allow_unknown=[common_pb2.CAPABILITY_EFFORT])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Invoke(call, timeout=30)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "reasoning_effort" in (caught.value.details() or "")
    [sent] = proxy.chat_requests()
    assert sent["reasoning_effort"] == "high"


async def test_structured_output_goes_in_its_strict_form(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, proxy: RecordingProxy
) -> None:
    request = pb.ProduceRequest(adapter="litellm", prompt="Answer.", output_schema=json.dumps(STRICT_READY))
    # Twice: the first call's schema is its check's own parse, the second's the one kept for the
    # text (read-only, shared by like calls); both reach the proxy as the same plain JSON.
    for _ in range(2):
        response = await stub.Produce(request, timeout=30)
        assert json.loads(response.output_json) == {"answer": "from litellm", "tags": []}
    optional = {"type": "object", "properties": {"answer": {"type": "string"}, "n": {"type": "integer"}}}
    await stub.Produce(
        pb.ProduceRequest(adapter="litellm", prompt="Answer.", output_schema=json.dumps(optional)), timeout=30
    )
    first, again, second = (body["response_format"]["json_schema"] for body in proxy.chat_requests())
    assert (first["strict"], first["schema"]) == (True, {**STRICT_READY, "additionalProperties": False})
    assert again == first
    assert (second["strict"], second["schema"]) == (False, optional)


async def test_probes_never_show_effort_for_models_that_drop_or_refuse_it(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, proxy: RecordingProxy
) -> None:
    assert proxy.received == []  # starting the negotiator probed nothing: no probe: section
    failed = pb.PROBE_VERDICT_FAILED
    for model in ("mock-drop", "mock-nodrop"):
        response = await stub.ProbeAdapter(
            pb.ProbeAdapterRequest(shortname="litellm", model=model), timeout=60
        )
        for item in response.evidence:
            print(f"{model}: {item.probe} {pb.ProbeVerdict.Name(item.verdict)}: {item.detail} | {item.reply}")
        verdicts = {item.probe: item.verdict for item in response.evidence}
        assert verdicts["models"] == pb.PROBE_VERDICT_PASSED
        assert verdicts["effort"] == failed  # dropped (no reasoning tokens) or refused (HTTP 400)
        [entry] = [m for m in response.adapter.declaration.models if m.model == model]
        states = {c.capability: c.state for c in entry.capabilities}
        assert states[common_pb2.CAPABILITY_EFFORT] == common_pb2.CAPABILITY_STATE_UNSUPPORTED
    for received in proxy.received:
        print("LiteLLM received:", received.method, received.path, json.dumps(received.body))
    sent_effort = [b for b in proxy.chat_requests() if "reasoning_effort" in b]
    assert [b["model"] for b in sent_effort] == ["mock-drop", "mock-nodrop"]
    # Only the probes were sent: a call with effort to mock-drop is still refused before dispatch.
    proxy.clear()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Invoke(invoke("litellm", model="mock-drop", effort="low"), timeout=10)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert proxy.chat_requests() == []
    # A config that vouched for effort keeps its word: a probe cannot overrule the operator.
    vouched = await stub.ProbeAdapter(
        pb.ProbeAdapterRequest(shortname="litellm-vouched", model="mock-drop"), timeout=60
    )
    assert {i.probe: i.verdict for i in vouched.evidence}["effort"] == failed
    [entry] = vouched.adapter.declaration.models
    assert {c.capability: c.state for c in entry.capabilities}[common_pb2.CAPABILITY_EFFORT] == (
        common_pb2.CAPABILITY_STATE_SUPPORTED
    )


async def test_max_completion_tokens_tool_choice_and_usage_through_litellm(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, proxy: RecordingProxy
) -> None:
    limits = struct_pb2.Struct()
    limits.update({"max_tokens": 32})
    response = await stub.Invoke(invoke("litellm-settings", model="mock-drop", settings=limits), timeout=30)
    assert response.text == "answered without effort"
    [sent] = proxy.chat_requests()
    assert sent["max_completion_tokens"] == 32
    assert "max_tokens" not in sent
    [answer] = proxy.answers
    assert response.usage == pb.Usage(
        prompt_tokens=answer["usage"]["prompt_tokens"], completion_tokens=answer["usage"]["completion_tokens"]
    )
    assert response.usage.prompt_tokens > 0

    choice = struct_pb2.Struct()
    choice.update({"tool_choice": {"type": "function", "function": {"name": "lookup"}}})
    lookup = pb.ToolSpec(name="lookup", risk=pb.TOOL_RISK_READ_ONLY, arguments_schema='{"type": "object"}')
    start = pb.ToolSessionStart(tools=[lookup])
    start.invoke.CopyFrom(invoke("litellm-settings", model="mock-drop", settings=choice))
    session = stub.ToolSession(timeout=30)  # type: ignore[call-arg]
    await session.write(pb.ToolSessionRequest(start=start))
    final: Any = await session.read()
    assert final.WhichOneof("message") == "invoke_result"
    assert final.invoke_result.text == "answered without effort"
    session.cancel()
    sent = proxy.chat_requests()[-1]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert [t["function"]["name"] for t in sent["tools"]] == ["lookup"]
