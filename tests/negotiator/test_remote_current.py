"""Remote adapters stay current: re-read declarations, NOT_SERVING remotes, registrations across restarts.

Real processes throughout: tests/negotiator/versioned_remote.py as the remote (restarted on the same
socket with another declaration, killed, stopped with SIGSTOP, told to report NOT_SERVING), and a
real negotiator on a Unix socket, restarted on the same state directory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import grpc.aio
import pytest
from negotiator_testkit import NEGOTIATOR_BIN, call_error

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.registrations import CORRUPT_SUFFIX, FILE_NAME, RegistrationStore
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server
from tests.procs import start_process, stop_process

VERSIONED_REMOTE = Path(__file__).with_name("versioned_remote.py")
REFRESH_SECONDS = 0.2
SERVING = pb.ADAPTER_SERVING_STATUS_SERVING
NOT_SERVING = pb.ADAPTER_SERVING_STATUS_NOT_SERVING
Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"


class Remote:
    """versioned_remote.py on one socket; `restart` brings it back there with another declaration."""

    def __init__(self, socket: Path, shortname: str = "versioned") -> None:
        self.target = f"unix:{socket}"
        self.shortname = shortname
        self.process: subprocess.Popen[str] | None = None

    def start(self, *, effort: str = "unsupported", label: str = "v1") -> None:
        argv = [sys.executable, str(VERSIONED_REMOTE), "--listen", self.target, "--shortname", self.shortname]
        self.process, _ = start_process([*argv, "--effort", effort, "--label", label])

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=5)
        self.process.communicate()
        self.process = None

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            stop_process(self.process)
            self.process = None


@pytest.fixture
def remote(socket_dir: Path) -> Iterator[Remote]:
    running = Remote(socket_dir / "remote.sock")
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


def settings(socket_dir: Path, config_file: Path, state_dir: Path) -> Settings:
    return Settings(
        listen=(f"unix:{socket_dir / 'negotiator.sock'}",),
        config_path=config_file,
        grace_seconds=0.5,
        state_dir=state_dir,
        adapter_refresh_seconds=REFRESH_SECONDS,
    )


@pytest.fixture
async def negotiator(
    socket_dir: Path, config_file: Path, state_dir: Path
) -> AsyncIterator[RunningNegotiator]:
    running = await create_server(settings(socket_dir, config_file, state_dir))
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def stub(negotiator: RunningNegotiator) -> AsyncIterator[Stub]:
    async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
        yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)


async def adapter(stub: Stub, shortname: str = "versioned") -> pb.Adapter:
    response = await stub.GetAdapter(pb.GetAdapterRequest(shortname=shortname), timeout=5)
    return response.adapter


async def until(stub: Stub, holds: Callable[[pb.Adapter], bool], within: float = 10.0) -> pb.Adapter:
    deadline = time.monotonic() + within
    while True:
        current = await adapter(stub)
        if holds(current):
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s; the adapter is now {current}")
        await asyncio.sleep(0.05)


def effort_state(declared: pb.Adapter) -> int:
    for entry in declared.declaration.capabilities:
        if entry.capability == common_pb2.CAPABILITY_EFFORT:
            return entry.state
    return common_pb2.CAPABILITY_STATE_UNKNOWN


def invoke(prompt: str = "hi", **options: Any) -> pb.InvokeRequest:
    return pb.InvokeRequest(adapter="versioned", prompt=prompt, options=pb.CallOptions(**options))


async def register(stub: Stub, remote: Remote) -> pb.Adapter:
    response = await stub.RegisterAdapter(
        pb.RegisterAdapterRequest(target=remote.target, shortname=remote.shortname), timeout=10
    )
    return response.adapter


@pytest.mark.slow
async def test_a_remote_restarted_with_another_declaration_is_picked_up(stub: Stub, remote: Remote) -> None:
    registered = await register(stub, remote)
    assert registered.serving_status == SERVING
    assert effort_state(registered) == common_pb2.CAPABILITY_STATE_UNSUPPORTED
    refused = await call_error(stub.Invoke(invoke(effort="high"), timeout=5))
    assert (refused.code, refused.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UNSUPPORTED_CAPABILITY")
    started = await stub.Invoke(invoke("first", conversation_id="conv-1"), timeout=5)
    assert started.text == "v1:first"

    watch = stub.WatchAdapters(pb.WatchAdaptersRequest())
    events: asyncio.Queue[pb.WatchAdaptersResponse] = asyncio.Queue()

    async def collect() -> None:
        async for event in watch:
            await events.put(event)

    collector = asyncio.create_task(collect())
    try:
        existing = await asyncio.wait_for(events.get(), 5)
        assert existing.change == pb.ADAPTER_CHANGE_EXISTING  # only "versioned" sorts after the config's
        while existing.adapter.declaration.shortname != "versioned":
            existing = await asyncio.wait_for(events.get(), 5)

        remote.kill()
        remote.start(effort="supported", label="v2")
        deadline = time.monotonic() + 10
        updates: list[pb.WatchAdaptersResponse] = []
        while not updates or not (
            updates[-1].adapter.serving_status == SERVING
            and effort_state(updates[-1].adapter) == common_pb2.CAPABILITY_STATE_SUPPORTED
        ):
            event = await asyncio.wait_for(events.get(), max(deadline - time.monotonic(), 0.01))
            assert event.change == pb.ADAPTER_CHANGE_UPDATED
            assert event.adapter.declaration.shortname == "versioned"
            updates.append(event)
    finally:
        watch.cancel()
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)

    new_version = updates[-1].adapter.declaration.version
    assert new_version != registered.declaration.version
    # New calls are judged by the new declaration...
    reply = await stub.Invoke(invoke("again", effort="high"), timeout=5)
    assert (reply.text, reply.decision.declaration_version) == ("v2:again", new_version)
    # ...and the conversation pinned to the old one refuses to go on with the new.
    changed = await call_error(stub.Invoke(invoke("second", conversation_id="conv-1"), timeout=5))
    assert (changed.code, changed.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "DECLARATION_CHANGED")
    current = await adapter(stub)
    assert (current.serving_status, current.serving_detail) == (SERVING, "")


@pytest.mark.slow
async def test_a_killed_remote_is_not_serving_and_its_calls_fail_fast(stub: Stub, remote: Remote) -> None:
    await register(stub, remote)
    remote.kill()
    down = await until(stub, lambda a: a.serving_status == NOT_SERVING)
    assert down.serving_detail
    started = time.monotonic()
    failed = await call_error(stub.Invoke(invoke(), timeout=10))
    elapsed = time.monotonic() - started
    assert (failed.code, failed.reason) == (grpc.StatusCode.UNAVAILABLE, "ADAPTER_UNAVAILABLE")
    assert "not serving" in failed.message
    assert elapsed < 1.0

    remote.start(label="back")
    await until(stub, lambda a: a.serving_status == SERVING)
    assert (await stub.Invoke(invoke(), timeout=5)).text == "back:hi"


@pytest.mark.slow
async def test_a_hung_remote_is_not_serving_and_calls_fail_well_before_their_deadline(
    stub: Stub, remote: Remote
) -> None:
    await register(stub, remote)
    remote.signal(signal.SIGSTOP)  # the connection stays up; nothing answers on it
    down = await until(stub, lambda a: a.serving_status == NOT_SERVING)
    assert "DEADLINE_EXCEEDED" in down.serving_detail
    started = time.monotonic()
    failed = await call_error(stub.Invoke(invoke(), timeout=5))
    assert (failed.code, failed.reason) == (grpc.StatusCode.UNAVAILABLE, "ADAPTER_UNAVAILABLE")
    assert time.monotonic() - started < 1.0  # a dispatched call would have waited its 5 s out

    remote.signal(signal.SIGCONT)
    await until(stub, lambda a: a.serving_status == SERVING)
    assert (await stub.Invoke(invoke(), timeout=5)).text == "v1:hi"


@pytest.mark.slow
async def test_a_remote_whose_health_says_not_serving_is_not_serving(stub: Stub, remote: Remote) -> None:
    await register(stub, remote)
    remote.signal(signal.SIGUSR1)
    down = await until(stub, lambda a: a.serving_status == NOT_SERVING)
    assert "grpc.health.v1" in down.serving_detail
    assert "NOT_SERVING" in down.serving_detail
    failed = await call_error(stub.Invoke(invoke(), timeout=5))
    assert (failed.code, failed.reason) == (grpc.StatusCode.UNAVAILABLE, "ADAPTER_UNAVAILABLE")
    remote.signal(signal.SIGUSR2)
    await until(stub, lambda a: a.serving_status == SERVING)


@pytest.mark.slow
async def test_runtime_registrations_survive_a_restart_until_deregistered(
    socket_dir: Path, config_file: Path, state_dir: Path, remote: Remote
) -> None:
    first = await create_server(settings(socket_dir, config_file, state_dir))
    try:
        async with grpc.aio.insecure_channel(first.bound[0]) as channel:
            registered = await register(negotiator_pb2_grpc.NegotiatorServiceStub(channel), remote)
    finally:
        await first.stop()
    stored = json.loads((state_dir / FILE_NAME).read_text())
    assert stored["format"] == 1
    assert [(e["shortname"], e["target"]) for e in stored["registrations"]] == [("versioned", remote.target)]

    second = await create_server(settings(socket_dir, config_file, state_dir))
    try:
        assert second.registration_problems == ()
        async with grpc.aio.insecure_channel(second.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            back = await adapter(stub)
            assert (back.source, back.target, back.serving_status) == (
                pb.ADAPTER_SOURCE_RUNTIME,
                remote.target,
                SERVING,
            )
            assert back.declaration.version == registered.declaration.version
            assert (await stub.Invoke(invoke(), timeout=5)).text == "v1:hi"
            await stub.DeregisterAdapter(pb.DeregisterAdapterRequest(shortname="versioned"), timeout=5)
    finally:
        await second.stop()
    assert json.loads((state_dir / FILE_NAME).read_text())["registrations"] == []

    third = await create_server(settings(socket_dir, config_file, state_dir))
    try:
        assert "versioned" not in {entry.shortname for entry in third.registry.list()}
    finally:
        await third.stop()


@pytest.mark.slow
async def test_a_registration_whose_remote_is_down_at_restart_is_kept_not_serving_and_retried(
    socket_dir: Path, config_file: Path, state_dir: Path, remote: Remote
) -> None:
    first = await create_server(settings(socket_dir, config_file, state_dir))
    try:
        async with grpc.aio.insecure_channel(first.bound[0]) as channel:
            registered = await register(negotiator_pb2_grpc.NegotiatorServiceStub(channel), remote)
    finally:
        await first.stop()
    remote.kill()

    second = await create_server(settings(socket_dir, config_file, state_dir))
    try:
        async with grpc.aio.insecure_channel(second.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            kept = await adapter(stub)
            assert kept.serving_status == NOT_SERVING
            assert kept.declaration.version == registered.declaration.version  # the last one it made
            failed = await call_error(stub.Invoke(invoke(), timeout=5))
            assert (failed.code, failed.reason) == (grpc.StatusCode.UNAVAILABLE, "ADAPTER_UNAVAILABLE")

            remote.start(effort="supported", label="v2")
            back = await until(stub, lambda a: a.serving_status == SERVING)
            assert effort_state(back) == common_pb2.CAPABILITY_STATE_SUPPORTED
            assert (await stub.Invoke(invoke(effort="low"), timeout=5)).text == "v2:hi"
    finally:
        await second.stop()
    # The re-read declaration is what the file keeps now.
    stored = json.loads((state_dir / FILE_NAME).read_text())["registrations"][0]["declaration_response"]
    assert {"capability": "CAPABILITY_EFFORT", "state": "CAPABILITY_STATE_SUPPORTED"} in stored[
        "declaration"
    ]["capabilities"]


async def test_a_corrupt_registrations_file_is_reported_and_set_aside_and_the_config_adapters_serve(
    socket_dir: Path, config_file: Path, state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    os.mkdir(state_dir)
    (state_dir / FILE_NAME).write_text('{"format": 1, "registrations": [')
    running = await create_server(settings(socket_dir, config_file, state_dir))
    try:
        (problem,) = running.registration_problems
        assert str(state_dir / FILE_NAME) in problem
        assert "not JSON" in problem
        assert problem in caplog.text
        assert (state_dir / (FILE_NAME + CORRUPT_SUFFIX)).read_text() == '{"format": 1, "registrations": ['
        assert not (state_dir / FILE_NAME).exists()
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            reply = await stub.Invoke(pb.InvokeRequest(adapter="scripted-fw", prompt="still here"), timeout=5)
            assert reply.text
    finally:
        await running.stop()


@pytest.mark.slow
async def test_a_bad_entry_is_skipped_and_the_others_restored(
    socket_dir: Path, config_file: Path, state_dir: Path, remote: Remote
) -> None:
    first = await create_server(settings(socket_dir, config_file, state_dir))
    try:
        async with grpc.aio.insecure_channel(first.bound[0]) as channel:
            await register(negotiator_pb2_grpc.NegotiatorServiceStub(channel), remote)
    finally:
        await first.stop()
    path = state_dir / FILE_NAME
    data = json.loads(path.read_text())
    good = data["registrations"][0]
    data["registrations"] += [
        {"shortname": "no-target"},
        {**good, "shortname": "scripted-fw"},  # a config adapter's name
        {**good, "shortname": "far-away", "target": "10.1.2.3:9"},  # a host nobody allowed
    ]
    path.write_text(json.dumps(data))
    running = await create_server(settings(socket_dir, config_file, state_dir))
    try:
        problems = running.registration_problems
        assert len(problems) == 3
        assert "registrations[1]: target is not a non-empty string" in problems[0]
        assert any('"scripted-fw" skipped' in p for p in problems)
        assert any('"far-away" skipped' in p and "allow" in p for p in problems)
        runtime = [entry.shortname for entry in running.registry.list() if entry.source == "runtime"]
        assert runtime == ["versioned"]
    finally:
        await running.stop()


@pytest.mark.slow
async def test_a_registration_that_cannot_be_stored_is_not_made(
    socket_dir: Path, config_file: Path, tmp_path: Path, remote: Remote
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    running = await create_server(settings(socket_dir, config_file, blocker / "state"))
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            failed = await call_error(
                stub.RegisterAdapter(pb.RegisterAdapterRequest(target=remote.target), timeout=10)
            )
            assert (failed.code, failed.reason) == (grpc.StatusCode.INTERNAL, "REGISTRATION_STORE_FAILED")
            assert failed.metadata["adapter"] == "versioned"
            assert "not-a-directory" in failed.metadata["cause"]
            missing = await call_error(
                stub.GetAdapter(pb.GetAdapterRequest(shortname="versioned"), timeout=5)
            )
            assert missing.reason == "ADAPTER_NOT_FOUND"
    finally:
        await running.stop()


def test_the_state_file_is_private(tmp_path: Path) -> None:
    """The directory is created 0700, as the conversations' is: targets say what runs where."""
    store = RegistrationStore(tmp_path / "fresh")
    store.save('{"format": 1, "registrations": []}\n')
    assert (os.stat(tmp_path / "fresh").st_mode & 0o777) == 0o700
    assert store.load() == ([], [])


