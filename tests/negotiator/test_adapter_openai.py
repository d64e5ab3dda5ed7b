"""The OpenAI-compatible adapter against a real local HTTP server speaking the wire format."""

from __future__ import annotations

import asyncio
import email.utils
import json
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import grpc
import pytest
from mock_openai import MockOpenAI
from negotiator_testkit import NEGOTIATOR_BIN

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.adapters.openai import OpenAIAdapter, retry_after_seconds
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterKind,
    AdapterSpec,
    CallOptions,
    Capability,
    CapabilityState,
    DeclarationOverride,
)
from tests.procs import start_process

KEY_ENV = "NEGOTIATOR_TEST_OPENAI_KEY"
KEY = "sk-test-not-a-real-key-123"
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "contact": {"type": "string", "format": "email"}},
    "required": ["answer", "contact"],
    "additionalProperties": False,
}


@pytest.fixture
def server() -> Iterator[MockOpenAI]:
    with MockOpenAI() as mock:
        yield mock


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def openai_spec(base_url: str, declaration: DeclarationOverride | None = None, **options: Any) -> AdapterSpec:
    return AdapterSpec(
        shortname="llm",
        implementation="openai",
        declaration=declaration,
        options=MappingProxyType(
            {"base_url": base_url, "api_key_env": KEY_ENV, "model": "mock-model-1", **options}
        ),
    )


@pytest.fixture
async def adapter(server: MockOpenAI, api_key: str) -> AsyncIterator[OpenAIAdapter]:
    built = build_adapter(openai_spec(server.base_url))
    assert isinstance(built, OpenAIAdapter)
    yield built
    await built.close()


async def built(spec: AdapterSpec) -> OpenAIAdapter:
    adapter = build_adapter(spec)
    assert isinstance(adapter, OpenAIAdapter)
    return adapter


def call(prompt: str = "Say hello.", time_budget: float | None = None, **options: Any) -> AdapterCall:
    return AdapterCall(prompt=prompt, options=CallOptions(**options), time_budget=time_budget)


def produce_call(
    prompt: str = "Give the answer.", schema: dict[str, Any] | None = None, **options: Any
) -> AdapterCall:
    budget = options.pop("time_budget", None)
    return AdapterCall(
        prompt=prompt, options=CallOptions(**options), output_schema=schema or SCHEMA, time_budget=budget
    )


async def test_invoke_sends_a_chat_completion_and_returns_the_content(
    adapter: OpenAIAdapter, server: MockOpenAI
) -> None:
    server.reply_text = "Hello there."
    reply = await adapter.invoke(call("Say hello."))
    assert reply.text == "Hello there."
    [request] = server.requests
    assert request.method == "POST"
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert request.body == {"model": "mock-model-1", "messages": [{"role": "user", "content": "Say hello."}]}


async def test_produce_asks_for_a_strict_json_schema_and_returns_the_text_as_is(
    adapter: OpenAIAdapter, server: MockOpenAI
) -> None:
    server.structured = {"answer": "42", "contact": "ops@example.com"}
    reply = await adapter.produce(produce_call())
    assert json.loads(reply.text) == {"answer": "42", "contact": "ops@example.com"}
    [request] = server.requests
    assert request.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": SCHEMA, "strict": True},
    }
    assert "reasoning_effort" not in request.body


async def test_produce_passes_invalid_json_through_for_the_broker_to_judge(
    adapter: OpenAIAdapter, server: MockOpenAI
) -> None:
    server.structured = {"answer": 42}  # violates the schema: the broker's job, not ours
    assert json.loads((await adapter.produce(produce_call())).text) == {"answer": 42}


# What an operator states for a server that honours effort and settings (the code declares them UNKNOWN).
VOUCHED = DeclarationOverride(
    capabilities=MappingProxyType(
        {Capability.EFFORT: CapabilityState.SUPPORTED, Capability.SETTINGS: CapabilityState.SUPPORTED}
    )
)


async def test_settings_model_and_effort_reach_the_request(server: MockOpenAI, api_key: str) -> None:
    adapter = await built(openai_spec(server.base_url, declaration=VOUCHED))
    settings = MappingProxyType(
        {
            "max_tokens": 256.0,  # protobuf Struct numbers arrive as doubles
            "temperature": 0.5,
            "seed": 7.0,
            "stop": ["END"],
            "logit_bias": MappingProxyType({"50256": -100.0}),
        }
    )
    try:
        await adapter.invoke(call(model="mock-model-2", effort="high", settings=settings))
    finally:
        await adapter.close()
    body = server.requests[0].body
    assert body["model"] == "mock-model-2"
    assert body["reasoning_effort"] == "high"
    assert body["max_tokens"] == 256
    assert type(body["max_tokens"]) is int
    assert type(body["seed"]) is int
    assert body["temperature"] == 0.5
    assert body["stop"] == ["END"]
    assert body["logit_bias"] == {"50256": -100}


