"""Serving lifecycle: health, reflection, remote registration, start-up failures, graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import pytest
from fakes import Hang
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from negotiator_testkit import NEGOTIATOR_BIN, add_fake, call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.cli import main
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server
from agentsidecar.negotiator_service.servicer import SERVICE_NAME
from tests.procs import start_process, stop_process

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"


# --- health and reflection -------------------------------------------------------


async def test_health_is_serving_on_every_listener(negotiator: RunningNegotiator) -> None:
    for target in negotiator.bound:
        async with grpc.aio.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", SERVICE_NAME):
                response = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert response.status == health_pb2.HealthCheckResponse.SERVING
            error = await call_error(health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5))
            assert error.code is grpc.StatusCode.NOT_FOUND


async def test_reflection_lists_the_service(negotiator: RunningNegotiator) -> None:
    def services() -> list[str]:
        with grpc.insecure_channel(negotiator.bound[1]) as channel:
            database = ProtoReflectionDescriptorDatabase(channel)
            found: list[str] = list(database.get_services())
            descriptor = database.FindFileContainingSymbol(SERVICE_NAME)
            assert descriptor.name == "agentsidecar/negotiator/v1/negotiator.proto"
            return found

    names = await asyncio.to_thread(services)
    assert SERVICE_NAME in names
    assert "grpc.health.v1.Health" in names


async def test_the_embedded_default_config_serves_its_demo_adapters(socket_dir: Path) -> None:
    running = await create_server(Settings(listen=(f"unix:{socket_dir / 'default.sock'}",)))
    try:
        assert [e.shortname for e in running.registry.list()] == ["demo", "shell-echo"]
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            response = await stub.Invoke(pb.InvokeRequest(adapter="demo", prompt="echo me"), timeout=5)
        assert response.text == "echo me"
    finally:
        await running.stop()


# --- in-process shutdown ------------------------------------------------------------


async def read_to_end(call: grpc.aio.UnaryStreamCall[Any, Any]) -> None:
    while await call.read() is not grpc.aio.EOF:  # type: ignore[attr-defined]
        pass


def unix_socket_exists(target: str) -> bool:
    return Path(target.removeprefix("unix:")).exists()


async def test_stop_ends_watches_drains_calls_and_closes_adapters(
    negotiator: RunningNegotiator, stub: Stub
) -> None:
    fake = add_fake(negotiator, delay=0.3)
    watch = stub.WatchAdapters(pb.WatchAdaptersRequest())
    await watch.read()
    in_flight = asyncio.ensure_future(stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="late"), timeout=5))
    await asyncio.wait_for(fake.started.wait(), 5)

    loop = asyncio.get_running_loop()
    started = loop.time()
    await negotiator.stop()
    assert loop.time() - started < negotiator.grace_seconds  # the open watch did not hold shutdown

    assert (await in_flight).text == "late"
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await read_to_end(watch)
    assert ended.value.code() is grpc.StatusCode.UNAVAILABLE
    assert fake.close_count == 1
    assert not unix_socket_exists(negotiator.bound[0])


@pytest.mark.slow
async def test_calls_cut_off_at_the_grace_period_are_cancelled(
    negotiator: RunningNegotiator, stub: Stub
) -> None:
    fake = add_fake(negotiator, default=Hang())
    in_flight = asyncio.ensure_future(stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p"), timeout=10))
    await asyncio.wait_for(fake.started.wait(), 5)
    await negotiator.stop()
    with pytest.raises(grpc.aio.AioRpcError):
        await in_flight
    assert [kind for kind, _ in fake.cancelled] == ["invoke"]


# --- remote adapters -----------------------------------------------------------------


@pytest.mark.slow
async def test_register_route_and_deregister_a_remote_adapter(
    stub: Stub, remote_adapter: tuple[str, subprocess.Popen[str]]
) -> None:
    target, _ = remote_adapter
    watch = stub.WatchAdapters(pb.WatchAdaptersRequest())
    existing = await stub.ListAdapters(pb.ListAdaptersRequest(), timeout=5)
    for _ in existing.adapters:
        await watch.read()

    registered = await stub.RegisterAdapter(pb.RegisterAdapterRequest(target=target, shortname="echo-remote"))
    adapter = registered.adapter
    assert adapter.declaration.shortname == "echo-remote"
    assert (adapter.implementation, adapter.source, adapter.target) == (
        "remote",
        pb.ADAPTER_SOURCE_RUNTIME,
        target,
    )
    assert list(adapter.declaration.string_formats) == ["email"]

    change = await asyncio.wait_for(watch.read(), 5)
    assert isinstance(change, pb.WatchAdaptersResponse)
    assert (change.change, change.adapter.declaration.shortname) == (
        pb.ADAPTER_CHANGE_REGISTERED,
        "echo-remote",
    )
    listed = await stub.ListAdapters(pb.ListAdaptersRequest(), timeout=5)
    assert "echo-remote" in [a.declaration.shortname for a in listed.adapters]

    reply = await stub.Invoke(pb.InvokeRequest(adapter="echo-remote", prompt="hi"), timeout=5)
    assert reply.text == "remote:hi"
    produced = await stub.Produce(
        pb.ProduceRequest(
            adapter="echo-remote",
            prompt="q",
            output_schema='{"type": "object"}',
            options=pb.CallOptions(model="m"),
        ),
        timeout=5,
    )
    assert json.loads(produced.output_json) == {"echo": "q", "model": "m"}
    # The remote declared persona unsupported: refused here, never sent.
    refused = await call_error(
        stub.Invoke(pb.InvokeRequest(adapter="echo-remote", prompt="x", options=pb.CallOptions(persona="p")))
    )
    assert refused.reason == "UNSUPPORTED_CAPABILITY"

    duplicate = await call_error(stub.RegisterAdapter(pb.RegisterAdapterRequest(target=target), timeout=5))
    assert duplicate.code is grpc.StatusCode.ALREADY_EXISTS

    removed = await stub.DeregisterAdapter(pb.DeregisterAdapterRequest(shortname="echo-remote"), timeout=5)
    assert removed.adapter.declaration.shortname == "echo-remote"
    change = await asyncio.wait_for(watch.read(), 5)
    assert isinstance(change, pb.WatchAdaptersResponse)
    assert change.change == pb.ADAPTER_CHANGE_DEREGISTERED
    gone = await call_error(stub.Invoke(pb.InvokeRequest(adapter="echo-remote", prompt="hi"), timeout=5))
    assert gone.code is grpc.StatusCode.NOT_FOUND
    watch.cancel()


@pytest.mark.slow
async def test_remote_deadline_and_delegation_depth_are_passed_on(
    stub: Stub, remote_adapter: tuple[str, subprocess.Popen[str]]
) -> None:
    target, _ = remote_adapter
    await stub.RegisterAdapter(pb.RegisterAdapterRequest(target=target), timeout=5)
    reply = await stub.Invoke(
        pb.InvokeRequest(adapter="echo-remote", prompt="options:"),
        timeout=3,
        metadata=(("x-delegation-depth", "2"),),
    )
    seen = json.loads(reply.text.removeprefix("remote:"))
    assert seen["metadata_delegation_depth"] == "2"
    assert 0 < seen["time_remaining"] <= 3.0
    error = await call_error(
        stub.Invoke(pb.InvokeRequest(adapter="echo-remote", prompt="sleep:5"), timeout=0.5)
    )
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.slow
async def test_registration_failures(
    stub: Stub, remote_adapter: tuple[str, subprocess.Popen[str]], tmp_path: Path
) -> None:
    target, _ = remote_adapter
    wrong = await call_error(
        stub.RegisterAdapter(pb.RegisterAdapterRequest(target=target, shortname="other-name"), timeout=10)
    )
    assert wrong.code is grpc.StatusCode.FAILED_PRECONDITION
    assert wrong.reason == "ADAPTER_REGISTRATION_FAILED"
    assert wrong.metadata["target"] == target

    unreachable = await call_error(
        stub.RegisterAdapter(pb.RegisterAdapterRequest(target=f"unix:{tmp_path}/none.sock"), timeout=10)
    )
    assert unreachable.code is grpc.StatusCode.UNAVAILABLE
    assert unreachable.reason == "ADAPTER_UNAVAILABLE"


@pytest.mark.slow
async def test_cli_register_and_deregister(
    capsys: pytest.CaptureFixture[str],
    negotiator: RunningNegotiator,
    remote_adapter: tuple[str, subprocess.Popen[str]],
) -> None:
    target, _ = remote_adapter
    server = negotiator.bound[0]
    assert (
        await asyncio.to_thread(main, ["--server", server, "register", target, "--shortname", "echo-remote"])
        == 0
    )
    adapter = json.loads(capsys.readouterr().out)["adapter"]
    assert (adapter["shortname"], adapter["source"], adapter["implementation"]) == (
        "echo-remote",
        "runtime",
        "remote",
    )
    assert (
        await asyncio.to_thread(main, ["--server", server, "invoke", "--adapter", "echo-remote", "yo"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["text"] == "remote:yo"
    assert await asyncio.to_thread(main, ["--server", server, "deregister", "echo-remote"]) == 0
    assert json.loads(capsys.readouterr().out)["adapter"]["shortname"] == "echo-remote"
    assert await asyncio.to_thread(main, ["--server", server, "deregister", "scripted-fw"]) == 1
    assert "ADAPTER_NOT_REMOVABLE" in capsys.readouterr().err


# --- the `negotiator serve` process -----------------------------------------------------

SLOW_CONFIG = """\
adapters:
  - shortname: slowish
    implementation: scripted
    declaration: {kind: agent-framework}
    options: {invoke: {text: finished}, delay_seconds: 1.5}
