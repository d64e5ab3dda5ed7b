"""Bearer tokens, TLS and mutual TLS, socket permissions: on the probe and on both real services."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import grpc
import pytest
from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from agentsidecar.seedstore.v1 import seedstore_pb2, seedstore_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from negotiator_service import server as negotiator_server
from seedstore_service import server as seedstore_server
from sidecar_runtime.auth import (
    DOMAIN,
    AuthConfigError,
    EnvToken,
    TlsFiles,
    TokenFile,
    bearer_values,
    judge,
    parse_tokens,
)
from sidecar_runtime.richstatus import DecodedError, decode_error
from sidecar_runtime.server import ServerOptions

from .runtime_support import MUTATE, Pki, StartProbe, tls_channel, unary

TOKEN = "s3cret-token"
UDS = grpc.LocalConnectionType.UDS
LOCAL_TCP = grpc.LocalConnectionType.LOCAL_TCP


def tokens(*values: str) -> EnvToken:
    return EnvToken("SIDECAR_TOKEN", tuple(v.encode() for v in values))


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def local_channel(
    target: str, token: str | None = None, kind: grpc.LocalConnectionType = UDS
) -> grpc.aio.Channel:
    credentials = grpc.local_channel_credentials(kind)
    if token is not None:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token)
        )
    return grpc.aio.secure_channel(target, credentials)


async def rpc_error(call: Awaitable[object]) -> DecodedError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return decode_error(caught.value)


def assert_missing(error: DecodedError, method: str) -> None:
    assert error.code == grpc.StatusCode.UNAUTHENTICATED
    assert (error.domain, error.reason) == (DOMAIN, "TOKEN_MISSING")
    assert error.metadata == {"method": method}
    assert "authorization: Bearer" in error.message


def assert_invalid(error: DecodedError, method: str) -> None:
    assert error.code == grpc.StatusCode.PERMISSION_DENIED
    assert (error.domain, error.reason) == (DOMAIN, "TOKEN_INVALID")
    assert error.metadata == {"method": method}
    assert TOKEN not in error.message


# --- the probe ----------------------------------------------------------------------


async def test_tokens_over_a_unix_socket_with_local_credentials(start_probe: StartProbe) -> None:
    server = await start_probe(tokens=tokens(TOKEN))
    unix = server.bound[0]
    async with local_channel(unix) as anonymous:
        assert_missing(await rpc_error(unary(anonymous, "Mutate", timeout=5)), MUTATE)
        assert await unary(anonymous, "Echo", b"reads are open", timeout=5) == b"reads are open"
    async with local_channel(unix, "wrong-token") as wrong:
        assert_invalid(await rpc_error(unary(wrong, "Mutate", timeout=5)), MUTATE)
    async with local_channel(unix, TOKEN) as right:
        assert await unary(right, "Mutate", timeout=5) == b"done"
    # Plaintext clients still connect to the socket and may send the header themselves.
    async with grpc.aio.insecure_channel(unix) as plain:
        assert await unary(plain, "Mutate", metadata=bearer(TOKEN), timeout=5) == b"done"
        assert_invalid(await rpc_error(unary(plain, "Mutate", metadata=bearer("x"), timeout=5)), MUTATE)


async def test_tokens_on_loopback_tcp(start_probe: StartProbe) -> None:
    server = await start_probe(tokens=tokens(TOKEN))
    tcp = server.bound[1]
    assert tcp.startswith("127.0.0.1:")
    async with local_channel(tcp, TOKEN, LOCAL_TCP) as right:
        assert await unary(right, "Mutate", timeout=5) == b"done"
    async with grpc.aio.insecure_channel(tcp) as plain:
        assert_missing(await rpc_error(unary(plain, "Mutate", timeout=5)), MUTATE)
        assert await unary(plain, "Mutate", metadata=bearer(TOKEN), timeout=5) == b"done"


async def test_several_tokens_any_of_them_is_accepted(start_probe: StartProbe) -> None:
    server = await start_probe(tokens=tokens("old-token", "new-token"))
    async with grpc.aio.insecure_channel(server.bound[0]) as channel:
        for token in ("old-token", "new-token"):
            assert await unary(channel, "Mutate", metadata=bearer(token), timeout=5) == b"done"
        assert_invalid(await rpc_error(unary(channel, "Mutate", metadata=bearer("new"), timeout=5)), MUTATE)


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "sidecar.internal:50061"])
async def test_a_token_on_plaintext_network_tcp_refuses_to_start(
    start_probe: StartProbe, listen: str
) -> None:
    with pytest.raises(AuthConfigError, match="in clear"):
        await start_probe(listen=(listen,), tokens=tokens(TOKEN))


async def test_tls_carries_tokens_on_any_address(start_probe: StartProbe, pki: Pki) -> None:
    server = await start_probe(
        listen=("0.0.0.0:0",), tokens=tokens(TOKEN), tls=TlsFiles(pki.server_cert, pki.server_key)
    )
    target = f"127.0.0.1:{server.bound[0].rpartition(':')[2]}"
    async with tls_channel(target, pki, cert=None, key=None) as channel:
        assert await unary(channel, "Echo", b"tls", timeout=5) == b"tls"  # no client cert needed
        assert_missing(await rpc_error(unary(channel, "Mutate", timeout=5)), MUTATE)
        assert await unary(channel, "Mutate", metadata=bearer(TOKEN), timeout=5) == b"done"
    async with grpc.aio.insecure_channel(target) as plaintext:
        error = await rpc_error(unary(plaintext, "Echo", b"x", timeout=2))
        assert error.code == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_requires_a_client_certificate_from_the_ca(
    start_probe: StartProbe, pki: Pki
) -> None:
    server = await start_probe(tls=TlsFiles(pki.server_cert, pki.server_key, client_ca=pki.ca))
    tcp = server.bound[1]
    async with tls_channel(tcp, pki, cert=None, key=None) as no_cert:
        assert (await rpc_error(unary(no_cert, "Echo", b"x", timeout=2))).code == grpc.StatusCode.UNAVAILABLE
    async with tls_channel(tcp, pki, cert=pki.other_client_cert, key=pki.other_client_key) as stranger:
        assert (await rpc_error(unary(stranger, "Echo", b"x", timeout=2))).code == grpc.StatusCode.UNAVAILABLE
    async with tls_channel(tcp, pki, cert=pki.client_cert, key=pki.client_key) as client:
        assert await unary(client, "Echo", b"mtls", timeout=5) == b"mtls"
        assert await unary(client, "Mutate", timeout=5) == b"done"  # no token configured
    # TLS is for TCP: the Unix socket is guarded by its file permissions.
    async with grpc.aio.insecure_channel(server.bound[0]) as unix:
        assert await unary(unix, "Echo", b"uds", timeout=5) == b"uds"


async def test_unreadable_tls_files_are_named(start_probe: StartProbe, pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(AuthConfigError, match=r"--tls-client-ca .*missing\.pem"):
        await start_probe(tls=TlsFiles(pki.server_cert, pki.server_key, client_ca=tmp_path / "missing.pem"))


def socket_mode(path: Path) -> int:
    info = path.stat()
    assert stat.S_ISSOCK(info.st_mode)
    return stat.S_IMODE(info.st_mode)


async def test_socket_files_get_restrictive_configurable_permissions(
    start_probe: StartProbe, socket_dir: Path
) -> None:
    server = await start_probe()
    assert socket_mode(socket_dir / "probe.sock") == 0o660
    await server.stop()
    health = socket_dir / "health.sock"
    await start_probe(unix_socket_mode=0o600, health_listen=(f"unix:{health}",), tokens=tokens(TOKEN))
    assert socket_mode(socket_dir / "probe.sock") == 0o600
    assert socket_mode(health) == 0o600
    # The health-only listener answers probes, and nothing else.
    async with grpc.aio.insecure_channel(f"unix:{health}") as channel:
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert (await check).status == health_pb2.HealthCheckResponse.SERVING
        assert (
            await rpc_error(unary(channel, "Echo", b"x", timeout=5))
        ).code == grpc.StatusCode.UNIMPLEMENTED


# --- token sources and header parsing ------------------------------------------------------


def test_token_text_one_per_line_with_comments() -> None:
    text = "# rotated 2026-11\nold-token\n\n  new-token==  \n"
    assert parse_tokens(text, "f") == (b"old-token", b"new-token==")
    with pytest.raises(AuthConfigError, match="holds no token"):
        parse_tokens("# nothing\n\n", "f")
    with pytest.raises(AuthConfigError, match="line 2: a token may only use"):
        parse_tokens("good\nhas space\n", "f")


def test_env_token_must_be_set() -> None:
    assert EnvToken.read("T", {"T": TOKEN}).tokens() == (TOKEN.encode(),)
    with pytest.raises(AuthConfigError, match="--token-env T: the variable is not set or empty"):
        EnvToken.read("T", {"T": ""})


def test_token_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("first-token\n")
    source = TokenFile(path, check_every=0)
    assert source.tokens() == (b"first-token",)
    path.write_text("first-token\nsecond-token\n")
    assert source.tokens() == (b"first-token", b"second-token")
    # Mid-swap (empty, then missing) the last good tokens stay.
    path.write_text("")
    assert source.tokens() == (b"first-token", b"second-token")
    path.unlink()
    assert source.tokens() == (b"first-token", b"second-token")
    path.write_text("third-token\n")
    assert source.tokens() == (b"third-token",)
    with pytest.raises(AuthConfigError, match="cannot read"):
        TokenFile(tmp_path / "absent")


def test_bearer_header_parsing() -> None:
    assert bearer_values([("authorization", "Bearer abc")]) == [b"abc"]
    assert bearer_values([("authorization", "bearer   abc  ")]) == [b"abc"]
    assert bearer_values([("authorization", "Basic abc"), ("x-other", "Bearer no")]) == []
    assert bearer_values([("authorization", "Bearer ")]) == []
    accepted = (b"abc",)
    missing = judge("/s/M", [("authorization", "Basic abc")], accepted)
    assert missing is not None
    assert missing.reason == "TOKEN_MISSING"
    assert judge("/s/M", [("authorization", "Bearer zzz"), ("authorization", "Bearer abc")], accepted) is None
    wrong = judge("/s/M", [("authorization", "Bearer abcd")], accepted)
    assert wrong is not None
    assert wrong.reason == "TOKEN_INVALID"


# --- the real services ----------------------------------------------------------------------


def test_mutating_method_lists_name_real_methods() -> None:
    for module, service in (
        (seedstore_server, seedstore_pb2.DESCRIPTOR.services_by_name["SeedStoreService"]),
        (negotiator_server, negotiator_pb2.DESCRIPTOR.services_by_name["NegotiatorService"]),
    ):
        known = {f"/{service.full_name}/{m.name}" for m in service.methods}
        assert known >= module.MUTATING_METHODS
    seedstore_methods = {name.rpartition("/")[2] for name in seedstore_server.MUTATING_METHODS}
    assert seedstore_methods == {"AddSeed", "UpdateSeed", "PreferSeed", "RemoveSeed", "VerifySeeds"}
    negotiator_methods = {name.rpartition("/")[2] for name in negotiator_server.MUTATING_METHODS}
    assert negotiator_methods == {"RegisterAdapter", "DeregisterAdapter"}


@pytest.fixture
async def seedstore(tmp_path: Path, socket_dir: Path) -> AsyncIterator[seedstore_server.SeedStoreServer]:
    settings = seedstore_server.Settings(
        listen=(f"unix:{socket_dir / 'seedstore.sock'}",),
        store_root=tmp_path / "home" / "capabilities",
        equivalents_file=None,
        grace_seconds=0.5,
        server_options=ServerOptions(listen=(), tokens=tokens(TOKEN)),
    )
    running = await seedstore_server.create_server(settings)
    yield running
    await running.stop()


async def test_seedstore_writes_need_the_token_reads_do_not(
    seedstore: seedstore_server.SeedStoreServer, tmp_path: Path
) -> None:
    service = seedstore_pb2.DESCRIPTOR.services_by_name["SeedStoreService"].full_name
    seed = seedstore_pb2.AddSeedRequest(
        id="voice-cli", domain="voice", kind="cli", command="voice-cli", provides=["text_to_speech"]
    )
    async with local_channel(seedstore.bound[0]) as anonymous:
        stub = seedstore_pb2_grpc.SeedStoreServiceStub(anonymous)
        assert_missing(await rpc_error(stub.AddSeed(seed, timeout=5)), f"/{service}/AddSeed")
        verify = stub.VerifySeeds(seedstore_pb2.VerifySeedsRequest(ids=["voice-cli"]), timeout=5)
        assert_missing(await rpc_error(verify.read()), f"/{service}/VerifySeeds")
        listing = await stub.ListSeeds(seedstore_pb2.ListSeedsRequest(), timeout=5)
        assert list(listing.seeds) == []
    assert not (tmp_path / "home" / "capabilities" / "voice" / "voice-cli.yml").exists()
    async with local_channel(seedstore.bound[0], "not-it") as wrong:
        stub = seedstore_pb2_grpc.SeedStoreServiceStub(wrong)
        assert_invalid(await rpc_error(stub.AddSeed(seed, timeout=5)), f"/{service}/AddSeed")
    async with local_channel(seedstore.bound[0], TOKEN) as right:
        stub = seedstore_pb2_grpc.SeedStoreServiceStub(right)
        await stub.AddSeed(seed, timeout=5)
        assert (tmp_path / "home" / "capabilities" / "voice" / "voice-cli.yml").exists()
        removed = await stub.RemoveSeed(seedstore_pb2.RemoveSeedRequest(id="voice-cli"), timeout=5)
        assert removed.id == "voice-cli"


async def test_negotiator_registration_needs_the_token(socket_dir: Path) -> None:
    service = negotiator_pb2.DESCRIPTOR.services_by_name["NegotiatorService"].full_name
    settings = negotiator_server.Settings(
        listen=(f"unix:{socket_dir / 'negotiator.sock'}",),
        grace_seconds=0.5,
        server_options=ServerOptions(listen=(), tokens=tokens(TOKEN)),
    )
    negotiator = await negotiator_server.create_server(settings)
    try:
        async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            register = negotiator_pb2.RegisterAdapterRequest(target=f"unix:{socket_dir / 'nobody.sock'}")
            error = await rpc_error(stub.RegisterAdapter(register, timeout=5))
            assert_missing(error, f"/{service}/RegisterAdapter")
            deregister = negotiator_pb2.DeregisterAdapterRequest(shortname="demo")
            error = await rpc_error(stub.DeregisterAdapter(deregister, metadata=bearer("nope"), timeout=5))
            assert_invalid(error, f"/{service}/DeregisterAdapter")
            # With the token the call reaches the service, which has its own reasons to refuse.
            error = await rpc_error(stub.DeregisterAdapter(deregister, metadata=bearer(TOKEN), timeout=5))
            assert error.domain != DOMAIN
            assert error.code == grpc.StatusCode.FAILED_PRECONDITION  # config adapters stay
            listing = await stub.ListAdapters(negotiator_pb2.ListAdaptersRequest(), timeout=5)
            assert "demo" in {adapter.declaration.shortname for adapter in listing.adapters}
    finally:
        await negotiator.stop()
