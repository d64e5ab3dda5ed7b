"""Serving: settings, health, reflection, and a graceful SIGTERM of `seedstore serve`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from agentsidecar.clients.errors import SidecarError
from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore_service import errors
from agentsidecar.seedstore_service.server import (
    SERVICE_NAME,
    Settings,
    _refresh_forever,
    add_serve_arguments,
    create_server,
    refresh_pause,
)

from .conftest import PYTHON, ServerThread

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_settings_from_env_are_pure_and_complete() -> None:
    env = {
        "SKILLSPEC_HOME": "/srv/skills",
        "SEEDSTORE_LISTEN": "unix:/run/s.sock, 127.0.0.1:7000",
        "SEEDSTORE_CHECK_TIMEOUT": "2.5",
        "SEEDSTORE_VERIFY_CONCURRENCY": "8",
        "PATH": "/opt/bin:/usr/bin",
    }
    settings = Settings.from_env(env)
    assert settings == Settings(
        listen=("unix:/run/s.sock", "127.0.0.1:7000"),
        store_root=Path("/srv/skills/capabilities"),
        equivalents_file=Path("/srv/skills/equivalents.yml"),
        equivalents_required=False,
        check_timeout=2.5,
        verify_concurrency=8,
        refresh_interval=1.0,
        grace_seconds=10.0,
        check_path="/opt/bin:/usr/bin",
    )
    # The default equivalents file sits beside capabilities/, never inside it (SkillSpec would parse it).
    home_only = Settings.from_env({"HOME": "/home/u"})
    assert home_only.store_root == Path("/home/u/.skillspec/capabilities")
    assert home_only.equivalents_file == Path("/home/u/.skillspec/equivalents.yml")
    assert home_only.listen == ()
    assert home_only.check_timeout == 10.0
    assert home_only.verify_concurrency == 4
    with pytest.raises(errors.StoreUnavailable, match="HOME is not set"):
        Settings.from_env({})
    with pytest.raises(ValueError, match="SEEDSTORE_CHECK_TIMEOUT"):
        Settings.from_env({"HOME": "/h", "SEEDSTORE_CHECK_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match="concurrency"):
        Settings.from_env({"HOME": "/h", "SEEDSTORE_VERIFY_CONCURRENCY": "99"})


def test_flags_override_the_environment() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(
        [
            "--listen",
            "unix:/a.sock",
            "--listen",
            "[::1]:0",
            "--equivalents",
            "/etc/eq.yml",
            "--grace-seconds",
            "3",
        ]
    )
    settings = Settings.from_args(args, {"HOME": "/h", "SEEDSTORE_LISTEN": "127.0.0.1:1"})
    assert settings.listen == ("unix:/a.sock", "[::1]:0")
    assert settings.equivalents_file == Path("/etc/eq.yml")
    assert settings.equivalents_required
    assert settings.grace_seconds == 3.0
    assert settings.refresh_interval == 1.0


async def test_a_broken_equivalents_file_stops_startup(base_settings: Settings, home: Path) -> None:
    broken = home / "equivalents.yml"
    broken.write_text("groups:\n- name: x\n  capabilities: [Bad]\n")
    with pytest.raises(errors.InvalidArgument, match="equivalence table"):
        await create_server(base_settings)
    with pytest.raises(errors.StoreUnavailable, match="failed to read"):
        await create_server(
            replace(base_settings, equivalents_file=home / "missing.yml", equivalents_required=True)
        )


def test_health_and_reflection(server: ServerThread) -> None:
    with grpc.insecure_channel(server.unix_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE_NAME):
            assert health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status == SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="nope.v1.Nope"), timeout=5)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert SERVICE_NAME == "agentsidecar.seedstore.v1.SeedStoreService"
    assert SERVICE_NAME in services
    assert "grpc.health.v1.Health" in services


@pytest.mark.slow
def test_sigterm_drains_a_running_verify_then_exits_cleanly(
    home: Path, socket_dir: Path, cli_env: dict[str, str]
) -> None:
    socket_path = socket_dir / "serve.sock"
    process = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "agentsidecar.seedstore_service.cli",
            "serve",
            "--listen",
            f"unix:{socket_path}",
            "--grace-seconds",
            "10",
        ],
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready = process.stdout.readline()
        assert ready == f"READY seedstore unix:{socket_path}\n", (
            process.stderr.read() if process.stderr else ""
        )
        target = f"unix:{socket_path}"
        client = SeedStoreClient(target)
        client.add_seed(
            pb.AddSeedRequest(
                id="slow", domain="dev", kind="cli", provides=["waiting"], evidence_commands=["sleep 1.5"]
            )
        )
        channel = grpc.insecure_channel(target)
        health_changes = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        statuses: queue.Queue[int] = queue.Queue()

        def watch_health() -> None:
            try:
                for change in health_changes:
                    statuses.put(change.status)
            except grpc.RpcError:
                pass

        threading.Thread(target=watch_health, daemon=True).start()
        assert statuses.get(timeout=5) == SERVING

        events = client.verify_seeds(pb.VerifySeedsRequest(ids=["slow"]))
        assert next(events).WhichOneof("event") == "check_started"
        process.send_signal(signal.SIGTERM)

        assert statuses.get(timeout=5) == NOT_SERVING
        rest = list(events)  # the in-flight call runs to its end
        assert [response.WhichOneof("event") for response in rest] == ["check_finished", "seed_verified"]
        assert rest[-1].seed_verified.status == pb.VERIFICATION_STATUS_VERIFIED
        assert "status: verified" in (home / "capabilities" / "dev" / "slow.yml").read_text()
        client.close()
        channel.close()
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not socket_path.exists()
    assert process.stderr is not None
    assert '"event":"sidecar.draining"' in process.stderr.read()


@pytest.mark.slow
def test_new_calls_after_shutdown_are_refused(start_server: Callable[..., ServerThread]) -> None:
    server = start_server()
    target = server.unix_target
    server.stop()
    with SeedStoreClient(target, timeout=2) as client, pytest.raises(SidecarError) as refused:
        client.get_store()
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    assert not os.path.exists(target.removeprefix("unix:"))


# --- the background refresh's pace -------------------------------------------------


def test_the_refresh_pause_is_the_interval_until_a_walk_would_take_more_than_its_share() -> None:
    assert refresh_pause(1.0, 0.0) == 1.0
    assert refresh_pause(1.0, 0.01) == 1.0  # 10 ms walks: every second, 1 % of a core
    assert refresh_pause(1.0, 0.5) == pytest.approx(9.5)  # 100,000 seeds: 5 % of a core
    assert refresh_pause(1.0, 0.5, max_share=0.5) == 1.0


@pytest.mark.slow
async def test_a_costly_walk_spaces_the_background_refreshes_out() -> None:
    class CostlyWalks:
        def __init__(self) -> None:
            self.walks = 0

        def refresh_index(self) -> None:
            self.walks += 1
            started = time.thread_time()
            while time.thread_time() - started < 0.02:  # 20 ms of CPU per walk
                pass

    operations = CostlyWalks()
    refresher = asyncio.create_task(_refresh_forever(operations, 0.01))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(1.0)
    finally:
        refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await refresher
    # At 10 ms intervals, 30-odd walks would fit in a second; at 5 % of a core
    # each 20 ms walk is followed by a 380 ms pause.
    assert 1 <= operations.walks <= 4
