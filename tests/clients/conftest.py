"""Fixtures: real servers for the client tests, on a Unix socket (and 127.0.0.1:0) in a short temp dir.

* `seedstore`: the real seedstore service over a fresh store.
* `negotiator`: the real negotiator with `sidecars.NEGOTIATOR_CONFIG` (demo,
  shell-echo, bad-output, throttled).
* `start_fake(fail_first=..., tls=...)`: a `sidecars.FakeSeedStore`.
* `fake_negotiator`: a `sidecars.FakeNegotiator` (ToolSession, Bootstrap).
* `remote_adapter`: tests/negotiator/remote_double.py as a process ("echo-remote").

All servers share one `server_loop` thread; see sidecars.py. No test writes
under the real home: XDG_STATE_HOME points at a session temp dir (inherited by
`serve` processes), and `negotiator` keeps its conversations in its own temp dir.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import grpc
import grpc.aio
import pytest

from agentsidecar.negotiator_service import server as negotiator_server
from agentsidecar.negotiator_service.conversations import ConversationStore
from agentsidecar.seedstore_service import server as seedstore_server
from tests.clients.sidecars import (
    NEGOTIATOR_CONFIG,
    REPO,
    FakeNegotiator,
    FakeSeedStore,
    FakeServer,
    ServerHandle,
    ServerLoop,
)
from tests.procs import start_process, stop_process


@pytest.fixture(scope="session", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """XDG_STATE_HOME for the whole session, so module-scoped `serve` processes inherit it too."""
    path = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(path))
        yield path


@pytest.fixture(scope="session")
def server_loop() -> Iterator[ServerLoop]:
    running = ServerLoop()
    yield running
    running.close()


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Short: a Unix socket path must fit in 107 bytes, and pytest's tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="cl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def seedstore(server_loop: ServerLoop, socket_dir: Path, tmp_path: Path) -> Iterator[ServerHandle]:
    home = tmp_path / "home"
    settings = seedstore_server.Settings(
        listen=(f"unix:{socket_dir / 'seedstore.sock'}", "127.0.0.1:0"),
        store_root=home / "capabilities",
        equivalents_file=None,
        refresh_interval=0.1,
        grace_seconds=0.5,
        check_path=os.environ.get("PATH", "/usr/bin:/bin"),
    )
    running = server_loop.run(seedstore_server.create_server(settings))
    try:
        yield ServerHandle(running.bound, home)
    finally:
        server_loop.run(running.stop())


@pytest.fixture
def negotiator(
    server_loop: ServerLoop, socket_dir: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerHandle]:
    config = tmp_path / "negotiator.yaml"
    config.write_text(NEGOTIATOR_CONFIG)
    settings = negotiator_server.Settings(
        listen=(f"unix:{socket_dir / 'negotiator.sock'}", "127.0.0.1:0"),
        config_path=config,
        grace_seconds=0.5,
    )
    conversations = ConversationStore(tmp_path_factory.mktemp("conversations"))
    running = server_loop.run(negotiator_server.create_server(settings, conversation_store=conversations))
    try:
        yield ServerHandle(running.bound)
    finally:
        server_loop.run(running.stop())


# --- a fake seedstore: flaky unary calls, recorded metadata, cancellable streams ---------------


@pytest.fixture
def start_fake(server_loop: ServerLoop, socket_dir: Path) -> Iterator[Callable[..., FakeServer]]:
    """`start_fake(fail_first={...}, tls=(key_pem, cert_pem))`; stopped at teardown."""
    servers: list[grpc.aio.Server] = []

    def start(
        fail_first: Mapping[str, int] | None = None, tls: tuple[bytes, bytes] | None = None
    ) -> FakeServer:
        fake = FakeSeedStore(fail_first=dict(fail_first or {}))

        async def create() -> FakeServer:
            server = grpc.aio.server()
            server.add_generic_rpc_handlers((fake.handler(),))
            unix = f"unix:{socket_dir / f'fake{len(servers)}.sock'}"
            server.add_insecure_port(unix)
            port = server.add_insecure_port("127.0.0.1:0")
            tls_target = None
            if tls is not None:
                tls_port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([tls]))
                tls_target = f"127.0.0.1:{tls_port}"
            await server.start()
            servers.append(server)
            return FakeServer(fake, unix, f"127.0.0.1:{port}", tls_target)

        return server_loop.run(create())

    yield start
    for server in servers:
        server_loop.run(server.stop(0))


# --- processes -------------------------------------------------------------------------------


@pytest.fixture
def fake_negotiator(server_loop: ServerLoop, socket_dir: Path) -> Iterator[tuple[FakeNegotiator, str]]:
    """A FakeNegotiator on a Unix socket; it and its target."""
    fake = FakeNegotiator()
    target = f"unix:{socket_dir / 'fake-negotiator.sock'}"

    async def create() -> grpc.aio.Server:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((fake.handler(),))
        server.add_insecure_port(target)
        await server.start()
        return server

    server = server_loop.run(create())
    yield fake, target
    server_loop.run(server.stop(0))


@pytest.fixture(scope="module")
def remote_adapter() -> Iterator[str]:
    """tests/negotiator/remote_double.py in its own process, declaring shortname "echo-remote"; its target."""
    directory = Path(tempfile.mkdtemp(prefix="cl-ra-", dir="/tmp"))
    target = f"unix:{directory / 'remote.sock'}"
    process, _ = start_process(
        [
            sys.executable,
            str(REPO / "tests" / "negotiator" / "remote_double.py"),
            "--listen",
            target,
            "--shortname",
            "echo-remote",
        ]
    )
    try:
        yield target
    finally:
        stop_process(process)
        shutil.rmtree(directory, ignore_errors=True)
