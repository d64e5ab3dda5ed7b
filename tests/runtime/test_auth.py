"""Bearer tokens, TLS and mutual TLS, socket permissions: on the probe and on both real services."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from agentsidecar.negotiator_service import server as negotiator_server
from agentsidecar.seedstore.v1 import seedstore_pb2, seedstore_pb2_grpc
from agentsidecar.seedstore_service import server as seedstore_server
from agentsidecar.sidecar_runtime.auth import (
    DOMAIN,
    AuthConfigError,
    EnvToken,
    TlsFiles,
    TokenFile,
    bearer_values,
    judge,
    parse_tokens,
)
from agentsidecar.sidecar_runtime.richstatus import DecodedError, decode_error
from agentsidecar.sidecar_runtime.server import ServerOptions

from .runtime_support import MUTATE, Pki, StartProbe, method, stream, tls_channel, unary

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
    server = await start_probe(tokens=tokens(TOKEN), open_reads=True)
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


async def test_a_token_guards_every_method_but_health_and_reflection(start_probe: StartProbe) -> None:
    server = await start_probe(tokens=tokens(TOKEN))
    async with grpc.aio.insecure_channel(server.bound[0]) as channel:
        assert_missing(await rpc_error(unary(channel, "Echo", b"x", timeout=5)), method("Echo"))
        assert_missing(await rpc_error(stream(channel, "Count", b"1", timeout=5)), method("Count"))
        assert_invalid(
            await rpc_error(unary(channel, "Echo", b"x", metadata=bearer("nope"), timeout=5)), method("Echo")
        )
        assert await unary(channel, "Echo", b"x", metadata=bearer(TOKEN), timeout=5) == b"x"
        assert await stream(channel, "Count", b"1", metadata=bearer(TOKEN), timeout=5) == [b"0"]
        await assert_health_and_reflection_open(channel)
    # With open_reads the declared reads are open; the rest still needs the token.
    await server.stop()
    server = await start_probe(tokens=tokens(TOKEN), open_reads=True)
    async with grpc.aio.insecure_channel(server.bound[0]) as channel:
        assert await unary(channel, "Echo", b"x", timeout=5) == b"x"
        assert await stream(channel, "Count", b"1", timeout=5) == [b"0"]
        assert_missing(await rpc_error(unary(channel, "Mutate", timeout=5)), MUTATE)
        await assert_health_and_reflection_open(channel)


async def assert_health_and_reflection_open(channel: grpc.aio.Channel) -> None:
    check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert (await check).status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(timeout=5)
    await reflection.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    answer = await reflection.read()
    assert answer.list_services_response.service
    await reflection.done_writing()


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "sidecar.internal:50061"])
async def test_a_token_on_plaintext_network_tcp_refuses_to_start(
    start_probe: StartProbe, listen: str
) -> None:
    with pytest.raises(AuthConfigError, match="in clear"):
        await start_probe(listen=(listen,), tokens=tokens(TOKEN))


@pytest.mark.slow
async def test_tls_carries_tokens_on_any_address(start_probe: StartProbe, pki: Pki) -> None:
    server = await start_probe(
        listen=("0.0.0.0:0",),
        tokens=tokens(TOKEN),
        open_reads=True,
        tls=TlsFiles(pki.server_cert, pki.server_key),
    )
    target = f"127.0.0.1:{server.bound[0].rpartition(':')[2]}"
    async with tls_channel(target, pki, cert=None, key=None) as channel:
        assert await unary(channel, "Echo", b"tls", timeout=5) == b"tls"  # no client cert needed
        assert_missing(await rpc_error(unary(channel, "Mutate", timeout=5)), MUTATE)
        assert await unary(channel, "Mutate", metadata=bearer(TOKEN), timeout=5) == b"done"
    async with grpc.aio.insecure_channel(target) as plaintext:
        error = await rpc_error(unary(plaintext, "Echo", b"x", timeout=2))
        assert error.code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.slow
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

SEEDSTORE = seedstore_pb2.DESCRIPTOR.services_by_name["SeedStoreService"]
NEGOTIATOR = negotiator_pb2.DESCRIPTOR.services_by_name["NegotiatorService"]


def full_name(service: ServiceDescriptor, name: str) -> str:
    return f"/{service.full_name}/{name}"


def always_guarded(module: Any, service: ServiceDescriptor) -> set[str]:
    """The methods that need the token with or without --open-reads."""
    return {m.name for m in service.methods if full_name(service, m.name) not in module.READ_METHODS}


def test_read_method_lists_name_real_methods() -> None:
    for module, service in ((seedstore_server, SEEDSTORE), (negotiator_server, NEGOTIATOR)):
        known = {full_name(service, m.name) for m in service.methods}
        assert known >= module.READ_METHODS
    assert always_guarded(seedstore_server, SEEDSTORE) == {
        "AddSeed", "UpdateSeed", "PreferSeed", "RemoveSeed", "VerifySeeds",
    }  # fmt: skip
    assert always_guarded(negotiator_server, NEGOTIATOR) == {
        "RegisterAdapter", "DeregisterAdapter", "Produce", "Invoke", "ProduceStream", "InvokeStream",
        "ToolSession", "WatchAudit", "ProbeAdapter",
    }  # fmt: skip


async def empty_call(
    channel: grpc.aio.Channel, service: ServiceDescriptor, name: str, metadata: Sequence[tuple[str, str]] = ()
) -> DecodedError:
    """How a call with an empty request (every field unset) to `name` fails."""
    method = service.methods_by_name[name]
    path = full_name(service, name)
    if method.client_streaming:
        call: Any = channel.stream_stream(path, None, None)(None, metadata=metadata, timeout=5)
        return await rpc_error(call.read())
    if method.server_streaming:
        return await rpc_error(
            channel.unary_stream(path, None, None)(b"", metadata=metadata, timeout=5).read()
        )
    return await rpc_error(channel.unary_unary(path, None, None)(b"", metadata=metadata, timeout=5))


async def assert_guarded(channel: grpc.aio.Channel, service: ServiceDescriptor, names: Iterable[str]) -> None:
    for name in names:
        assert_missing(await empty_call(channel, service, name), full_name(service, name))
        assert_invalid(await empty_call(channel, service, name, bearer("nope")), full_name(service, name))


StartSeedstore = Callable[..., Awaitable[seedstore_server.SeedStoreServer]]


@pytest.fixture
async def start_seedstore(tmp_path: Path, socket_dir: Path) -> AsyncIterator[StartSeedstore]:
    running: list[seedstore_server.SeedStoreServer] = []

    async def start(*, open_reads: bool) -> seedstore_server.SeedStoreServer:
        settings = seedstore_server.Settings(
            listen=(f"unix:{socket_dir / 'seedstore.sock'}",),
            store_root=tmp_path / "home" / "capabilities",
            equivalents_file=None,
            grace_seconds=0.5,
            server_options=ServerOptions(listen=(), tokens=tokens(TOKEN), open_reads=open_reads),
        )
        running.append(await seedstore_server.create_server(settings))
        return running[-1]

    yield start
    for server in running:
        await server.stop()


@pytest.mark.slow
async def test_seedstore_writes_need_the_token_reads_do_not_with_open_reads(
    start_seedstore: StartSeedstore, tmp_path: Path
) -> None:
    seedstore = await start_seedstore(open_reads=True)
    seed = seedstore_pb2.AddSeedRequest(
        id="voice-cli", domain="voice", kind="cli", command="voice-cli", provides=["text_to_speech"]
    )
    async with local_channel(seedstore.bound[0]) as anonymous:
        stub = seedstore_pb2_grpc.SeedStoreServiceStub(anonymous)
        assert_missing(await rpc_error(stub.AddSeed(seed, timeout=5)), full_name(SEEDSTORE, "AddSeed"))
        verify = stub.VerifySeeds(seedstore_pb2.VerifySeedsRequest(ids=["voice-cli"]), timeout=5)
        assert_missing(await rpc_error(verify.read()), full_name(SEEDSTORE, "VerifySeeds"))
        listing = await stub.ListSeeds(seedstore_pb2.ListSeedsRequest(), timeout=5)
        assert list(listing.seeds) == []
        await assert_guarded(anonymous, SEEDSTORE, always_guarded(seedstore_server, SEEDSTORE))
        # Every read answers without a token.
        await stub.GetStore(seedstore_pb2.GetStoreRequest(), timeout=5)
        await stub.SearchSeeds(seedstore_pb2.SearchSeedsRequest(capability="text_to_speech"), timeout=5)
        await stub.ScanSeeds(seedstore_pb2.ScanSeedsRequest(), timeout=5)
        error = await rpc_error(stub.InspectSeed(seedstore_pb2.InspectSeedRequest(id="voice-cli"), timeout=5))
        assert (error.domain, error.reason) == ("seedstore.agentsidecar", "SEED_NOT_FOUND")
        watch = stub.WatchSeeds(seedstore_pb2.WatchSeedsRequest(), timeout=5)
        await watch.initial_metadata()  # sent once subscribed
        watch.cancel()
    assert not (tmp_path / "home" / "capabilities" / "voice" / "voice-cli.yml").exists()
    async with local_channel(seedstore.bound[0], "not-it") as wrong:
        stub = seedstore_pb2_grpc.SeedStoreServiceStub(wrong)
        assert_invalid(await rpc_error(stub.AddSeed(seed, timeout=5)), full_name(SEEDSTORE, "AddSeed"))
    async with local_channel(seedstore.bound[0], TOKEN) as right:
        stub = seedstore_pb2_grpc.SeedStoreServiceStub(right)
        await stub.AddSeed(seed, timeout=5)
        assert (tmp_path / "home" / "capabilities" / "voice" / "voice-cli.yml").exists()
        removed = await stub.RemoveSeed(seedstore_pb2.RemoveSeedRequest(id="voice-cli"), timeout=5)
        assert removed.id == "voice-cli"


async def test_seedstore_reads_need_the_token_by_default(start_seedstore: StartSeedstore) -> None:
    seedstore = await start_seedstore(open_reads=False)
    async with grpc.aio.insecure_channel(seedstore.bound[0]) as anonymous:
        await assert_guarded(anonymous, SEEDSTORE, SEEDSTORE.methods_by_name)
        await assert_health_and_reflection_open(anonymous)
    async with local_channel(seedstore.bound[0], TOKEN) as right:
        stub = seedstore_pb2_grpc.SeedStoreServiceStub(right)
        assert list((await stub.ListSeeds(seedstore_pb2.ListSeedsRequest(), timeout=5)).seeds) == []


StartNegotiator = Callable[..., Awaitable[negotiator_server.RunningNegotiator]]


@pytest.fixture
async def start_negotiator(socket_dir: Path, tmp_path: Path) -> AsyncIterator[StartNegotiator]:
    running: list[negotiator_server.RunningNegotiator] = []

    async def start(*, open_reads: bool) -> negotiator_server.RunningNegotiator:
        settings = negotiator_server.Settings(
            listen=(f"unix:{socket_dir / 'negotiator.sock'}",),
            grace_seconds=0.5,
            server_options=ServerOptions(listen=(), tokens=tokens(TOKEN), open_reads=open_reads),
            # A seedstore nobody serves: a Bootstrap that gets past auth fails reaching it.
            seedstore_target=f"unix:{socket_dir / 'no-seedstore.sock'}",
            state_dir=tmp_path / "state",
        )
        running.append(await negotiator_server.create_server(settings))
        return running[-1]

    yield start
    for server in running:
        await server.stop()


async def test_negotiator_registration_needs_the_token(
    start_negotiator: StartNegotiator, socket_dir: Path
) -> None:
    negotiator = await start_negotiator(open_reads=True)
    async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        register = negotiator_pb2.RegisterAdapterRequest(target=f"unix:{socket_dir / 'nobody.sock'}")
        error = await rpc_error(stub.RegisterAdapter(register, timeout=5))
        assert_missing(error, full_name(NEGOTIATOR, "RegisterAdapter"))
        deregister = negotiator_pb2.DeregisterAdapterRequest(shortname="demo")
        error = await rpc_error(stub.DeregisterAdapter(deregister, metadata=bearer("nope"), timeout=5))
        assert_invalid(error, full_name(NEGOTIATOR, "DeregisterAdapter"))
        # With the token the call reaches the service, which has its own reasons to refuse.
        error = await rpc_error(stub.DeregisterAdapter(deregister, metadata=bearer(TOKEN), timeout=5))
        assert error.domain != DOMAIN
        assert error.code == grpc.StatusCode.FAILED_PRECONDITION  # config adapters stay
        listing = await stub.ListAdapters(negotiator_pb2.ListAdaptersRequest(), timeout=5)
        assert "demo" in {adapter.declaration.shortname for adapter in listing.adapters}


BOOTSTRAP_RUN = negotiator_pb2.BootstrapRequest(capability="text_to_speech", run=True, prompt="hi")


@pytest.mark.slow
async def test_negotiator_executing_methods_need_the_token_with_open_reads(
    start_negotiator: StartNegotiator,
) -> None:
    negotiator = await start_negotiator(open_reads=True)
    invoke = negotiator_pb2.InvokeRequest(adapter="demo", prompt="hi")
    async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        await assert_guarded(channel, NEGOTIATOR, always_guarded(negotiator_server, NEGOTIATOR))
        assert_missing(await rpc_error(stub.Invoke(invoke, timeout=5)), full_name(NEGOTIATOR, "Invoke"))
        # Bootstrap: candidates are a read, a run executes a command.
        error = await rpc_error(stub.Bootstrap(BOOTSTRAP_RUN, timeout=5))
        assert_missing(error, full_name(NEGOTIATOR, "Bootstrap"))
        assert "with `run` set" in error.message
        error = await rpc_error(stub.Bootstrap(BOOTSTRAP_RUN, metadata=bearer("nope"), timeout=5))
        assert_invalid(error, full_name(NEGOTIATOR, "Bootstrap"))
        for request, metadata in (
            (negotiator_pb2.BootstrapRequest(capability="text_to_speech"), ()),
            (BOOTSTRAP_RUN, bearer(TOKEN)),
        ):
            error = await rpc_error(stub.Bootstrap(request, metadata=metadata, timeout=5))
            assert error.domain == "negotiator.agentsidecar"  # past auth: the seedstore is unreachable
        # The reads answer without a token.
        assert (await stub.GetAdapter(negotiator_pb2.GetAdapterRequest(shortname="demo"), timeout=5)).adapter
        verdict = await stub.Negotiate(negotiator_pb2.NegotiateRequest(invoke=invoke), timeout=5)
        assert verdict.ByteSize() > 0
        watch = stub.WatchAdapters(negotiator_pb2.WatchAdaptersRequest(), timeout=5)
        first = await watch.read()
        assert isinstance(first, negotiator_pb2.WatchAdaptersResponse)
        watch.cancel()
        assert (await stub.Invoke(invoke, metadata=bearer(TOKEN), timeout=5)).text


@pytest.mark.slow
async def test_negotiator_reads_need_the_token_by_default(start_negotiator: StartNegotiator) -> None:
    negotiator = await start_negotiator(open_reads=False)
    async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
        await assert_guarded(channel, NEGOTIATOR, NEGOTIATOR.methods_by_name)
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        error = await rpc_error(stub.Bootstrap(BOOTSTRAP_RUN, timeout=5))
        assert_missing(error, full_name(NEGOTIATOR, "Bootstrap"))
        await assert_health_and_reflection_open(channel)
        listing = await stub.ListAdapters(
            negotiator_pb2.ListAdaptersRequest(), metadata=bearer(TOKEN), timeout=5
        )
        assert "demo" in {adapter.declaration.shortname for adapter in listing.adapters}
        # A run with the token passes both checks, the layer's and the servicer's.
        error = await rpc_error(stub.Bootstrap(BOOTSTRAP_RUN, metadata=bearer(TOKEN), timeout=5))
        assert error.domain == "negotiator.agentsidecar"
