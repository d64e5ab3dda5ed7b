"""The HTTP request a streamed openai call sends, and the bodies it reads, against real local servers."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any

import pytest
from mock_openai import MockOpenAI
from test_tools_openai import LocalToolBox

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.adapters.openai import OpenAIAdapter
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterReply,
    AdapterSpec,
    CallKind,
    CallOptions,
    JsonValue,
    StreamDelta,
    ToolOutcome,
)

KEY_ENV = "NEGOTIATOR_TEST_OPENAI_STREAM_HTTP_KEY"


def _spec(base_url: str) -> AdapterSpec:
    return AdapterSpec(
        shortname="llm",
        implementation="openai",
        options=MappingProxyType({"base_url": base_url, "api_key_env": KEY_ENV, "model": "mock-model-1"}),
    )


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    with MockOpenAI() as server:
        yield server


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-stream-http")


async def _adapter(base_url: str) -> OpenAIAdapter:
    adapter = build_adapter(_spec(base_url))
    assert isinstance(adapter, OpenAIAdapter)
    return adapter


@pytest.fixture
async def llm(mock: MockOpenAI, key: None) -> AsyncIterator[OpenAIAdapter]:
    adapter = await _adapter(mock.base_url)
    yield adapter
    await adapter.close()


async def _streamed(adapter: OpenAIAdapter) -> tuple[list[str], AdapterReply]:
    deltas: list[str] = []
    reply: AdapterReply | None = None
    async for item in adapter.stream(AdapterCall(prompt="hi", options=CallOptions()), CallKind.INVOKE):
        if isinstance(item, StreamDelta):
            deltas.append(item.text)
        elif isinstance(item, AdapterReply):
            reply = item
    assert reply is not None
    return deltas, reply


async def test_a_streamed_request_asks_for_no_compression_and_keeps_the_clients_headers(
    llm: OpenAIAdapter, mock: MockOpenAI
) -> None:
    mock.stream_chunks = ["po", "ng"]
    deltas, reply = await _streamed(llm)
    assert deltas == ["po", "ng"]
    assert reply.text == "pong"
    [request] = mock.requests
    headers = request.headers
    # Compression would hold deltas back until a compressed block fills.
    assert headers["accept-encoding"] == "identity"
    assert headers["authorization"] == "Bearer sk-test-stream-http"
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"].startswith("agentsidecar/")
    assert headers["accept"] == "*/*"
    assert request.body["stream"] is True


def _sse_body() -> bytes:
    def event(payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return (
        event({**base, "choices": [{"index": 0, "delta": {"content": "zip"}, "finish_reason": None}]})
        + event({**base, "choices": [{"index": 0, "delta": {"content": "ped"}, "finish_reason": None}]})
        + event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        + b"data: [DONE]\n\n"
    )


class _Upstream:
    """A local HTTP server answering every POST with one SSE body; keeps each request line and headers.

    `gzip_body` compresses the body whatever the request asked for; as a forward proxy (absolute
    request targets) it answers in the upstream's place.
    """

    def __init__(self, *, gzip_body: bool) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                upstream.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                body = gzip.compress(_sse_body()) if gzip_body else _sse_body()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                if gzip_body:
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> _Upstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


async def test_a_stream_compressed_although_identity_was_asked_for_is_decoded(key: None) -> None:
    with _Upstream(gzip_body=True) as upstream:
        adapter = await _adapter(f"{upstream.origin}/v1")
        try:
            deltas, reply = await _streamed(adapter)
        finally:
            await adapter.close()
    assert deltas == ["zip", "ped"]
    assert reply.text == "zipped"


async def test_a_stream_goes_through_the_proxy_the_environment_names(
    key: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _Upstream(gzip_body=False) as proxy:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy.origin)
        adapter = await _adapter("http://upstream.invalid/v1")
        try:
            deltas, _ = await _streamed(adapter)
        finally:
            await adapter.close()
    assert deltas == ["zip", "ped"]
    [(target, headers)] = proxy.requests
    assert target == "http://upstream.invalid/v1/chat/completions"
    assert headers["host"] == "upstream.invalid"


class _ClosingToolBox(LocalToolBox):
    """Closes the adapter while its tool runs, as a shutdown during a tool round would."""

    def __init__(self, adapter: OpenAIAdapter) -> None:
        super().__init__("lookup")
        self._adapter = adapter

    async def call(self, name: str, arguments: JsonValue) -> ToolOutcome:
        await self._adapter.close()
        return await super().call(name, arguments)


async def test_a_stream_whose_adapter_closed_during_a_tool_round_sends_no_further_request(
    llm: OpenAIAdapter, mock: MockOpenAI
) -> None:
    mock.tool_rounds = [[{"id": "call_1", "name": "lookup", "arguments": {"key": "a"}}]]
    call = AdapterCall(prompt="use the tool", options=CallOptions(), tools=_ClosingToolBox(llm))
    with pytest.raises(errors.AdapterUnavailable, match="the adapter is closed"):
        [item async for item in llm.stream(call, CallKind.INVOKE)]
    assert len(mock.requests) == 1