"""


@pytest.mark.slow
async def test_sigterm_drains_in_flight_calls_and_exits_0(tmp_path: Path, socket_dir: Path) -> None:
    config = tmp_path / "slow.yaml"
    config.write_text(SLOW_CONFIG)
    socket = socket_dir / "serve.sock"
    process, ready = start_process(
        [str(NEGOTIATOR_BIN), "serve", "--config", str(config), "--listen", f"unix:{socket}", "--grace", "5"]
    )
    try:
        assert ready == f"READY negotiator unix:{socket}"
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            watch = health.Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
            first = await watch.read()
            assert isinstance(first, health_pb2.HealthCheckResponse)
            assert first.status == health_pb2.HealthCheckResponse.SERVING
            in_flight = asyncio.ensure_future(
                stub.Invoke(pb.InvokeRequest(adapter="slowish", prompt="p"), timeout=10)
            )
            await asyncio.to_thread(wait_for_decision_log, process)  # the call is past the broker's judgement

            process.send_signal(signal.SIGTERM)
            second = await asyncio.wait_for(watch.read(), 5)
            assert isinstance(second, health_pb2.HealthCheckResponse)
            assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
            watch.cancel()  # an open watch would otherwise hold the drain for the whole grace

            refused: grpc.StatusCode | None = None
            for _ in range(50):  # new calls are refused once draining starts
                try:
                    await stub.ListAdapters(pb.ListAdaptersRequest(), timeout=1)
                except grpc.aio.AioRpcError as exc:
                    refused = exc.code()
                    break
                await asyncio.sleep(0.02)
            assert refused is grpc.StatusCode.UNAVAILABLE

            response = await in_flight
            assert response.text == "finished"
        code = await asyncio.to_thread(process.wait, 10)
        assert code == 0
        assert not socket.exists()
    finally:
        stop_process(process)


def wait_for_decision_log(process: subprocess.Popen[str]) -> None:
    assert process.stderr is not None
    for line in process.stderr:
        if '"operation": "invoke"' in line:
            return
    raise AssertionError("the server exited without logging the call")


def run_serve(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(NEGOTIATOR_BIN), "serve", *argv], capture_output=True, text=True, timeout=30)


WIDENING_CONFIG = """\
adapters:
  - shortname: wide-cli
    implementation: command
    declaration:
      capabilities: {persona: supported}
    options: {argv: [cat]}
