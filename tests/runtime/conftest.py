"""Fixtures of the runtime tests: the probe service on a real server, and a session-wide PKI."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agentsidecar.sidecar_runtime.server import RunningServer, ServerOptions, start_server

from .runtime_support import PROBE_READS, PROBE_SERVICE, Pki, Probe, StartProbe, make_pki


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Not tmp_path: its name grows with the test id, and sun_path holds ~107 bytes.
    return tmp_path_factory.mktemp("sock")


@pytest.fixture
def probe() -> Probe:
    return Probe()


@pytest.fixture
async def start_probe(probe: Probe, socket_dir: Path) -> AsyncIterator[StartProbe]:
    """`await start_probe(**server_option_overrides)`: the probe on a Unix socket and 127.0.0.1:0.

    Every probe method but Mutate is a read (open with `open_reads=True`).
    """
    running: list[RunningServer] = []

    async def start(**overrides: Any) -> RunningServer:
        options = ServerOptions(
            listen=(f"unix:{socket_dir / 'probe.sock'}", "127.0.0.1:0"), grace_seconds=0.5
        )
        server = await start_server(
            probe.register, (PROBE_SERVICE,), replace(options, **overrides), read_methods=PROBE_READS
        )
        running.append(server)
        return server

    yield start
    probe.release()
    for server in running:
        await server.stop()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))