async def test_the_key_is_read_at_call_time(
    adapter: OpenAIAdapter, server: MockOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    await adapter.invoke(call())
    monkeypatch.setenv(KEY_ENV, "sk-rotated")
    await adapter.invoke(call())
    assert [r.headers["authorization"] for r in server.requests] == [f"Bearer {KEY}", "Bearer sk-rotated"]


async def test_one_pooled_connection_is_reused(adapter: OpenAIAdapter, server: MockOpenAI) -> None:
    for _ in range(3):
        await adapter.invoke(call())
    assert len(server.requests) == 3
    assert len({r.client_port for r in server.requests}) == 1


async def test_organization_header(server: MockOpenAI, api_key: str) -> None:
    adapter = await built(openai_spec(server.base_url + "/", organization="org-mock"))
    try:
        await adapter.invoke(call())
    finally:
        await adapter.close()
    assert server.requests[0].headers["openai-organization"] == "org-mock"
    assert server.requests[0].path == "/v1/chat/completions"  # the trailing slash is not doubled


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "error_class", "fragment"),
    [
        ("401", errors.AdapterMisconfigured, "Incorrect API key"),
        ("403", errors.AdapterMisconfigured, "not allowed"),
        ("429", errors.AdapterRateLimited, "Rate limit"),
        ("500", errors.AdapterUnavailable, "HTTP 500"),
        ("400", errors.AdapterRefused, "Invalid schema"),
        ("malformed", errors.AdapterInternal, "not JSON"),
        ("no_choices", errors.AdapterInternal, "no choices"),
        ("refusal", errors.AdapterRefused, "can't help with that"),
        ("length", errors.AdapterInternal, "output truncated by max tokens"),
    ],
)
async def test_provider_failures_map_to_the_taxonomy(
    adapter: OpenAIAdapter,
    server: MockOpenAI,
    mode: str,
    error_class: type[errors.AdapterFailure],
    fragment: str,
) -> None:
    server.mode = mode
    with pytest.raises(error_class) as raised:
        await adapter.produce(produce_call())
    assert type(raised.value) is error_class
    assert raised.value.adapter == "llm"
    assert fragment in raised.value.cause
    assert KEY not in str(raised.value)


async def test_rate_limit_keeps_retry_after(adapter: OpenAIAdapter, server: MockOpenAI) -> None:
    server.mode = "429"
    server.retry_after = "7"
    with pytest.raises(errors.AdapterRateLimited) as raised:
        await adapter.invoke(call())
    assert raised.value.retry_after == 7.0


async def test_a_truncated_invoke_still_returns_its_text(adapter: OpenAIAdapter, server: MockOpenAI) -> None:
    server.mode = "length"
    server.reply_text = "abcdefgh"
    assert (await adapter.invoke(call())).text == "abcd"


@pytest.mark.slow
async def test_a_hanging_provider_times_out_at_the_time_budget(
    adapter: OpenAIAdapter, server: MockOpenAI
) -> None:
    server.mode = "hang"
    started = time.monotonic()
    with pytest.raises(errors.AdapterTimeout) as raised:
        await adapter.invoke(call(time_budget=0.5))
    elapsed = time.monotonic() - started
    assert 0.4 < elapsed < 2.0
    assert "time budget" in raised.value.cause


@pytest.mark.slow
async def test_a_hanging_provider_times_out_at_timeout_seconds(server: MockOpenAI, api_key: str) -> None:
    server.mode = "hang"
    adapter = await built(openai_spec(server.base_url, timeout_seconds=0.3))
    started = time.monotonic()
    try:
        with pytest.raises(errors.AdapterTimeout, match="timeout_seconds"):
            await adapter.invoke(call(time_budget=30))
    finally:
        await adapter.close()
    assert time.monotonic() - started < 2.0


