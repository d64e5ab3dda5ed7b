"""The HTTP request a unary openai call sends, and how its answer is read, against real local servers.

Each test pins one thing the client's own `send` would do for the request that
the adapter's exchange must still do (or must still not do): the proxy the
environment names, the client's default headers (compression allowed), the
cookies a provider sets, redirects left unfollowed, the byte cap after content
decoding, URL credentials, and a closed adapter sending nothing.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
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
    AdapterSpec,
    CallOptions,
    JsonValue,
    ToolOutcome,
)

pytestmark = pytest.mark.slow

KEY_ENV = "NEGOTIATOR_TEST_OPENAI_UNARY_HTTP_KEY"
KEY = "sk-test-unary-http"


def _completion(text: str) -> bytes:
    return json.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
        }
    ).encode()


@dataclass(frozen=True, slots=True)
class Answer:
    """One scripted HTTP answer."""

    body: bytes
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    gzip_body: bool = False


@dataclass(frozen=True, slots=True)
class Seen:
    method: str
    target: str
    headers: dict[str, str]


@dataclass(slots=True)
class _Script:
    answers: list[Answer]
    seen: list[Seen] = field(default_factory=list)


class Upstream:
    """A local HTTP/1.1 server answering each request with the next scripted answer (the last repeats).

    Records each request's method, target (absolute when it is used as a forward
    proxy) and lower-cased headers.
    """

    def __init__(self, *answers: Answer) -> None:
        script = _Script(list(answers))
        self._script = script

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                script.seen.append(
                    Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
                )
                answer = script.answers[min(len(script.seen), len(script.answers)) - 1]
                body = gzip.compress(answer.body) if answer.gzip_body else answer.body
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                if answer.gzip_body:
                    self.send_header("Content-Encoding", "gzip")
                for name, value in answer.headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = _answer
            do_GET = _answer

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def seen(self) -> list[Seen]:
        return self._script.seen

    def __enter__(self) -> Upstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)


def _adapter(base_url: str, **options: Any) -> OpenAIAdapter:
    adapter = build_adapter(
        AdapterSpec(
            shortname="llm",
            implementation="openai",
            options=MappingProxyType(
                {"base_url": base_url, "api_key_env": KEY_ENV, "model": "mock-model-1", **options}
            ),
        )
    )
    assert isinstance(adapter, OpenAIAdapter)
    return adapter


def _call(prompt: str = "hi") -> AdapterCall:
    return AdapterCall(prompt=prompt, options=CallOptions())


async def test_a_unary_call_goes_through_the_proxy_the_environment_names(
    no_proxy_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Upstream(Answer(_completion("proxied"))) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.origin)
        adapter = _adapter("http://upstream.invalid/v1")
        try:
            reply = await adapter.invoke(_call())
        finally:
            await adapter.close()
    assert reply.text == "proxied"
    [seen] = proxy.seen
    assert seen.target == "http://upstream.invalid/v1/chat/completions"
    assert seen.headers["host"] == "upstream.invalid"


async def test_a_unary_call_sends_the_clients_default_headers_and_takes_a_compressed_reply(
    no_proxy_env: None,
) -> None:
    with Upstream(Answer(_completion("zipped"), gzip_body=True)) as upstream:
        adapter = _adapter(f"{upstream.origin}/v1", organization="org-7")
        try:
            reply = await adapter.invoke(_call())
        finally:
            await adapter.close()
    assert reply.text == "zipped"
    [seen] = upstream.seen
    assert seen.method == "POST"
    assert seen.target == "/v1/chat/completions"
    headers = seen.headers
    # Unlike a stream, a unary reply may come compressed.
    assert "gzip" in headers["accept-encoding"]
    assert headers["accept"] == "*/*"
    assert headers["user-agent"].startswith("agentsidecar/")
    assert headers["connection"] == "keep-alive"
    assert headers["authorization"] == f"Bearer {KEY}"
    assert headers["openai-organization"] == "org-7"
    assert headers["content-type"] == "application/json"
    assert headers["host"] == upstream.origin.removeprefix("http://")


async def test_cookies_a_provider_sets_are_sent_back_on_later_calls(no_proxy_env: None) -> None:
    first = Answer(_completion("one"), headers=(("Set-Cookie", "affinity=node-3; Path=/"),))
    with Upstream(first, Answer(_completion("two"))) as upstream:
        adapter = _adapter(f"{upstream.origin}/v1")
        try:
            assert (await adapter.invoke(_call())).text == "one"
            assert (await adapter.invoke(_call())).text == "two"
        finally:
            await adapter.close()
    assert "cookie" not in upstream.seen[0].headers
    assert upstream.seen[1].headers["cookie"] == "affinity=node-3"
    # The request still carries every other header the client adds.
    assert upstream.seen[1].headers["authorization"] == f"Bearer {KEY}"
    assert upstream.seen[1].headers["user-agent"].startswith("agentsidecar/")


async def test_a_redirect_is_not_followed_with_or_without_cookies_held(no_proxy_env: None) -> None:
    moved = (("Location", "/elsewhere"), ("Set-Cookie", "affinity=node-3; Path=/"))
    with Upstream(Answer(b"", status=307, headers=moved)) as upstream:
        adapter = _adapter(f"{upstream.origin}/v1")
        try:
            for _ in range(2):  # the second call holds the cookie the first answer set
                with pytest.raises(errors.AdapterInternal, match="unexpected HTTP 307"):
                    await adapter.invoke(_call())
        finally:
            await adapter.close()
    assert [seen.target for seen in upstream.seen] == ["/v1/chat/completions"] * 2
    assert upstream.seen[1].headers["cookie"] == "affinity=node-3"


async def test_the_byte_cap_holds_for_the_decoded_body(no_proxy_env: None) -> None:
    # Some 200 bytes on the wire, over 4 KiB once decoded.
    body = _completion("x" * 8000)
    with Upstream(Answer(body, gzip_body=True)) as upstream:
        adapter = _adapter(f"{upstream.origin}/v1", max_response_bytes=4096)
        try:
            with pytest.raises(errors.AdapterReplyTooLarge, match="sent more than 4096 bytes"):
                await adapter.invoke(_call())
        finally:
            await adapter.close()


async def test_credentials_in_the_base_url_are_sent_as_the_client_sends_them(no_proxy_env: None) -> None:
    with Upstream(Answer(_completion("ok"))) as upstream:
        adapter = _adapter(upstream.origin.replace("http://", "http://user:secret@") + "/v1")
        try:
            assert (await adapter.invoke(_call())).text == "ok"
        finally:
            await adapter.close()
    [seen] = upstream.seen
    # httpx's client turns URL credentials into Basic auth.
    assert seen.headers["authorization"] == "Basic dXNlcjpzZWNyZXQ="


class _ClosingToolBox(LocalToolBox):
    """Closes the adapter while its tool runs, as a shutdown during a tool round would."""

    def __init__(self, adapter: OpenAIAdapter) -> None:
        super().__init__("lookup")
        self._adapter = adapter

    async def call(self, name: str, arguments: JsonValue) -> ToolOutcome:
        await self._adapter.close()
        return await super().call(name, arguments)


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    with MockOpenAI() as server:
        yield server


async def test_a_call_whose_adapter_closed_during_a_tool_round_sends_no_further_request(
    mock: MockOpenAI,
) -> None:
    adapter = _adapter(mock.base_url)
    mock.tool_rounds = [[{"id": "call_1", "name": "lookup", "arguments": {"key": "a"}}]]
    call = AdapterCall(prompt="use the tool", options=CallOptions(), tools=_ClosingToolBox(adapter))
    with pytest.raises(errors.AdapterUnavailable, match="the adapter is closed"):
        await adapter.invoke(call)
    assert len(mock.requests) == 1
