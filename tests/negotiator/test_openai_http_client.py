"""The openai adapter's HTTP client against raw local servers: what reaches the wire and how failures map.

Each server here is an asyncio TCP server on loopback that records the raw
request and answers with scripted raw bytes, so a test can pin the request
bytes the adapter sends (its JSON body, the proxy's credentials), answer with
something no well-behaved server sends (a cut-off body, a broken head, a body
that does not decode), serve https with a certificate of a CA made for the
test, and see the connection the adapter holds close.
`environment_proxy`, the adapter's reading of the proxy variables, is checked
case by case against what httpx's client does for the same variables.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.adapters.openai import OpenAIAdapter, environment_proxy
from agentsidecar.negotiator_service.model import AdapterCall, AdapterSpec, CallOptions

KEY_ENV = "NEGOTIATOR_TEST_OPENAI_HTTP_CLIENT_KEY"
KEY = "sk-test-http-client"
PROXY_VARIABLES = ("no_proxy", "all_proxy", "http_proxy", "https_proxy")


def completion(text: str) -> bytes:
    body = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    }
    return json.dumps(body).encode()


def response(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", "Content-Type: application/json", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass(slots=True)
class RawServer:
    """Answers each request with `answer(head)`'s bytes; keeps each request's head and body.

    With `keep_alive` off, the connection ends after the first answer.
    """

    answer: Callable[[bytes], bytes]
    keep_alive: bool = True
    requests: list[tuple[bytes, bytes]] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # a connection was closed by the client
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.closed.set()
                    return
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                reply = self.answer(head)
                writer.write(reply)
                await writer.drain()
                if not self.keep_alive:
                    return
        except ConnectionError:
            self.closed.set()
        finally:
            writer.close()

    def heads(self) -> list[dict[str, str]]:
        """Each request's header fields, names lower-cased, and its request line under ''."""
        parsed = []
        for head, _ in self.requests:
            request_line, *lines = head.decode("latin-1").split("\r\n")
            fields = {"": request_line}
            for line in filter(None, lines):
                name, _, value = line.partition(":")
                fields[name.strip().lower()] = value.strip()
            parsed.append(fields)
        return parsed


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    servers: list[asyncio.Server] = []

    async def start(
        answer: Callable[[bytes], bytes], *, keep_alive: bool = True, tls: ssl.SSLContext | None = None
    ) -> RawServer:
        raw = RawServer(answer, keep_alive)
        server = await asyncio.start_server(raw.serve, "127.0.0.1", 0, ssl=tls)
        raw.port = server.sockets[0].getsockname()[1]
        servers.append(server)
        return raw

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def adapter_for(base_url: str) -> OpenAIAdapter:
    adapter = build_adapter(
        AdapterSpec(
            shortname="llm",
            implementation="openai",
            options=MappingProxyType({"base_url": base_url, "api_key_env": KEY_ENV, "model": "m"}),
        )
    )
    assert isinstance(adapter, OpenAIAdapter)
    return adapter


async def invoke(adapter: OpenAIAdapter, prompt: str = "hi") -> str:
    try:
        return (await adapter.invoke(AdapterCall(prompt=prompt, options=CallOptions()))).text
    finally:
        await adapter.close()


async def test_the_body_is_json_as_httpx_encodes_it_compact_and_utf8(serve: Any) -> None:
    upstream = await serve(lambda head: response(completion("ok")))
    assert await invoke(adapter_for(f"http://127.0.0.1:{upstream.port}/v1"), "héllo ☃") == "ok"
    [(_, body)] = upstream.requests
    expected = {"model": "m", "messages": [{"role": "user", "content": "héllo ☃"}]}
    assert body == json.dumps(expected, ensure_ascii=False, separators=(",", ":")).encode()
    [fields] = upstream.heads()
    assert fields["content-type"] == "application/json"
    assert fields["content-length"] == str(len(body))


