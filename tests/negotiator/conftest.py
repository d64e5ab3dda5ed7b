"""A real negotiator on a Unix socket and 127.0.0.1:0, with scripted adapters from a test config.

Tests add FakeAdapters (which record every call) with `add_fake`, and decode
failures with `call_error`. `remote_adapter` starts examples/remote_adapter.py
as a separate process.

No test writes under the real home: every test runs with XDG_STATE_HOME in a
temp dir (`state_home`, inherited by `negotiator serve` children), and the
`negotiator` fixture keeps its conversations in `state_home / "conversations"`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from fakes import FakeAdapter, make_declaration

from negotiator_service.conversations import ConversationStore
from negotiator_service.model import Capability, Declaration
from negotiator_service.registry import RegisteredAdapter
from negotiator_service.server import RunningNegotiator, Settings, create_server
from sidecar_runtime.richstatus import DecodedError, decode_error

REPO = Path(__file__).resolve().parents[2]
NEGOTIATOR_BIN = Path(sys.executable).parent / "negotiator"
REMOTE_ADAPTER = REPO / "examples" / "remote_adapter.py"
ERROR_KINDS = ("unavailable", "timeout", "rate_limited", "refused", "misconfigured", "internal")

TEST_CONFIG = """\
adapters:
  - shortname: scripted-fw
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities:
        structured_output: supported
        model_override: supported
        settings: supported
        stream_events: supported
        persona: unsupported
      accepted_settings: [temperature]
      string_formats: [email]
    options:
      invoke: {echo: true}
      produce: {json: {"name": "Ada", "email": "ada@example.org"}}
      events: [{type: message, text: thinking}]
  - shortname: scripted-harness
    implementation: scripted
    declaration:
      kind: agent-harness
      capabilities: {structured_output: unsupported}
    options:
      invoke: {text: harness reply}
  - shortname: slow
    implementation: scripted
    declaration: {kind: agent-framework}
    options:
      invoke: {text: too late}
      delay_seconds: 5
  - shortname: bad-output
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {structured_output: supported}
    options:
      produce: {json: {"name": 42, "extra": true}}
"""


def _failing_adapter(kind: str) -> str:
    retry = ", retry_after: 2" if kind == "rate_limited" else ""
    return (
        f"  - shortname: fail-{kind.replace('_', '-')}\n"
        "    implementation: scripted\n"
        "    declaration: {kind: agent-framework}\n"
        f"    options: {{invoke: {{error: {{kind: {kind}, message: scripted {kind}{retry}}}}}}}\n"
    )


TEST_CONFIG += "".join(_failing_adapter(kind) for kind in ERROR_KINDS)

# A declaration supporting everything, with every typed-set member a test uses.
EVERYTHING = make_declaration(
    "fake",
    supported=list(Capability),
    mcp_transports=["stdio", "sse", "http"],
    accepted_settings=["temperature", "seed"],
    string_formats=["email", "date"],
)


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


def add_fake(
    negotiator: RunningNegotiator, declaration: Declaration = EVERYTHING, source: str = "config", **fake: Any
) -> FakeAdapter:
    adapter = FakeAdapter(declaration, **fake)
    negotiator.registry.add(RegisteredAdapter(adapter=adapter, source=source))
    return adapter


async def call_error(call: Awaitable[Any]) -> DecodedError:
    """Await a call that must fail; its decoded status."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return decode_error(caught.value)


def start_process(argv: list[str], **kwargs: Any) -> tuple[subprocess.Popen[str], str]:
    """Start a process that prints a READY line; return it and that line."""
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, **kwargs
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("READY"):
        process.kill()
        _, err = process.communicate(timeout=5)
        raise AssertionError(f"{argv[0]} did not start: {line!r} {err}")
    return process, line.strip()


def stop_process(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    process.communicate()


@pytest.fixture
def remote_adapter(socket_dir: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """examples/remote_adapter.py in its own process, declaring shortname "echo-remote"."""
    target = f"unix:{socket_dir / 'remote.sock'}"
    process, _ = start_process(
        [
            sys.executable,
            str(REPO / "examples" / "remote_adapter.py"),
            "--listen",
            target,
            "--shortname",
            "echo-remote",
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield target, process
    finally:
        stop_process(process)
