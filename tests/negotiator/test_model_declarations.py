"""Per-model declarations and the declaration rule, through a real negotiator and the local OpenAI mock."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from mock_openai import MockOpenAI

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.adapters._strict import strict_form
from agentsidecar.negotiator_service.adapters.openai import code_declaration, response_format
from agentsidecar.negotiator_service.config import load_config
from agentsidecar.negotiator_service.conversations import ConversationStore
from agentsidecar.negotiator_service.declarations import narrow, resolve_unknown
from agentsidecar.negotiator_service.errors import ConfigError
from agentsidecar.negotiator_service.model import Capability, CapabilityState
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server

KEY_ENV = "NEGOTIATOR_TEST_MODEL_DECL_KEY"
SUPPORTED = common_pb2.CAPABILITY_STATE_SUPPORTED
UNKNOWN = common_pb2.CAPABILITY_STATE_UNKNOWN
UNSUPPORTED = common_pb2.CAPABILITY_STATE_UNSUPPORTED


def config_text(base_url: str) -> str:
    return f"""\
adapters:
  - shortname: llm
    implementation: openai
    options:
      base_url: "{base_url}"
      api_key_env: {KEY_ENV}
      model: mock-chat
      models:
        mock-loose: {{strict_schema: false}}
    declaration:
      models:
        mock-reasoning:
          capabilities: {{effort: supported}}
          effort_levels: [low, high]
        mock-chat:
          capabilities: {{settings: supported}}
          accepted_settings: [temperature]