async def test_no_proxy_naming_the_host_sends_the_call_directly(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await serve(lambda head: response(completion("via the proxy")))
    upstream = await serve(lambda head: response(completion("direct")))
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("NO_PROXY", "example.invalid, 127.0.0.1")
    assert await invoke(adapter_for(f"http://127.0.0.1:{upstream.port}/v1")) == "direct"
    assert proxy.requests == []
    assert upstream.heads()[0][""] == "POST /v1/chat/completions HTTP/1.1"


async def test_all_proxy_is_used_and_credentials_in_the_proxy_url_become_proxy_authorization(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await serve(lambda head: response(completion("proxied")))
    monkeypatch.setenv("ALL_PROXY", f"http://agent:s3cret@127.0.0.1:{proxy.port}")
    assert await invoke(adapter_for("http://upstream.invalid:8000/v1")) == "proxied"
    [fields] = proxy.heads()
    assert fields[""] == "POST http://upstream.invalid:8000/v1/chat/completions HTTP/1.1"
    assert fields["proxy-authorization"] == "Basic YWdlbnQ6czNjcmV0"  # agent:s3cret
    assert fields["authorization"] == f"Bearer {KEY}"


async def test_a_netrc_entry_for_the_host_changes_nothing(
    serve: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # httpx's client never read ~/.netrc; a session trusting the environment would, and then
    # refuses to send an Authorization header beside the credentials it found.
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password other\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    upstream = await serve(lambda head: response(completion("ok")))
    assert await invoke(adapter_for(f"http://127.0.0.1:{upstream.port}/v1")) == "ok"
    assert upstream.heads()[0]["authorization"] == f"Bearer {KEY}"


def test_a_socks_proxy_in_the_environment_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(errors.ConfigError, match=r"not an http:// or https:// proxy"):
        adapter_for("http://upstream.invalid/v1")


@pytest.mark.parametrize(
    ("answer", "failure", "message"),
    [
        # The body stops short of its Content-Length, or inside a chunk, and the connection ends.
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
            errors.AdapterUnavailable,
            "cannot reach",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{",
            errors.AdapterUnavailable,
            "cannot reach",
        ),
        # A head that is not HTTP.
        (b"HTTP/1.1 200 OK\r\nnot a header line\r\n\r\n", errors.AdapterUnavailable, "cannot reach"),
        # The connection ends before any answer.
        (b"", errors.AdapterUnavailable, "cannot reach"),
        # A body declared gzip that does not decode.
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n\r\n"
            b"\x1f\x8b\x08\x00 not gzip at all",
            errors.AdapterInternal,
            "HTTP exchange with http://127.0.0.1:.*/v1/chat/completions failed: ClientPayloadError",
        ),
    ],
    ids=["cut-off-body", "cut-off-chunk", "broken-head", "no-answer", "undecodable-body"],
)
async def test_a_broken_answer_maps_to_the_adapter_error_it_stands_for(
    serve: Any, answer: bytes, failure: type[errors.AdapterFailure], message: str
) -> None:
    upstream = await serve(lambda head: answer, keep_alive=False)
    with pytest.raises(failure, match=message) as raised:
        await invoke(adapter_for(f"http://127.0.0.1:{upstream.port}/v1"))
    assert raised.value.adapter == "llm"


async def test_a_broken_stream_is_unavailable(serve: Any) -> None:
    cut = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 400\r\n\r\ndata: {"
    upstream = await serve(lambda head: cut, keep_alive=False)
    adapter = adapter_for(f"http://127.0.0.1:{upstream.port}/v1")
    call = AdapterCall(prompt="hi", options=CallOptions(stream_events=True))
    try:
        with pytest.raises(errors.AdapterUnavailable, match="cannot reach"):
            await adapter.invoke(call)
    finally:
        await adapter.close()


def _openssl(directory: Path, *args: str) -> None:
    result = subprocess.run(["openssl", *args], cwd=directory, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA (ca.pem) and a server certificate for 127.0.0.1 it signed (server.pem, server.key)."""
    directory = tmp_path_factory.mktemp("pki")
    _openssl(directory, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key")
    _openssl(
        directory, "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=test-ca", "-days", "1",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
        "-out", "ca.pem",
    )  # fmt: skip
    _openssl(directory, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "server.key")
    _openssl(directory, "req", "-new", "-key", "server.key", "-subj", "/CN=127.0.0.1", "-out", "server.csr")
    (directory / "server.ext").write_text("basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\n")
    _openssl(
        directory, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", "server.ext", "-out", "server.pem",
    )  # fmt: skip
    return directory


def _server_tls(pki: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    return context


async def test_https_trusts_the_bundle_ssl_cert_file_names(
    serve: Any, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(pki / "ca.pem"))
    upstream = await serve(lambda head: response(completion("over tls")), tls=_server_tls(pki))
    assert await invoke(adapter_for(f"https://127.0.0.1:{upstream.port}/v1")) == "over tls"


async def test_https_to_a_certificate_no_trusted_ca_signed_is_unavailable(
    serve: Any, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    upstream = await serve(lambda head: response(completion("over tls")), tls=_server_tls(pki))
    with pytest.raises(
        errors.AdapterUnavailable, match=r"cannot reach https://127\.0\.0\.1:.*certificate verify failed"
    ):
        await invoke(adapter_for(f"https://127.0.0.1:{upstream.port}/v1"))
    assert upstream.requests == []


async def test_closing_the_adapter_closes_its_pooled_connection(serve: Any) -> None:
    upstream = await serve(lambda head: response(completion("ok")))
    adapter = adapter_for(f"http://127.0.0.1:{upstream.port}/v1")
    assert (await adapter.invoke(AdapterCall(prompt="hi", options=CallOptions()))).text == "ok"
    assert not upstream.closed.is_set()  # kept alive for the next call
    await adapter.close()
    await asyncio.wait_for(upstream.closed.wait(), 5)


# (HTTP_PROXY etc. as urllib.request.getproxies() names them, the URL's scheme, host, port) ->
# the proxy httpx 0.28's AsyncClient(trust_env=True) mounts for that URL.
PROXY_CASES = [
    ({}, ("http", "api.example.com", None), None),
    ({"http": "proxy:3128"}, ("http", "api.example.com", None), "http://proxy:3128"),
    ({"http": "http://proxy:3128"}, ("https", "api.example.com", None), None),
    ({"https": "http://tls-proxy:3128"}, ("https", "api.example.com", None), "http://tls-proxy:3128"),
    ({"all": "http://any:1"}, ("https", "api.example.com", None), "http://any:1"),
    ({"all": "http://any:1", "http": "http://web:2"}, ("http", "h", None), "http://web:2"),
    ({"http": "http://p:1", "no": "*"}, ("http", "api.example.com", None), None),
    ({"http": "http://p:1", "no": "example.com"}, ("http", "api.example.com", None), None),
    ({"http": "http://p:1", "no": "example.com"}, ("http", "example.com", None), None),
    ({"http": "http://p:1", "no": "example.com"}, ("http", "badexample.com", None), "http://p:1"),
    ({"http": "http://p:1", "no": ".example.com"}, ("http", "example.com", None), "http://p:1"),
    ({"http": "http://p:1", "no": ".example.com"}, ("http", "api.example.com", None), None),
    ({"http": "http://p:1", "no": "localhost"}, ("http", "localhost", 8000), None),
    ({"http": "http://p:1", "no": "10.1.2.3"}, ("http", "10.1.2.3", 8000), None),
    ({"http": "http://p:1", "no": "10.1.2.3"}, ("http", "10.1.2.4", 8000), "http://p:1"),
    ({"http": "http://p:1", "no": "::1"}, ("http", "::1", 8000), None),
    ({"http": "http://p:1", "no": "example.com:8000"}, ("http", "example.com", 8000), None),
    ({"http": "http://p:1", "no": "example.com:8000"}, ("http", "example.com", 9000), "http://p:1"),
    ({"http": "http://p:1", "no": "http://internal"}, ("http", "internal", None), None),
    ({"http": "http://p:1", "no": "http://internal"}, ("http", "internal2", None), "http://p:1"),
    ({"http": "http://p:1", "no": " , EXAMPLE.com ,"}, ("http", "api.example.com", None), None),
]


@pytest.mark.parametrize(("proxies", "url", "expected"), PROXY_CASES)
def test_environment_proxy_reads_the_variables_as_httpx_does(
    proxies: dict[str, str], url: tuple[str, str, int | None], expected: str | None
) -> None:
    scheme, host, port = url
    assert environment_proxy(scheme, host, port, proxies) == expected


@pytest.mark.parametrize(("proxies", "url", "expected"), PROXY_CASES)
def test_the_proxy_cases_are_what_httpx_itself_picks(
    monkeypatch: pytest.MonkeyPatch,
    proxies: dict[str, str],
    url: tuple[str, str, int | None],
    expected: str | None,
) -> None:
    # The table above is checked against httpx's own client, so it says what httpx does.
    import httpx

    for scheme, value in proxies.items():
        monkeypatch.setenv(f"{scheme}_proxy", value)
    scheme, host, port = url
    netloc = f"[{host}]" if ":" in host else host
    target = httpx.URL(f"{scheme}://{netloc}" + (f":{port}" if port is not None else "") + "/v1")
    transport = httpx.AsyncClient(trust_env=True)._transport_for_url(target)
    proxy_url = getattr(getattr(transport, "_pool", None), "_proxy_url", None)
    picked = None if proxy_url is None else (proxy_url.scheme, proxy_url.host, proxy_url.port)
    wanted = None if expected is None else httpx.URL(expected)
    assert picked == (None if wanted is None else (wanted.raw_scheme, wanted.raw_host, wanted.port))
