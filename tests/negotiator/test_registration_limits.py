"""RegisterAdapter against hostile remotes and targets, over a real negotiator and real processes.

Remote doubles are tests/negotiator/hostile_remote.py processes (one misbehaviour each); the
well-behaved remote is tests/negotiator/remote_double.py.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TypeAlias

import grpc
import pytest
from negotiator_testkit import NEGOTIATOR_BIN, REMOTE_ADAPTER, call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.adapters.remote import MAX_DECLARATION_BYTES
from agentsidecar.negotiator_service.conversations import ConversationStore
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server
from agentsidecar.negotiator_service.status import ADAPTER_TARGET_RULE, DOMAIN
from tests.procs import start_process, stop_process

HOSTILE = Path(__file__).with_name("hostile_remote.py")
Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
Hostile = Callable[[str], str]


def non_loopback_ip() -> str | None:
    """An IPv4 address of this host other than loopback, if it has one (no packet is sent)."""
    for destination in ("203.0.113.1", "10.255.255.254"):  # documentation / private ranges
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((destination, 9))  # a UDP connect only picks the outgoing interface
            except OSError:
                continue
            address: str = probe.getsockname()[0]
        if not address.startswith("127."):
            return address
    return None


@pytest.fixture
def hostile(socket_dir: Path) -> Iterator[Hostile]:
    """Start a hostile_remote.py process in a mode; its target."""
    processes = []

    def start(mode: str) -> str:
        target = f"unix:{socket_dir / f'{mode}.sock'}"
        process, _ = start_process([sys.executable, str(HOSTILE), "--listen", target, "--mode", mode])
        processes.append(process)
        return target

    yield start
    for process in processes:
        stop_process(process)


async def _started(
    socket_dir: Path, config_file: Path, state_home: Path, adapter_hosts: tuple[str, ...] = ()
) -> RunningNegotiator:
    return await create_server(
        Settings(
            listen=(f"unix:{socket_dir / 'reg.sock'}",),
            config_path=config_file,
            grace_seconds=0.5,
            adapter_hosts=adapter_hosts,
        ),
        conversation_store=ConversationStore(state_home / "conversations"),
    )


@pytest.fixture
async def stub(socket_dir: Path, config_file: Path, state_home: Path) -> AsyncIterator[Stub]:
    running = await _started(socket_dir, config_file, state_home)
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)
    finally:
        await running.stop()


# --- item: targets limited to Unix sockets and loopback ------------------------------


async def test_a_non_loopback_target_is_refused_without_a_connection(stub: Stub) -> None:
    address = non_loopback_ip()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((address, 0))
        listener.listen(8)
        listener.setblocking(False)
        target = f"{address}:{listener.getsockname()[1]}"
        error = await call_error(stub.RegisterAdapter(pb.RegisterAdapterRequest(target=target), timeout=10))
        assert error.code is grpc.StatusCode.PERMISSION_DENIED
        assert (error.domain, error.reason) == (DOMAIN, "ADAPTER_TARGET_NOT_ALLOWED")
        assert error.metadata == {"target": target, "host": address, "rule": ADAPTER_TARGET_RULE}
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected


async def test_a_host_name_is_refused_without_being_resolved(stub: Stub) -> None:
    error = await call_error(
        stub.RegisterAdapter(pb.RegisterAdapterRequest(target="adapter.example.invalid:50051"), timeout=10)
    )
    assert error.code is grpc.StatusCode.PERMISSION_DENIED
    assert error.metadata["host"] == "adapter.example.invalid"


@pytest.mark.slow
async def test_an_allowed_host_is_registered(socket_dir: Path, config_file: Path, state_home: Path) -> None:
    address = non_loopback_ip()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    process, line = start_process(
        [sys.executable, str(REMOTE_ADAPTER), "--listen", f"{address}:0", "--shortname", "far-remote"]
    )
    running = await _started(socket_dir, config_file, state_home, adapter_hosts=(address,))
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            target = line.removeprefix("READY ")
            response = await stub.RegisterAdapter(pb.RegisterAdapterRequest(target=target), timeout=10)
        assert response.adapter.declaration.shortname == "far-remote"
    finally:
        await running.stop()
        stop_process(process)


# --- item: a declaration over the documented size ----------------------------------


@pytest.mark.slow
async def test_a_huge_declaration_is_refused_at_registration(stub: Stub, hostile: Hostile) -> None:
    target = hostile("huge-declaration")
    error = await call_error(stub.RegisterAdapter(pb.RegisterAdapterRequest(target=target), timeout=10))
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "ADAPTER_REGISTRATION_FAILED"
    assert f"over the limit of {MAX_DECLARATION_BYTES} bytes" in error.metadata["cause"]
    # Nothing was registered, so listing still works for everyone.
    listed = await stub.ListAdapters(pb.ListAdaptersRequest(), timeout=5)
    assert "hostile" not in {a.declaration.shortname for a in listed.adapters}


# --- item: undecodable replies and the negotiator's own channel limits ---------------


@pytest.mark.slow
async def test_an_undecodable_declaration_fails_registration(stub: Stub, hostile: Hostile) -> None:
    target = hostile("garbage")
    error = await call_error(stub.RegisterAdapter(pb.RegisterAdapterRequest(target=target), timeout=10))
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "ADAPTER_REGISTRATION_FAILED"
    assert "not a GetDeclarationResponse" in error.metadata["cause"]


@pytest.mark.slow
async def test_a_status_over_the_metadata_limit_is_not_throttling(stub: Stub, hostile: Hostile) -> None:
    target = hostile("long-refusal")
    await stub.RegisterAdapter(pb.RegisterAdapterRequest(target=target), timeout=10)
    error = await call_error(stub.Invoke(pb.InvokeRequest(adapter="hostile", prompt="hi"), timeout=10))
    assert error.code is grpc.StatusCode.INTERNAL
    assert error.reason == "ADAPTER_REPLY_TOO_LARGE"
    assert "metadata size" in error.metadata["cause"]


@pytest.mark.slow
async def test_a_remotes_real_throttling_stays_rate_limited(stub: Stub, hostile: Hostile) -> None:
    target = hostile("throttled")
    await stub.RegisterAdapter(pb.RegisterAdapterRequest(target=target), timeout=10)
    error = await call_error(stub.Invoke(pb.InvokeRequest(adapter="hostile", prompt="hi"), timeout=10))
    assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.reason == "ADAPTER_RATE_LIMITED"


@pytest.mark.slow
async def test_the_serve_flag_allows_a_host(socket_dir: Path, config_file: Path) -> None:
    address = non_loopback_ip()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    remote, line = start_process(
        [sys.executable, str(REMOTE_ADAPTER), "--listen", f"{address}:0", "--shortname", "far-remote"]
    )
    listen = f"unix:{socket_dir / 'cli.sock'}"
    serve = [str(NEGOTIATOR_BIN), "serve", "--config", str(config_file), "--listen", listen]
    negotiator, _ = start_process([*serve, "--allow-adapter-hosts", f"example.invalid,{address}"])
    try:
        async with grpc.aio.insecure_channel(listen) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            target = line.removeprefix("READY ")
            response = await stub.RegisterAdapter(pb.RegisterAdapterRequest(target=target), timeout=10)
        assert response.adapter.target == target
    finally:
        stop_process(negotiator)
        stop_process(remote)