@pytest.mark.slow
async def test_a_reconnection_re_reads_the_declaration_without_waiting_for_the_schedule(
    socket_dir: Path, config_file: Path, state_dir: Path, remote: Remote
) -> None:
    slow = dataclasses.replace(settings(socket_dir, config_file, state_dir), adapter_refresh_seconds=600)
    running = await create_server(slow)
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            await register(stub, remote)
            remote.kill()
            await until(stub, lambda a: a.serving_status == NOT_SERVING)  # the channel lost its connection
            remote.start(effort="supported", label="v2")
            back = await until(stub, lambda a: a.serving_status == SERVING)  # READY again: re-read at once
            assert effort_state(back) == common_pb2.CAPABILITY_STATE_SUPPORTED
    finally:
        await running.stop()


@pytest.mark.slow
async def test_negotiator_serve_restarted_brings_back_a_registration_and_follows_its_remote(
    socket_dir: Path, config_file: Path, tmp_path: Path, remote: Remote
) -> None:
    """The console script end to end: `register`, SIGTERM, serve again, `adapters NAME`."""
    target = f"unix:{socket_dir / 'serve.sock'}"
    serve = [
        str(NEGOTIATOR_BIN),
        "serve",
        "--config",
        str(config_file),
        "--state-dir",
        str(tmp_path / "state"),
        "--listen",
        target,
        "--adapter-refresh-seconds",
        str(REFRESH_SECONDS),
    ]

    def cli(*argv: str) -> dict[str, Any]:
        result = subprocess.run(
            [str(NEGOTIATOR_BIN), "--server", target, *argv], capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 0, result.stderr
        loaded: dict[str, Any] = json.loads(result.stdout)
        return loaded

    process, _ = await asyncio.to_thread(start_process, serve)
    try:
        registered = await asyncio.to_thread(cli, "register", remote.target)
        assert (registered["adapter"]["serving"], registered["adapter"]["serving_detail"]) == ("serving", "")
    finally:
        await asyncio.to_thread(stop_process, process)
    remote.kill()
    remote.start(effort="supported", label="v2")
    process, _ = await asyncio.to_thread(start_process, serve)
    try:
        back = (await asyncio.to_thread(cli, "adapters", "versioned"))["adapter"]
        assert (back["source"], back["target"], back["serving"]) == ("runtime", remote.target, "serving")
        assert back["capabilities"]["effort"] == "supported"  # read from the remote as it is now
    finally:
        await asyncio.to_thread(stop_process, process)