@pytest.mark.slow
async def test_one_deadline_bounds_the_whole_exchange_while_bytes_keep_arriving(api_key: str) -> None:
    # A body trickling in a byte every 50 ms never lets a per-read timer expire;
    # only a bound on the whole exchange ends the call at the caller's deadline.
    handlers: list[asyncio.Task[Any]] = []

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.append(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n"
            )
            for _ in range(200):
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.05)
        except ConnectionError:
            pass  # the adapter gave up and dropped the connection
        finally:
            writer.close()

    server = await asyncio.start_server(trickle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    adapter = await built(openai_spec(f"http://127.0.0.1:{port}/v1"))
    started = time.monotonic()
    try:
        with pytest.raises(errors.AdapterTimeout, match="time budget"):
            await adapter.invoke(call(time_budget=0.5))
        elapsed = time.monotonic() - started
    finally:
        await adapter.close()
        server.close()
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()
    assert handlers, "the request never reached the server"
    assert 0.4 < elapsed < 2.0


async def test_cancellation_abandons_the_request(adapter: OpenAIAdapter, server: MockOpenAI) -> None:
    server.mode = "hang"
    task = asyncio.create_task(adapter.invoke(call()))
    for _ in range(200):
        if server.requests:
            break
        await asyncio.sleep(0.01)
    assert server.requests, "the request never reached the server"
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 0.5
    # The pool still works afterwards.
    server.mode = "ok"
    assert (await adapter.invoke(call())).text == server.reply_text


async def test_connection_refused_is_unavailable(api_key: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    adapter = await built(openai_spec(f"http://127.0.0.1:{port}/v1"))
    try:
        with pytest.raises(errors.AdapterUnavailable, match="cannot reach"):
            await adapter.invoke(call(time_budget=5))
    finally:
        await adapter.close()


async def test_a_missing_key_is_misconfigured_and_sends_nothing(
    server: MockOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    adapter = await built(openai_spec(server.base_url))
    try:
        with pytest.raises(errors.AdapterMisconfigured, match=KEY_ENV):
            await adapter.invoke(call())
    finally:
        await adapter.close()
    assert server.requests == []


async def test_a_closed_adapter_is_unavailable(server: MockOpenAI, api_key: str) -> None:
    adapter = await built(openai_spec(server.base_url))
    await adapter.close()
    with pytest.raises(errors.AdapterUnavailable, match="closed"):
        await adapter.invoke(call())


async def test_unsupported_fields_are_refused_before_any_request(
    adapter: OpenAIAdapter, server: MockOpenAI
) -> None:
    with pytest.raises(errors.AdapterRefused) as raised:
        await adapter.invoke(call(profile="fast"))
    assert "options.profile" in raised.value.cause
    with pytest.raises(errors.AdapterRefused, match="accepted_settings:tools"):
        await adapter.invoke(call(settings=MappingProxyType({"tools": []})))
    uri_schema = {"type": "object", "properties": {"u": {"type": "string", "format": "uri"}}}
    with pytest.raises(errors.AdapterRefused, match="string_formats:uri"):
        await adapter.produce(produce_call(schema=uri_schema))
    assert server.requests == []


async def test_declaration(adapter: OpenAIAdapter) -> None:
    declaration = adapter.declaration
    assert declaration.kind is AdapterKind.FRAMEWORK
    assert declaration.shortname == "llm"
    assert not declaration.scripted
    supported = {c for c in Capability if declaration.state(c) is CapabilityState.SUPPORTED}
    assert supported == {
        Capability.STRUCTURED_OUTPUT,
        Capability.MODEL_OVERRIDE,
        Capability.STATEFUL_HISTORY,
        Capability.TOOL_REGISTRATION,
        Capability.TOOL_FILTER,
        Capability.MCP,
        # The adapter's own SSE reading and tool loop report them, whatever the server.
        Capability.STREAM_EVENTS,
    }
    assert declaration.mcp_transports == {"stdio", "http", "sse"}
    # Carried by the code, honoured or ignored by the server alone: unknown until config says.
    unknown = {Capability.EFFORT, Capability.SETTINGS, Capability.PERSONA}
    assert {c for c in Capability if declaration.state(c) is CapabilityState.UNKNOWN} == unknown
    assert all(
        declaration.state(c) is CapabilityState.UNSUPPORTED for c in set(Capability) - supported - unknown
    )
    assert declaration.default_model == "mock-model-1"
    assert declaration.effort_levels == {"none", "minimal", "low", "medium", "high", "xhigh"}
    assert declaration.string_formats == {
        "date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"
    }  # fmt: skip
    assert "max_completion_tokens" in declaration.accepted_settings
    assert "service_tier" in declaration.accepted_settings


async def test_config_narrowing_is_enforced(server: MockOpenAI, api_key: str) -> None:
    narrowed = DeclarationOverride(
        capabilities=MappingProxyType(
            {Capability.EFFORT: CapabilityState.UNSUPPORTED, Capability.SETTINGS: CapabilityState.SUPPORTED}
        ),
        accepted_settings=frozenset({"temperature"}),
    )
    adapter = await built(openai_spec(server.base_url, declaration=narrowed))
    try:
        with pytest.raises(errors.AdapterRefused, match=r"options.effort"):
            await adapter.invoke(call(effort="low"))
        with pytest.raises(errors.AdapterRefused, match="accepted_settings:seed"):
            await adapter.invoke(call(settings=MappingProxyType({"seed": 1})))
        await adapter.invoke(call(settings=MappingProxyType({"temperature": 0})))
    finally:
        await adapter.close()
    assert len(server.requests) == 1


def test_config_may_not_widen(server: MockOpenAI) -> None:
    widening = DeclarationOverride(string_formats=frozenset({"uri"}))
    with pytest.raises(errors.ConfigError, match="uri"):
        build_adapter(openai_spec(server.base_url, declaration=widening))


_REQUIRED = {"base_url": "http://127.0.0.1:1/v1", "api_key_env": "K", "model": "m"}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"api_key_env": "K", "model": "m"}, "base_url"),
        ({**_REQUIRED, "base_url": "ftp://example/v1"}, "base_url"),
        ({**_REQUIRED, "base_url": "not a url"}, "base_url"),
        ({"base_url": "http://127.0.0.1:1/v1", "model": "m"}, "api_key_env"),
        ({"base_url": "http://127.0.0.1:1/v1", "api_key_env": "K"}, "model"),
        ({**_REQUIRED, "timeout_seconds": -1}, "timeout_seconds"),
        ({**_REQUIRED, "organization": 7}, "organization"),
        ({**_REQUIRED, "api_key": "sk-x"}, "api_key"),
    ],
)
def test_bad_options_are_config_errors_naming_the_option(options: dict[str, Any], named: str) -> None:
    spec = AdapterSpec(shortname="llm", implementation="openai", options=MappingProxyType(options))
    with pytest.raises(errors.ConfigError) as raised:
        build_adapter(spec)
    assert '"llm"' in raised.value.message
    assert f"`{named}`" in raised.value.message


