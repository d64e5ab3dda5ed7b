"""Channels: the retry policy, bearer tokens over each transport, TLS, and what is refused."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from agentsidecar.clients import (
    AsyncSeedStoreClient,
    SeedStoreClient,
    TlsConfig,
    UnavailableError,
    open_channel,
)
from agentsidecar.clients.channel import (
    IDEMPOTENT_METHODS,
    NEGOTIATOR_SERVICE,
    SEEDSTORE_SERVICE,
    is_loopback_host,
    retry_service_config,
)
from tests.clients.sidecars import FakeServer

FLAKY = {"ListSeeds": 2, "SearchSeeds": 2, "AddSeed": 2, "UpdateSeed": 2}


# --- retry -----------------------------------------------------------------------------------


def test_the_service_config_retries_unavailable_on_idempotent_methods_only() -> None:
    config = json.loads(retry_service_config())
    (method_config,) = config["methodConfig"]
    names = {(n["service"], n["method"]) for n in method_config["name"]}
    assert names == {
        (SEEDSTORE_SERVICE, m) for m in ("GetStore", "ListSeeds", "SearchSeeds", "InspectSeed", "ScanSeeds")
    } | {(NEGOTIATOR_SERVICE, m) for m in ("ListAdapters", "GetAdapter", "Negotiate")}
    never = {"Produce", "Invoke", "AddSeed", "UpdateSeed", "PreferSeed", "RemoveSeed", "VerifySeeds"}
    never |= {"RegisterAdapter", "DeregisterAdapter"}
    assert never.isdisjoint(m for _, m in names)
    assert method_config["retryPolicy"] == {
        "maxAttempts": 4,
        "initialBackoff": "0.1s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    assert set(IDEMPOTENT_METHODS) == {SEEDSTORE_SERVICE, NEGOTIATOR_SERVICE}


def test_the_service_names_are_the_generated_descriptors() -> None:
    from agentsidecar.negotiator.v1 import negotiator_pb2
    from agentsidecar.seedstore.v1 import seedstore_pb2

    assert seedstore_pb2.DESCRIPTOR.services_by_name["SeedStoreService"].full_name == SEEDSTORE_SERVICE
    assert negotiator_pb2.DESCRIPTOR.services_by_name["NegotiatorService"].full_name == NEGOTIATOR_SERVICE


@pytest.mark.slow
def test_sync_idempotent_call_succeeds_on_the_third_attempt(start_fake: Callable[..., FakeServer]) -> None:
    server = start_fake(fail_first=FLAKY)
    with SeedStoreClient(server.unix, timeout=10) as client:
        assert client.list_seeds().seeds == []
        assert server.fake.attempts["ListSeeds"] == 3
        with pytest.raises(UnavailableError, match="flaky AddSeed, attempt 1"):
            client.add_seed(id="x", domain="d", kind="cli", provides=["p"])
        assert server.fake.attempts["AddSeed"] == 1


async def test_async_idempotent_call_succeeds_on_the_third_attempt(
    start_fake: Callable[..., FakeServer],
) -> None:
    server = start_fake(fail_first=FLAKY)
    async with AsyncSeedStoreClient(server.tcp, timeout=10) as client:
        await client.search_seeds(capability="tts")
        assert server.fake.attempts["SearchSeeds"] == 3
        with pytest.raises(UnavailableError):
            await client.update_seed(id="x", add_aliases=["y"])
        assert server.fake.attempts["UpdateSeed"] == 1


def test_without_retry_an_idempotent_call_fails_after_one_attempt(
    start_fake: Callable[..., FakeServer],
) -> None:
    server = start_fake(fail_first=FLAKY)
    with SeedStoreClient(server.unix, retry=False) as client, pytest.raises(UnavailableError):
        client.list_seeds()
    assert server.fake.attempts["ListSeeds"] == 1


# --- bearer tokens ---------------------------------------------------------------------------


def test_a_token_rides_local_credentials_over_a_unix_socket(start_fake: Callable[..., FakeServer]) -> None:
    server = start_fake()
    with SeedStoreClient(server.unix, token="s3cret") as client:
        client.get_store()
        stream = client.watch_seeds(domain="voice")  # a stream carries it too
        next(stream)
        stream.close()
    assert server.fake.authorization() == ["Bearer s3cret", "Bearer s3cret"]


async def test_a_token_rides_metadata_to_a_loopback_tcp_host(start_fake: Callable[..., FakeServer]) -> None:
    server = start_fake()
    port = server.tcp.rpartition(":")[2]
    with SeedStoreClient(f"localhost:{port}", token="sync-token") as sync_client:
        sync_client.get_store()
        stream = sync_client.watch()
        next(stream)
        stream.close()
    async with AsyncSeedStoreClient(server.tcp, token="aio-token") as aio_client:
        await aio_client.scan_seeds()
        async for _ in aio_client.watch():
            break
    assert server.fake.authorization() == [
        "Bearer sync-token",
        "Bearer sync-token",
        "Bearer aio-token",
        "Bearer aio-token",
    ]


# Each records whether the bearer token's interceptor ran before it (it should: the token first).
_SEEN_AUTHORIZATION: list[tuple[str, bool]] = []


class _SyncTagging(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        _SEEN_AUTHORIZATION.append(("sync", any(k == "authorization" for k, _ in details.metadata or ())))
        tagged = details._replace(metadata=(*(details.metadata or ()), ("x-tag", "sync")))
        return continuation(tagged, request)


class _AioTagging(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        _SEEN_AUTHORIZATION.append(("aio", any(k == "authorization" for k, _ in details.metadata or ())))
        metadata = grpc.aio.Metadata(*(details.metadata or ()), ("x-tag", "aio"))
        tagged = grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )
        return await continuation(tagged, request)


async def test_extra_interceptors_run_after_the_token(start_fake: Callable[..., FakeServer]) -> None:
    server = start_fake()
    _SEEN_AUTHORIZATION.clear()
    sync_channel = open_channel(server.tcp, token="t1", interceptors=[_SyncTagging()])
    with SeedStoreClient(channel=sync_channel) as sync_client:
        sync_client.get_store()
    sync_channel.close()
    aio_channel = open_channel(server.tcp, aio=True, token="t2", interceptors=[_AioTagging()])
    async with AsyncSeedStoreClient(channel=aio_channel) as aio_client:
        await aio_client.get_store()
    await aio_channel.close(None)
    seen = [(m.get("authorization", ""), m.get("x-tag")) for _, m in server.fake.metadata]
    assert seen == [("Bearer t1", "sync"), ("Bearer t2", "aio")]
    assert _SEEN_AUTHORIZATION == [("sync", True), ("aio", True)]


def test_no_token_means_no_authorization_header(start_fake: Callable[..., FakeServer]) -> None:
    server = start_fake()
    with SeedStoreClient(server.tcp) as client:
        client.get_store()
    assert server.fake.authorization() == [""]


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_a_token_file_is_reread_when_it_changes(
    start_fake: Callable[..., FakeServer], tmp_path: Path, transport: str
) -> None:
    server = start_fake()
    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    os.utime(token_file, ns=(1_000_000_000, 1_000_000_000))
    with SeedStoreClient(getattr(server, transport), token_file=token_file) as client:
        client.get_store()
        token_file.write_text("second\n")
        os.utime(token_file, ns=(2_000_000_000, 2_000_000_000))
        client.get_store()
    assert server.fake.authorization() == ["Bearer first", "Bearer second"]


@pytest.mark.parametrize("target", ["10.1.2.3:50061", "sidecar.internal:50061", "[2001:db8::1]:443"])
def test_a_token_in_clear_text_to_a_remote_host_is_refused(target: str) -> None:
    with pytest.raises(ValueError, match="refusing to send a bearer token in clear text"):
        open_channel(target, token="s3cret")
    open_channel(target).close()  # without a token it is only a plain channel


def test_token_arguments_are_checked_when_the_channel_opens(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not both"):
        open_channel("unix:/tmp/x.sock", token="a", token_file=tmp_path / "t")
    with pytest.raises(FileNotFoundError):
        open_channel("unix:/tmp/x.sock", token_file=tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty bearer token"):
        open_channel("unix:/tmp/x.sock", token_file=tmp_path / "empty")
    with pytest.raises(ValueError, match="unix:PATH or HOST:PORT"):
        open_channel("no-port-here")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.9.8.7", True),
        ("localhost", True),
        ("[::1]", True),
        ("::1", True),
        ("10.0.0.1", False),
        ("[2001:db8::1]", False),
        ("localhost.example.com", False),
        ("0.0.0.0", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


# --- TLS -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for the name `sidecar.test` only (not for 127.0.0.1)."""
    directory = tmp_path_factory.mktemp("pki")
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/CN=sidecar.test", "-addext", "subjectAltName=DNS:sidecar.test",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return key, cert


