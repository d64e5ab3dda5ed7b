"""`agentsidecar-pair`, the README's run command, as a real process: both services, wired together."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from agentsidecar.seedstore.v1 import seedstore_pb2, seedstore_pb2_grpc
from tests.procs import stop_process

PAIR = Path(sys.executable).parent / "agentsidecar-pair"


@pytest.fixture
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """The launcher running, and the directory of its sockets."""
    run_dir = tmp_path_factory.mktemp("pair")  # short: Unix socket paths hold ~107 bytes
    home = tmp_path_factory.mktemp("home")
    process = subprocess.Popen(
        [str(PAIR), "--run-dir", str(run_dir), "--seedstore-tcp", "", "--negotiator-tcp", ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SKILLSPEC_HOME": str(home), "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(3)]
    if not lines[2].startswith("pair ready"):
        process.kill()
        raise AssertionError(f"the pair did not start: {lines} {process.communicate(timeout=10)}")
    yield process, run_dir
    stop_process(process)  # when the test failed before stopping it: SIGTERM reaches both services


async def test_the_pair_serves_both_and_the_negotiator_asks_its_seedstore(
    pair: tuple[subprocess.Popen[str], Path],
) -> None:
    launcher, run_dir = pair
    async with grpc.aio.insecure_channel(f"unix:{run_dir / 'seedstore.sock'}") as channel:
        seeds = seedstore_pb2_grpc.SeedStoreServiceStub(channel)
        await seeds.AddSeed(
            seedstore_pb2.AddSeedRequest(
                id="say", domain="voice", kind="cli", command="cat", provides=["text_to_speech"]
            ),
            timeout=10,
        )
    async with grpc.aio.insecure_channel(f"unix:{run_dir / 'negotiator.sock'}") as channel:
        negotiator = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        # Bootstrap works only when the negotiator was given the seedstore (`--seedstore`).
        response = await negotiator.Bootstrap(
            negotiator_pb2.BootstrapRequest(capability="text_to_speech"), timeout=10
        )
    assert [candidate.id for candidate in response.candidates] == ["say"]

    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=30)
    assert launcher.returncode == 0, stderr
    events = {
        (record["event"], record["sidecar"])
        for record in (json.loads(line) for line in stderr.splitlines() if line.startswith("{"))
        if "sidecar" in record
    }
    for name in ("negotiator", "seedstore"):
        assert {("sidecar.draining", name), ("sidecar.stopped", name)} <= events, stderr
    assert not (run_dir / "seedstore.sock").exists()
    assert not (run_dir / "negotiator.sock").exists()


@pytest.fixture
def local_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    """The launcher started without SKILLSPEC_HOME: its ready line, run directory and user HOME."""
    run_dir = tmp_path_factory.mktemp("local")
    home = tmp_path_factory.mktemp("user-home")
    env = {k: v for k, v in os.environ.items() if k != "SKILLSPEC_HOME"}
    process = subprocess.Popen(
        [str(PAIR), "--run-dir", str(run_dir), "--seedstore-tcp", "", "--negotiator-tcp", ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "HOME": str(home), "XDG_STATE_HOME": str(home / "state"), "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(3)]
    if not lines[2].startswith("pair ready"):
        process.kill()
        raise AssertionError(f"the pair did not start: {lines} {process.communicate(timeout=10)}")
    yield lines[2], run_dir, home
    stop_process(process)


async def test_without_skillspec_home_the_store_and_state_stay_in_the_run_dir(
    local_pair: tuple[str, Path, Path],
) -> None:
    ready, run_dir, home = local_pair
    assert f"seed store {run_dir}/skillspec-home/capabilities, project-local" in ready
    async with grpc.aio.insecure_channel(f"unix:{run_dir / 'seedstore.sock'}") as channel:
        seeds = seedstore_pb2_grpc.SeedStoreServiceStub(channel)
        store = await seeds.GetStore(seedstore_pb2.GetStoreRequest(), timeout=10)
        await seeds.AddSeed(
            seedstore_pb2.AddSeedRequest(
                id="echo", domain="text", kind="cli", command="cat", provides=["text_echo"]
            ),
            timeout=10,
        )
    assert Path(store.seed_store) == run_dir / "skillspec-home" / "capabilities"
    assert (run_dir / "skillspec-home" / "capabilities" / "text" / "echo.yml").is_file()
    assert sorted(p.name for p in home.iterdir()) == []