"""


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    with MockOpenAI() as server:
        yield server


@pytest.fixture
async def negotiator(
    mock: MockOpenAI, tmp_path: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[RunningNegotiator]:
    monkeypatch.setenv(KEY_ENV, "sk-test-models")
    config = tmp_path / "negotiator.yaml"
    config.write_text(config_text(mock.base_url))
    settings = Settings(
        listen=(f"unix:{socket_dir / 'negotiator.sock'}",), config_path=config, grace_seconds=1.0
    )
    running = await create_server(settings, conversation_store=ConversationStore(tmp_path / "conversations"))
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def stub(
    negotiator: RunningNegotiator,
) -> AsyncIterator[negotiator_pb2_grpc.NegotiatorServiceAsyncStub]:
    async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
        yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)


async def negotiate(stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, **options: Any) -> pb.Decision:
    call = pb.InvokeRequest(adapter="llm", prompt="p", options=pb.CallOptions(**options))
    response = await stub.Negotiate(pb.NegotiateRequest(invoke=call), timeout=5)
    return response.decision


def gaps(decision: pb.Decision) -> list[tuple[str, common_pb2.CapabilityState.ValueType]]:
    named = []
    for verdict in decision.gaps:
        requirement = verdict.requirement
        name = common_pb2.Capability.Name(requirement.capability).removeprefix("CAPABILITY_").lower()
        if requirement.member:
            name = f"{common_pb2.TypedSet.Name(requirement.set).removeprefix('TYPED_SET_').lower()}:"
            name += requirement.member
        named.append((name, verdict.state))
    return named


async def test_the_calls_model_selects_the_declaration_that_judges_it(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, mock: MockOpenAI
) -> None:
    # No model named: the default model's entry judges; it does not state effort.
    by_default = await negotiate(stub, effort="high")
    assert (by_default.model, by_default.accepted, gaps(by_default)) == (
        "mock-chat",
        False,
        [("effort", UNKNOWN)],
    )
    reasoning = await negotiate(stub, model="mock-reasoning", effort="high")
    assert (reasoning.model, reasoning.accepted) == ("mock-reasoning", True)
    too_much = await negotiate(stub, model="mock-reasoning", effort="medium")
    assert gaps(too_much) == [("effort_levels:medium", UNSUPPORTED)]
    # A model without an entry: the adapter-level declaration (the code's) judges.
    unlisted = await negotiate(stub, model="mock-other", effort="high")
    assert (unlisted.model, gaps(unlisted)) == ("", [("effort", UNKNOWN)])
    # Settings are stated for the default model only.
    assert (await negotiate(stub, settings={"temperature": 0.2})).accepted
    elsewhere = await negotiate(stub, model="mock-reasoning", settings={"temperature": 0.2})
    assert gaps(elsewhere) == [("settings", UNKNOWN)]
    assert {v.requirement.request_field for v in reasoning.verdicts} == {"options.model", "options.effort"}
    assert mock.requests == []  # Negotiate runs nothing

    refused = pb.InvokeRequest(adapter="llm", prompt="p", options=pb.CallOptions(effort="high"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Invoke(refused, timeout=5)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert mock.requests == []  # refused before dispatch: nothing reached the server
    accepted = pb.InvokeRequest(
        adapter="llm", prompt="p", options=pb.CallOptions(model="mock-reasoning", effort="high")
    )
    response = await stub.Invoke(accepted, timeout=5)
    assert response.decision.model == "mock-reasoning"
    [request] = mock.requests
    assert (request.body["model"], request.body["reasoning_effort"]) == ("mock-reasoning", "high")


async def test_get_adapter_shows_each_models_declaration(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
) -> None:
    declaration = (
        await stub.GetAdapter(pb.GetAdapterRequest(shortname="llm"), timeout=5)
    ).adapter.declaration
    assert declaration.default_model == "mock-chat"
    assert [entry.model for entry in declaration.models] == ["mock-chat", "mock-reasoning"]
    states = {
        entry.model: {c.capability: c.state for c in entry.capabilities} for entry in declaration.models
    }
    assert states["mock-reasoning"][common_pb2.CAPABILITY_EFFORT] == SUPPORTED
    assert states["mock-chat"][common_pb2.CAPABILITY_EFFORT] == UNKNOWN
    assert states["mock-chat"][common_pb2.CAPABILITY_SETTINGS] == SUPPORTED
    reasoning = declaration.models[1]
    assert list(reasoning.effort_levels) == ["high", "low"]
    adapter_level = {c.capability: c.state for c in declaration.capabilities}
    assert adapter_level[common_pb2.CAPABILITY_EFFORT] == UNKNOWN
    assert adapter_level[common_pb2.CAPABILITY_CODEMODE] == UNSUPPORTED
    # The version covers the per-model entries.
    without_models = narrow(code_declaration("llm", "mock-chat"), None, shortname="llm")
    assert declaration.version != without_models.version


def spec_from(text: str) -> Any:
    [spec] = load_config(text, "test.yaml")
    return spec


def openai_config(declaration: str) -> str:
    return (
        "adapters:\n  - shortname: llm\n    implementation: openai\n"
        f'    options: {{base_url: "http://127.0.0.1:9/v1", api_key_env: {KEY_ENV}, model: m}}\n'
        f"    declaration:\n{declaration}"
    )


def test_config_states_supported_only_for_what_the_code_carries() -> None:
    vouched = build_adapter(
        spec_from(openai_config("      capabilities: {effort: supported, persona: supported}\n"))
    )
    assert vouched.declaration.state(Capability.EFFORT) is CapabilityState.SUPPORTED
    with pytest.raises(ConfigError) as caught:
        build_adapter(
            spec_from(
                openai_config(
                    "      models:\n        m2:\n          capabilities: {codemode: supported}\n"
                    "          effort_levels: [turbo]\n          accepted_settings: [top_k]\n"
                )
            )
        )
    message = caught.value.message
    assert (
        "models.m2.capabilities.codemode=supported but the openai implementation declares unsupported"
        in message
    )
    assert 'models.m2.effort_levels contains "turbo"' in message
    assert 'models.m2.accepted_settings contains "top_k"' in message


def test_probe_evidence_resolves_only_what_is_unknown_for_one_model() -> None:
    code = code_declaration("llm", "m")
    evidence = {
        Capability.EFFORT: CapabilityState.SUPPORTED,
        Capability.PERSONA: CapabilityState.UNSUPPORTED,
        Capability.CODEMODE: CapabilityState.SUPPORTED,  # the code cannot carry it: stays unsupported
    }
    resolved = resolve_unknown(code, "m", evidence)
    _, entry = resolved.for_model("m")
    assert entry.state(Capability.EFFORT) is CapabilityState.SUPPORTED
    assert entry.state(Capability.PERSONA) is CapabilityState.UNSUPPORTED
    assert entry.state(Capability.CODEMODE) is CapabilityState.UNSUPPORTED
    assert resolved.state(Capability.EFFORT) is CapabilityState.UNKNOWN  # other models: unchanged
    assert resolved.version != code.version


# --- structured output that strict servers accept --------------------------------------

STRICT_READY = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["answer", "tags"],
}


@pytest.mark.parametrize(
    ("schema", "strict"),
    [
        (STRICT_READY, {**STRICT_READY, "additionalProperties": False}),
        (  # an optional property that admits null: requiring it keeps every output valid
            {"type": "object", "properties": {"note": {"type": ["string", "null"]}}, "title": "T"},
            {
                "type": "object",
                "properties": {"note": {"type": ["string", "null"]}},
                "required": ["note"],
                "additionalProperties": False,
            },
        ),
        (
            {"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]},
            {
                "type": "object",
                "properties": {"kind": {"enum": ["a"]}},
                "required": ["kind"],
                "additionalProperties": False,
            },
        ),
        ({"type": "object", "properties": {"note": {"type": "string"}}}, None),  # optional, not nullable
        (
            {"type": "object", "properties": {"n": {"type": "string", "minLength": 1}}, "required": ["n"]},
            None,
        ),
        (
            {"type": "object", "properties": {"u": {"type": "string", "format": "uri"}}, "required": ["u"]},
            None,
        ),
        ({"type": "object"}, None),  # free-form: strict mode would allow only {}
        ({"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}}]}, None),
        ({"type": "object", "properties": {"a": {}}, "required": ["a"]}, None),  # any value
        ({"type": "object", "properties": {}, "required": ["ghost"]}, None),
    ],
)
def test_strict_form(schema: dict[str, Any], strict: dict[str, Any] | None) -> None:
    assert strict_form(schema) == strict
    sent = response_format(schema, strict=True)["json_schema"]
    assert isinstance(sent, dict)
    if strict is None:
        assert (sent["strict"], sent["schema"]) == (False, schema)
    else:
        assert (sent["strict"], sent["schema"]) == (True, strict)


async def test_produce_sends_the_strict_form_and_validates_against_the_callers_schema(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, mock: MockOpenAI
) -> None:
    mock.structured = {"answer": "42", "tags": []}
    ready = pb.ProduceRequest(adapter="llm", prompt="p", output_schema=json.dumps(STRICT_READY))
    response = await stub.Produce(ready, timeout=5)
    assert json.loads(response.output_json) == {"answer": "42", "tags": []}
    optional = {"type": "object", "properties": {"answer": {"type": "string"}, "extra": {"type": "integer"}}}
    mock.structured = {"answer": "42"}
    await stub.Produce(
        pb.ProduceRequest(adapter="llm", prompt="p", output_schema=json.dumps(optional)), timeout=5
    )
    loose = pb.ProduceRequest(
        adapter="llm",
        prompt="p",
        output_schema=json.dumps(STRICT_READY),
        options=pb.CallOptions(model="mock-loose"),
    )
    mock.structured = {"answer": "42", "tags": ["x"]}
    await stub.Produce(loose, timeout=5)
    sent = [request.body["response_format"]["json_schema"] for request in mock.requests]
    assert [(s["strict"], s["schema"]) for s in sent] == [
        (True, {**STRICT_READY, "additionalProperties": False}),
        (False, optional),  # no strict form: the caller's schema, not strict
        (False, STRICT_READY),  # strict_schema: false for this model
    ]
    # The caller's schema still judges the output.
    mock.structured = {"answer": 42, "tags": []}
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Produce(ready, timeout=5)
    assert caught.value.code() is not grpc.StatusCode.OK