@pytest.mark.slow
async def test_tls_with_a_token_and_a_server_name_override(
    start_fake: Callable[..., FakeServer], certificate: tuple[Path, Path]
) -> None:
    key, cert = certificate
    server = start_fake(tls=(key.read_bytes(), cert.read_bytes()))
    assert server.tls_tcp is not None
    tls = TlsConfig(ca=cert, server_name="sidecar.test")
    with SeedStoreClient(server.tls_tcp, tls=tls, token="over-tls") as client:
        client.get_store()
    async with AsyncSeedStoreClient(
        server.tls_tcp, tls=TlsConfig(ca=cert.read_bytes(), server_name="sidecar.test")
    ) as aio:
        await aio.get_store()
    assert server.fake.authorization() == ["Bearer over-tls", ""]

    # The certificate does not name 127.0.0.1: without the override the handshake fails.
    with (
        SeedStoreClient(server.tls_tcp, tls=TlsConfig(ca=cert), timeout=5) as client,
        pytest.raises(UnavailableError),
    ):
        client.get_store()
    assert len(server.fake.metadata) == 2


def test_a_client_certificate_needs_its_key() -> None:
    with pytest.raises(ValueError, match="cert and key go together"):
        open_channel("127.0.0.1:1", tls=TlsConfig(cert=b"pem"))
