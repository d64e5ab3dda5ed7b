"""The openai adapter's request surface: each setting, its typed value check, the persona role, max tokens.

Through a real negotiator on a real socket, with the local mock recording the exact body it received.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from types import MappingProxyType
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from mock_openai import MockOpenAI
from negotiator_testkit import call_error
from test_tools import Caller, Stub, tool

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.adapters.openai import OpenAIAdapter
from agentsidecar.negotiator_service.adapters.openai_settings import ACCEPTED_SETTINGS
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterSpec,
    CallOptions,
    Capability,
    CapabilityState,
    DeclarationOverride,
)
from agentsidecar.negotiator_service.registry import RegisteredAdapter
from agentsidecar.negotiator_service.server import RunningNegotiator

KEY_ENV = "NEGOTIATOR_TEST_OPENAI_SURFACE_KEY"
SUPPORTED = CapabilityState.SUPPORTED


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    with MockOpenAI() as server:
        yield server


def surface_spec(base_url: str) -> AdapterSpec:
    # The operator states settings and persona for this (mock) server; the code alone says UNKNOWN.
    return AdapterSpec(
        shortname="llm",
        implementation="openai",
        declaration=DeclarationOverride(
            capabilities=MappingProxyType({Capability.SETTINGS: SUPPORTED, Capability.PERSONA: SUPPORTED})
        ),
        options=MappingProxyType(
            {
                "base_url": base_url,
                "api_key_env": KEY_ENV,
                "model": "mock-chat",
                "models": {
                    "mock-reasoning": {
                        "max_tokens_field": "max_completion_tokens",
                        "persona_role": "developer",
                    },
                    "mock-legacy": {"max_tokens_field": "max_tokens"},
                },
            }
        ),
    )


@pytest.fixture
async def llm(mock: MockOpenAI, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[OpenAIAdapter]:
    monkeypatch.setenv(KEY_ENV, "sk-test-surface")
    adapter = build_adapter(surface_spec(mock.base_url))
    assert isinstance(adapter, OpenAIAdapter)
    yield adapter
    await adapter.close()


@pytest.fixture
def registered(negotiator: RunningNegotiator, llm: OpenAIAdapter) -> OpenAIAdapter:
    negotiator.registry.add(RegisteredAdapter(adapter=llm, source="config"))
    return llm


def settings(**values: Any) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


def invoke(**options: Any) -> pb.InvokeRequest:
    return pb.InvokeRequest(adapter="llm", prompt="hi", options=pb.CallOptions(**options))


EVERY_PLAIN_SETTING = {
    "temperature": 0.5,
    "top_p": 0.9,
    "presence_penalty": -1.5,
    "frequency_penalty": 2,
    "max_completion_tokens": 256,
    "seed": 42,
    "stop": ["END", "\n\n"],
    "logit_bias": {"50256": -100},
    "user": "user-1",
    "safety_identifier": "hashed-user-1",
    "prompt_cache_key": "cache-key-1",
    "service_tier": "flex",
    "metadata": {"team": "docs", "ticket": "T-1"},
    "logprobs": True,
    "top_logprobs": 3,
}


async def test_every_setting_reaches_the_provider_exactly_as_sent(
    stub: Stub, mock: MockOpenAI, registered: OpenAIAdapter
) -> None:
    response = await stub.Invoke(invoke(settings=settings(**EVERY_PLAIN_SETTING)), timeout=10)
    assert response.text == mock.reply_text
    (request,) = mock.requests
    body = request.body
    sent = {key: body[key] for key in EVERY_PLAIN_SETTING}
    assert sent == EVERY_PLAIN_SETTING
    # Integers go as integers, not as the doubles a Struct carries.
    assert all(isinstance(body[k], int) for k in ("max_completion_tokens", "seed", "top_logprobs"))
    assert set(ACCEPTED_SETTINGS) - set(EVERY_PLAIN_SETTING) == {
        "max_tokens",
        "tool_choice",
        "parallel_tool_calls",
    }


async def test_tool_choice_and_parallel_tool_calls_go_beside_the_tools(
    stub: Stub, mock: MockOpenAI, registered: OpenAIAdapter
) -> None:
    choice = {"type": "function", "function": {"name": "lookup"}}
    caller = Caller(stub)
    await caller.start(
        invoke(settings=settings(tool_choice=choice, parallel_tool_calls=False)), [tool("lookup")]
    )
    assert await caller.final_text() == mock.reply_text
    (request,) = mock.requests
    assert request.body["tool_choice"] == choice
    assert request.body["parallel_tool_calls"] is False
    assert [t["function"]["name"] for t in request.body["tools"]] == ["lookup"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("values", "field", "problem"),
    [
        ({"temperature": 2.5}, "temperature", "must be a number from 0 to 2"),
        ({"temperature": "hot"}, "temperature", "must be a number from 0 to 2"),
        ({"top_p": 1.1}, "top_p", "must be a number from 0 to 1"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "must be a positive integer"),
        ({"max_tokens": 12.5}, "max_tokens", "must be a positive integer"),
        ({"seed": 1.5}, "seed", "must be an integer"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "a list of 1 to 4 non-empty strings"),
        ({"stop": 7}, "stop", "must be a string or a list"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "at most 16 string pairs"),
        ({"metadata": {"k": 1}}, "metadata", 'value of "k" must be a string'),
        ({"service_tier": "gold"}, "service_tier", "must be one of auto, default, flex, scale, priority"),
        ({"logprobs": "yes"}, "logprobs", "must be true or false"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "from 0 to 20"),
        ({"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
        ({"tool_choice": "auto"}, "tool_choice", "needs tools: the model is offered none"),
        ({"parallel_tool_calls": True}, "parallel_tool_calls", "needs tools"),
        ({"max_tokens": 5, "max_completion_tokens": 5}, "max_completion_tokens", "not both"),
        ({"n": 2}, "n", "cannot return n choices"),
        ({"reasoning_effort": "high"}, "reasoning_effort", "send the level as options.effort"),
        ({"user": "x" * 513}, "user", "at most 512 characters"),
    ],
)
async def test_a_bad_setting_is_invalid_before_dispatch(
    stub: Stub,
    mock: MockOpenAI,
    registered: OpenAIAdapter,
    values: dict[str, Any],
    field: str,
    problem: str,
) -> None:
    error = await call_error(stub.Invoke(invoke(settings=settings(**values)), timeout=10))
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    violations = dict(error.field_violations)
    assert problem in violations[f"options.settings.{field}"]
    # The dry run refuses it the same way, the field under the call.
    dry = await call_error(stub.Negotiate(pb.NegotiateRequest(invoke=invoke(settings=settings(**values)))))
    assert problem in dict(dry.field_violations)[f"invoke.options.settings.{field}"]
    assert mock.requests == []


async def test_tool_choice_must_name_a_tool_the_model_is_offered(
    stub: Stub, mock: MockOpenAI, registered: OpenAIAdapter
) -> None:
    hidden = {"type": "function", "function": {"name": "secret"}}
    caller = Caller(stub)
    request = invoke(settings=settings(tool_choice=hidden), tool_filter=pb.ToolFilter(deny=["secret"]))
    await caller.start(request, [tool("lookup"), tool("secret")])
    error = await caller.error()
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    problem = dict(error.field_violations)["start.invoke.options.settings.tool_choice"]
    assert problem == 'names no tool the model is offered in this call: "secret"'
    assert mock.requests == []


async def test_an_unknown_setting_is_still_a_declared_gap(
    stub: Stub, mock: MockOpenAI, registered: OpenAIAdapter
) -> None:
    error = await call_error(stub.Invoke(invoke(settings=settings(best_of=3)), timeout=10))
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UNSUPPORTED_CAPABILITY")
    assert error.metadata["gaps"] == "accepted_settings:best_of"
    assert mock.requests == []


@pytest.mark.parametrize(
    ("model", "sent_as", "role"),
    [
        ("mock-reasoning", "max_completion_tokens", "developer"),
        ("mock-legacy", "max_tokens", "system"),
    ],
)
@pytest.mark.parametrize("caller_field", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_and_the_persona_role_follow_the_models_options(
    stub: Stub,
    mock: MockOpenAI,
    negotiator: RunningNegotiator,
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    sent_as: str,
    role: str,
    caller_field: str,
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-surface")
    spec = surface_spec(mock.base_url)
    # model_override too: the call names its model.
    declaration = DeclarationOverride(
        capabilities=MappingProxyType(
            {**spec.declaration.capabilities, Capability.MODEL_OVERRIDE: SUPPORTED}  # type: ignore[union-attr]
        )
    )
    adapter = build_adapter(AdapterSpec(spec.shortname, spec.implementation, declaration, spec.options))
    negotiator.registry.add(RegisteredAdapter(adapter=adapter, source="config"))
    options = {"model": model, "persona": "Be terse.", "settings": settings(**{caller_field: 64})}
    await stub.Invoke(invoke(**options), timeout=10)
    (request,) = mock.requests
    body = request.body
    assert body[sent_as] == 64
    assert {"max_tokens", "max_completion_tokens"} & set(body) == {sent_as}
    assert body["messages"][0] == {"role": role, "content": "Be terse."}


async def test_a_model_without_max_tokens_field_gets_the_name_the_caller_used(
    stub: Stub, mock: MockOpenAI, registered: OpenAIAdapter
) -> None:
    await stub.Invoke(invoke(persona="Be terse.", settings=settings(max_tokens=9)), timeout=10)
    (request,) = mock.requests
    assert request.body["max_tokens"] == 9
    assert "max_completion_tokens" not in request.body
    assert request.body["messages"][0]["role"] == "system"


async def test_the_adapter_refuses_a_bad_value_at_its_edge_before_any_request(
    mock: MockOpenAI, llm: OpenAIAdapter
) -> None:
    call = AdapterCall(
        prompt="hi",
        options=CallOptions(
            settings=MappingProxyType({"temperature": 3.0, "tool_choice": "required"}),
            allow_unknown=frozenset(),
        ),
    )
    with pytest.raises(errors.AdapterRefused) as refused:
        await llm.invoke(call)
    assert "setting temperature must be a number from 0 to 2" in refused.value.message
    assert "setting tool_choice needs tools" in refused.value.message
    assert mock.requests == []


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_tokens_field": "max_output_tokens"}, "max_tokens_field"),
        ({"models": {"m": {"persona_role": "user"}}}, "models.m.persona_role"),
    ],
)
def test_bad_model_options_are_config_errors(mock: MockOpenAI, options: dict[str, Any], named: str) -> None:
    spec = surface_spec(mock.base_url)
    spec = AdapterSpec(
        spec.shortname, spec.implementation, None, MappingProxyType({**spec.options, **options})
    )
    with pytest.raises(errors.ConfigError) as raised:
        build_adapter(spec)
    assert named in raised.value.message
    assert json.dumps(named)[1:-1] in raised.value.message