"""


@pytest.mark.slow
async def test_a_config_widening_a_declaration_fails_startup(tmp_path: Path, socket_dir: Path) -> None:
    config = tmp_path / "wide.yaml"
    config.write_text(WIDENING_CONFIG)
    socket = socket_dir / "wide.sock"
    result = await asyncio.to_thread(run_serve, "--config", str(config), "--listen", f"unix:{socket}")
    assert result.returncode == 1
    assert "READY" not in result.stdout
    assert '"wide-cli"' in result.stderr
    assert "capabilities.persona=supported" in result.stderr
    assert not socket.exists()


@pytest.mark.slow
async def test_a_missing_config_file_fails_startup(tmp_path: Path, socket_dir: Path) -> None:
    result = await asyncio.to_thread(
        run_serve, "--config", str(tmp_path / "absent.yaml"), "--listen", f"unix:{socket_dir / 'x.sock'}"
    )
    assert result.returncode == 1
    assert "cannot read config" in result.stderr
    assert "absent.yaml" in result.stderr


@pytest.mark.slow
async def test_serve_needs_a_listen_address() -> None:
    result = await asyncio.to_thread(run_serve)
    assert result.returncode == 2
    assert "--listen" in result.stderr


async def test_a_failure_building_the_service_leaves_no_writer_thread_and_closes_the_adapters(
    config_file: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentsidecar.negotiator_service import server as server_module
    from agentsidecar.negotiator_service.registry import AdapterRegistry

    closed: list[int] = []
    original_close = AdapterRegistry.close

    async def counted_close(self: AdapterRegistry) -> None:
        closed.append(len(self))
        await original_close(self)

    def broken_servicer(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("servicer construction failed")

    monkeypatch.setattr(AdapterRegistry, "close", counted_close)
    monkeypatch.setattr(server_module, "NegotiatorServicer", broken_servicer)
    writers_before = {t for t in threading.enumerate() if t.name == "sidecar-call-log"}
    settings = Settings(
        listen=(f"unix:{socket_dir / 'broken.sock'}",), config_path=config_file, decisions_to_stderr=True
    )
    with pytest.raises(RuntimeError, match="servicer construction failed"):
        await create_server(settings)
    writers_after = {t for t in threading.enumerate() if t.name == "sidecar-call-log"}
    assert writers_after <= writers_before
    assert len(closed) == 1
    assert closed[0] > 0  # the config's adapters were built, then closed
    assert not (socket_dir / "broken.sock").exists()