def test_retry_after_forms() -> None:
    assert retry_after_seconds({"Retry-After": "3"}) == 3.0
    assert retry_after_seconds({"retry-after-ms": "1500", "Retry-After": "9"}) == 1.5
    now = time.time()
    later = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after_seconds({"Retry-After": later}, now=now) == pytest.approx(30, abs=1)
    assert retry_after_seconds({"Retry-After": "soon"}) is None
    assert retry_after_seconds({}) is None


def serve_with_llm(
    server: MockOpenAI, tmp_path: Path, *flags: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], Path]:
    """`negotiator serve` as a process, with one openai adapter "llm" on the mock; it and its socket."""
    config = tmp_path / "negotiator.yaml"
    adapter = {
        "shortname": "llm",
        "implementation": "openai",
        "options": {"base_url": server.base_url, "api_key_env": KEY_ENV, "model": "gpt-test"},
    }
    config.write_text(json.dumps({"adapters": [adapter]}))
    socket_path = tmp_path / "n.sock"
    process, _ = start_process(
        [str(NEGOTIATOR_BIN), "serve", "--config", str(config), "--listen", f"unix:{socket_path}", *flags],
        env={"XDG_STATE_HOME": str(tmp_path / "state"), **(env or {})},
    )
    return process, socket_path


@pytest.mark.slow
async def test_negotiator_serve_logs_an_openai_call_once_in_its_call_log_and_not_per_http_request(
    server: MockOpenAI, api_key: str, tmp_path: Path
) -> None:
    process, socket_path = serve_with_llm(server, tmp_path)
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            request = negotiator_pb2.InvokeRequest(adapter="llm", prompt="hi")
            for _ in range(3):
                assert (await stub.Invoke(request, timeout=10)).text == server.reply_text
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(process.communicate, timeout=15)
    calls = [json.loads(line) for line in stderr.splitlines() if '"method":"Invoke"' in line]
    assert [(call["method"], call["status"]) for call in calls] == [("Invoke", "OK")] * 3
    assert len(server.requests) == 3
    assert "HTTP Request" not in stderr


@pytest.mark.slow
@pytest.mark.parametrize("otel", [True, False])
async def test_with_otel_the_provider_request_carries_the_callers_trace(
    otel: bool, server: MockOpenAI, api_key: str, tmp_path: Path
) -> None:
    flags = ["--otel"] if otel else []
    process, socket_path = serve_with_llm(server, tmp_path, *flags, env={"OTEL_TRACES_EXPORTER": "none"})
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            await stub.Invoke(
                negotiator_pb2.InvokeRequest(adapter="llm", prompt="hi"),
                timeout=10,
                metadata=(("traceparent", f"00-{trace_id}-b7ad6b7169203331-01"),),
            )
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.communicate, timeout=15)
    (request,) = server.requests
    if otel:
        assert request.headers["traceparent"].split("-")[1] == trace_id
    else:
        assert "traceparent" not in request.headers
