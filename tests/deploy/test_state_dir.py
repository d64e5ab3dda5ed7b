"""The negotiator's command line from docker-compose.yml, run as a real process under a root it cannot write.

The image's root filesystem is read-only, so the default state directory
(under $HOME) cannot be created; here HOME lies beneath a regular file, which
makes every directory under it impossible to create, as on that root. The
compose command's volume paths are remapped into a temp dir. Its
conversations must work; the same command without --state-dir shows why
the deployments pass one.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.sidecar_runtime.richstatus import decode_error
from tests.procs import REPO, start_process, stop_process

CONFIG = """\
adapters:
  - shortname: chat
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {stateful_history: supported}
    options:
      invoke: {transcript: true}
"""


@pytest.fixture
def work() -> Iterator[Path]:
    # Short: a Unix socket path must fit in 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def compose_negotiator_command(work: Path) -> list[str]:
    compose: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    command: list[str] = compose["services"]["negotiator"]["command"]
    assert command[0] == "negotiator"
    remapped = [
        part.replace("unix:///sockets/", f"unix://{work}/sockets/").replace(
            "/data/negotiator", str(work / "state")
        )
        for part in command[1:]
    ]
    (work / "config.yaml").write_text(CONFIG)
    return [
        sys.executable,
        "-m",
        "agentsidecar.negotiator_service.cli",
        *remapped,
        "--config",
        str(work / "config.yaml"),
    ]


async def converse(work: Path, argv: list[str]) -> grpc.aio.AioRpcError | None:
    (work / "read-only-root").write_text("")  # a file: nothing can be created beneath it
    process, _ = start_process(
        argv, env={"HOME": str(work / "read-only-root" / "home"), "XDG_STATE_HOME": ""}
    )
    try:
        async with grpc.aio.insecure_channel(f"unix:{work / 'sockets' / 'negotiator.sock'}") as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            call = pb.InvokeRequest(
                adapter="chat", prompt="hello", options=pb.CallOptions(generate_conversation_id=True)
            )
            try:
                first = await stub.Invoke(call, timeout=10)
            except grpc.aio.AioRpcError as error:
                return error
            again = pb.InvokeRequest(
                adapter="chat", prompt="again", options=pb.CallOptions(conversation_id=first.conversation_id)
            )
            await stub.Invoke(again, timeout=10)
            return None
    finally:
        stop_process(process)


@pytest.mark.slow
async def test_the_compose_negotiator_keeps_conversations_under_a_read_only_root(work: Path) -> None:
    assert await converse(work, compose_negotiator_command(work)) is None
    assert any((work / "state").iterdir()), "the conversation was not written to the state dir"


@pytest.mark.slow
async def test_without_a_state_dir_conversations_fail_on_a_read_only_root(work: Path) -> None:
    argv = compose_negotiator_command(work)
    if "--state-dir" in argv:
        index = argv.index("--state-dir")
        del argv[index : index + 2]
    error = await converse(work, argv)
    assert error is not None
    assert decode_error(error).reason == "CONVERSATION_STORE_FAILED"
