"""A real negotiator on a Unix socket and 127.0.0.1:0, with scripted adapters from a test config.

Tests add FakeAdapters (which record every call) with `add_fake`, and decode
failures with `call_error`; those helpers and the shared constants live in
negotiator_testkit.py, which tests import (never `from conftest import`: the name
`conftest` is shared by every test directory). `remote_adapter` starts
tests/negotiator/remote_double.py as a separate process.

No test writes under the real home: every test runs with XDG_STATE_HOME in a
temp dir (`state_home`, inherited by `negotiator serve` children), and the
`negotiator` fixture keeps its conversations in `state_home / "conversations"`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from negotiator_testkit import REMOTE_ADAPTER, TEST_CONFIG

from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.conversations import ConversationStore
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server
from tests.procs import start_process, stop_process


@pytest.fixture(autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XDG_STATE_HOME for this test: the conversation state default never lands in the real home."""
    # Its own directory, not one inside tmp_path, so tests that list tmp_path see only their files.
    path = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(path))
    return path


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Not tmp_path: its name grows with the test id, and sun_path holds ~107 bytes.
    return tmp_path_factory.mktemp("sock")


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "negotiator.yaml"
    path.write_text(TEST_CONFIG)
    return path


@pytest.fixture
async def negotiator(
    socket_dir: Path, config_file: Path, state_home: Path
) -> AsyncIterator[RunningNegotiator]:
    settings = Settings(
        listen=(f"unix:{socket_dir / 'negotiator.sock'}", "127.0.0.1:0"),
        config_path=config_file,
        grace_seconds=1.0,
    )
    running = await create_server(
        settings, conversation_store=ConversationStore(state_home / "conversations")
    )
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def channel(negotiator: RunningNegotiator) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(negotiator.bound[0]) as unix_channel:
        yield unix_channel


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> negotiator_pb2_grpc.NegotiatorServiceAsyncStub:
    return negotiator_pb2_grpc.NegotiatorServiceStub(channel)


@pytest.fixture
def remote_adapter(socket_dir: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """tests/negotiator/remote_double.py in its own process, declaring shortname "echo-remote"."""
    target = f"unix:{socket_dir / 'remote.sock'}"
    process, _ = start_process(
        [
            sys.executable,
            str(REMOTE_ADAPTER),
            "--listen",
            target,
            "--shortname",
            "echo-remote",
        ]
    )
    try:
        yield target, process
    finally:
        stop_process(process)
