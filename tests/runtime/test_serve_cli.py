"""The shared `serve` flags through both CLIs: real processes for the wiring, main() for refusals."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from agentsidecar.negotiator_service import cli as negotiator_cli
from agentsidecar.seedstore.v1 import seedstore_pb2, seedstore_pb2_grpc
from agentsidecar.seedstore_service import cli as seedstore_cli
from agentsidecar.seedstore_service.server import Settings as SeedStoreSettings
from agentsidecar.seedstore_service.server import add_serve_arguments as add_seedstore_serve_arguments
from agentsidecar.sidecar_runtime.auth import EnvToken, TlsFiles, TokenFile
from agentsidecar.sidecar_runtime.richstatus import decode_error
from agentsidecar.sidecar_runtime.serve_args import (
    ServeArgumentError,
    add_serve_arguments,
    server_options_from_args,
)

BIN = Path(sys.executable).parent
TOKEN = "cli-token"


@dataclass
class Sidecar:
    process: asyncio.subprocess.Process
    bound: list[str]
    stderr_lines: list[str]

    async def stop(self) -> tuple[int, str]:
        """SIGTERM, then the exit code and everything else it wrote on stderr."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.stderr is not None
        rest = await asyncio.wait_for(self.process.stderr.read(), 20)
        code = await asyncio.wait_for(self.process.wait(), 20)
        return code, "".join(self.stderr_lines) + rest.decode()


async def launch(argv: list[str], env: dict[str, str], wait_for: str | None = None) -> Sidecar:
    """Start a sidecar, wait for its READY line (and a stderr line containing `wait_for`)."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    assert process.stdout is not None
    assert process.stderr is not None
    ready = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
    if not ready.startswith("READY "):
        process.kill()
        raise AssertionError(f"no READY line: {ready!r} {(await process.stderr.read()).decode()}")
    lines: list[str] = []
    while wait_for is not None and not any(wait_for in line for line in lines):
        lines.append((await asyncio.wait_for(process.stderr.readline(), 10)).decode())
    return Sidecar(process, ready.split()[2:], lines)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SEEDSTORE_", "NEGOTIATOR_"))}
    environment["SKILLSPEC_HOME"] = str(tmp_path / "home")
    return environment


@pytest.fixture
async def cleanup() -> AsyncIterator[list[Sidecar]]:
    started: list[Sidecar] = []
    yield started
    for sidecar in started:
        if sidecar.process.returncode is None:
            sidecar.process.kill()
            await sidecar.process.wait()


def metric(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"{name}{labels} not in the scrape:\n{text}")


@pytest.mark.slow
async def test_negotiator_serve_with_token_log_file_metrics_and_socket_mode(
    env: dict[str, str], socket_dir: Path, tmp_path: Path, cleanup: list[Sidecar]
) -> None:
    socket = socket_dir / "negotiator.sock"
    log_file = tmp_path / "calls.jsonl"
    env["NEG_TOKEN"] = TOKEN
    argv = [
        str(BIN / "negotiator"), "serve", "--listen", f"unix:{socket}", "--grace", "1",
        "--token-env", "NEG_TOKEN", "--log-file", str(log_file), "--metrics-listen", "127.0.0.1:0",
        "--socket-mode", "0600", "--max-concurrent-calls", "8", "--default-timeout", "30",
    ]  # fmt: skip
    sidecar = await launch(argv, env, wait_for='"event":"sidecar.metrics"')
    cleanup.append(sidecar)
    (metrics_url,) = [json.loads(line)["url"] for line in sidecar.stderr_lines if "sidecar.metrics" in line]
    assert stat.S_IMODE(socket.stat().st_mode) == 0o600

    async with grpc.aio.insecure_channel(sidecar.bound[0]) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as unauthenticated:
            await stub.RegisterAdapter(
                negotiator_pb2.RegisterAdapterRequest(target="unix:/nowhere"), timeout=5
            )
        assert decode_error(unauthenticated.value).reason == "TOKEN_MISSING"
        hello = negotiator_pb2.InvokeRequest(adapter="demo", prompt="hi")
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await stub.Invoke(hello, timeout=5)  # Invoke runs an adapter: it needs the token too
        assert decode_error(anonymous.value).reason == "TOKEN_MISSING"
        token = (("authorization", f"Bearer {TOKEN}"),)
        refused_call = negotiator_pb2.InvokeRequest(
            adapter="demo", prompt="hi", options=negotiator_pb2.CallOptions(persona="pirate")
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Invoke(refused_call, metadata=token, timeout=5)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        accepted = await stub.Invoke(hello, metadata=token, timeout=5)
        assert accepted.text

    async with httpx.AsyncClient() as client:
        scrape = (await client.get(metrics_url, timeout=5)).text
    assert metric(scrape, "negotiator_refusals_total", capability="persona") == 1
    service = "agentsidecar.negotiator.v1.NegotiatorService"
    invoke = {"grpc_type": "unary", "grpc_service": service, "grpc_method": "Invoke"}
    assert metric(scrape, "grpc_server_started_total", **invoke) == 3
    assert metric(scrape, "grpc_server_handled_total", **invoke, grpc_code="OK") == 1
    assert metric(scrape, "grpc_server_handled_total", **invoke, grpc_code="FailedPrecondition") == 1
    assert metric(scrape, "grpc_server_handled_total", **invoke, grpc_code="Unauthenticated") == 1
    assert metric(scrape, "grpc_server_handling_seconds_count", **invoke) == 3

    code, stderr = await sidecar.stop()
    assert code == 0
    assert '"method"' not in stderr  # the call log went to the file
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    outcomes = [(r["method"], r["status"], r.get("error_reason")) for r in records]
    assert outcomes == [
        ("RegisterAdapter", "UNAUTHENTICATED", "TOKEN_MISSING"),
        ("Invoke", "UNAUTHENTICATED", "TOKEN_MISSING"),
        ("Invoke", "FAILED_PRECONDITION", "UNSUPPORTED_CAPABILITY"),
        ("Invoke", "OK", None),
    ]


@pytest.mark.slow
async def test_seedstore_serve_with_token_file_logs_calls_on_stderr(
    env: dict[str, str], socket_dir: Path, tmp_path: Path, cleanup: list[Sidecar]
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"# seedstore writers\n{TOKEN}\n")
    argv = [
        str(BIN / "seedstore"), "serve", "--listen", f"unix:{socket_dir / 'seedstore.sock'}",
        "--grace-seconds", "1", "--token-file", str(token_file),
    ]  # fmt: skip
    sidecar = await launch(argv, env)
    cleanup.append(sidecar)
    seed = seedstore_pb2.AddSeedRequest(
        id="echo", domain="text", kind="cli", command="echo", provides=["echo"]
    )
    async with grpc.aio.insecure_channel(sidecar.bound[0]) as channel:
        stub = seedstore_pb2_grpc.SeedStoreServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.AddSeed(seed, timeout=5, metadata=(("x-request-id", "add-1"),))
        assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await stub.AddSeed(seed, timeout=5, metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert (tmp_path / "home" / "capabilities" / "text" / "echo.yml").exists()

    code, stderr = await sidecar.stop()
    assert code == 0
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    calls = [line for line in lines if "method" in line]
    assert [(c["method"], c["status"]) for c in calls] == [("AddSeed", "UNAUTHENTICATED"), ("AddSeed", "OK")]
    assert calls[0]["request_id"] == "add-1"
    assert calls[0]["service"] == "agentsidecar.seedstore.v1.SeedStoreService"


async def health_status(target: str) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        status: int = (await check).status
        return status


@pytest.mark.slow
@pytest.mark.parametrize("binary", ["seedstore", "negotiator"])
async def test_a_second_instance_refuses_a_live_socket_and_replaces_a_stale_one(
    binary: str, env: dict[str, str], socket_dir: Path, tmp_path: Path, cleanup: list[Sidecar]
) -> None:
    socket = socket_dir / f"{binary}.sock"
    argv = [str(BIN / binary), "serve", "--listen", f"unix:{socket}", "--grace-seconds", "1"]
    if binary == "negotiator":
        argv += ["--state-dir", str(tmp_path / "state")]
    first = await launch(argv, env)
    cleanup.append(first)

    second = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    cleanup.append(Sidecar(second, [], []))
    assert second.stdout is not None
    assert b"READY" not in await asyncio.wait_for(second.stdout.readline(), 30)
    _, stderr = await asyncio.wait_for(second.communicate(), 30)
    assert second.returncode == 1
    assert f"error: cannot listen on unix:{socket}: another process is serving on it" in stderr.decode()
    # The first keeps its socket, and answers on it.
    assert socket.is_socket()
    assert await health_status(f"unix:{socket}") == health_pb2.HealthCheckResponse.SERVING

    # Killed, the first leaves its socket file behind: a new instance replaces it.
    first.process.kill()
    await first.process.wait()
    assert socket.is_socket()
    third = await launch(argv, env)
    cleanup.append(third)
    assert await health_status(f"unix:{socket}") == health_pb2.HealthCheckResponse.SERVING
    code, _ = await third.stop()
    assert code == 0


# --- refusals at start-up, in-process -------------------------------------------------------


def test_negotiator_refuses_a_token_on_a_network_listener(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEG_TOKEN", TOKEN)
    assert negotiator_cli.main(["serve", "--listen", "0.0.0.0:0", "--token-env", "NEG_TOKEN"]) == 1
    error = capsys.readouterr().err
    assert "--listen 0.0.0.0:0: bearer tokens would cross the network in clear" in error


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve"], "the following arguments are required: --listen"),
        (["serve", "--listen", "unix:x", "--tls-key", "k.pem"], "--tls-cert and --tls-key go together"),
        (["serve", "--listen", "unix:x", "--tls-client-ca", "ca.pem"], "--tls-client-ca needs --tls-cert"),
        (["serve", "--listen", "nowhere"], "--listen: address must be unix:PATH or HOST:PORT"),
        (
            ["serve", "--listen", "unix:x", "--metrics-listen", "unix:m"],
            "--metrics-listen: expected HOST:PORT",
        ),
        (["serve", "--listen", "unix:x", "--socket-mode", "999"], "expected octal permissions"),
        (["serve", "--listen", "unix:x", "--max-concurrent-calls", "0"], "expected a positive integer"),
        (["serve", "--listen", "unix:x", "--default-timeout", "-1"], "expected a positive number"),
        (["serve", "--listen", "unix:x", "--token-file", "t", "--token-env", "T"], "not allowed with"),
        (["serve", "--listen", "unix:x", "--log-file", "f", "--no-call-log"], "not allowed with"),
    ],
)
def test_negotiator_usage_errors_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_request:
        negotiator_cli.main(argv)
    assert exit_request.value.code == 2
    assert message in capsys.readouterr().err


def test_seedstore_start_up_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SKILLSPEC_HOME", str(tmp_path))
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    argv = ["serve", "--listen", f"unix:{tmp_path / 's.sock'}", "--token-env", "NOT_SET_ANYWHERE"]
    assert seedstore_cli.main(argv) == 1
    assert "--token-env NOT_SET_ANYWHERE: the variable is not set or empty" in capsys.readouterr().err
    assert seedstore_cli.main(["serve", "--listen", "unix:x", "--socket-mode", "rw"]) == 2
    assert "expected octal permissions" in capsys.readouterr().err


def test_otel_without_the_package_fails_start_up(
    capsys: pytest.CaptureFixture[str], socket_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.instrumentation.grpc", None)  # import now fails
    assert negotiator_cli.main(["serve", "--listen", f"unix:{socket_dir / 'n.sock'}", "--otel"]) == 1
    assert "--otel needs the opentelemetry-instrumentation-grpc package" in capsys.readouterr().err


# --- parsing ---------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(argv)


def test_every_flag_reaches_server_options(tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("abc\n")
    args = parse(
        [
            "--listen", "unix:/run/a.sock", "--listen", "127.0.0.1:0", "--health-listen", "0.0.0.0:8081",
            "--grace-seconds", "3", "--socket-mode", "0640", "--token-file", str(token_file),
            "--open-reads", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem",
            "--max-message-bytes", "1024", "--max-concurrent-calls", "16", "--default-timeout", "2.5",
            "--log-file", "/var/log/calls.jsonl", "--metrics-listen", "127.0.0.1:9464", "--otel",
        ]
    )  # fmt: skip
    options = server_options_from_args(args)
    assert options.listen == ("unix:/run/a.sock", "127.0.0.1:0")
    assert options.health_listen == ("0.0.0.0:8081",)
    assert options.grace_seconds == 3.0
    assert options.unix_socket_mode == 0o640
    assert isinstance(options.tokens, TokenFile)
    assert options.tokens.tokens() == (b"abc",)
    assert options.open_reads
    assert options.tls == TlsFiles(Path("c.pem"), Path("k.pem"), Path("ca.pem"))
    assert options.max_message_bytes == 1024
    assert options.max_concurrent_calls == 16
    assert options.default_timeout == 2.5
    assert options.call_log == "/var/log/calls.jsonl"
    assert options.metrics_listen == "127.0.0.1:9464"
    assert options.otel


def test_defaults() -> None:
    options = server_options_from_args(parse([]))
    expected: dict[str, Any] = {
        "listen": (),
        "health_listen": (),
        "grace_seconds": 10.0,
        "unix_socket_mode": 0o660,
        "tokens": None,
        "open_reads": False,
        "tls": None,
        "max_message_bytes": 4 * 1024 * 1024,
        "max_concurrent_calls": None,
        "default_timeout": None,
        "call_log": "-",
        "metrics_listen": None,
        "otel": False,
    }
    assert {name: getattr(options, name) for name in expected} == expected
    assert server_options_from_args(parse(["--no-call-log"])).call_log is None


def test_grace_alias_and_the_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse(["--grace", "4"])
    assert (args.grace_seconds, args.grace) == (4.0, 4.0)
    assert parse(["--grace-seconds", "5"]).grace == 5.0  # the negotiator's earlier attribute
    options = server_options_from_args(parse(["--token-env", "T"]), env={"T": "tok"})
    assert isinstance(options.tokens, EnvToken)
    assert options.tokens.tokens() == (b"tok",)
    with pytest.raises(ServeArgumentError, match=r"--token-file .*cannot read"):
        server_options_from_args(parse(["--token-file", "/nonexistent/tokens"]))


def test_seedstore_settings_carry_the_runtime_options() -> None:
    parser = argparse.ArgumentParser()
    add_seedstore_serve_arguments(parser)
    args = parser.parse_args(["--grace", "2", "--max-concurrent-calls", "3", "--verify-concurrency", "2"])
    settings = SeedStoreSettings.from_args(args, {"HOME": "/h", "SEEDSTORE_LISTEN": "unix:/run/s.sock"})
    assert settings.listen == ("unix:/run/s.sock",)
    assert settings.grace_seconds == 2.0
    assert settings.verify_concurrency == 2
    assert settings.server_options is not None
    assert settings.server_options.max_concurrent_calls == 3


@pytest.mark.slow
@pytest.mark.parametrize("call_log", [[], ["--no-call-log"]], ids=["with-call-log", "no-call-log"])
async def test_negotiator_serve_writes_each_decision_on_stderr(
    env: dict[str, str], socket_dir: Path, cleanup: list[Sidecar], call_log: list[str]
) -> None:
    socket = socket_dir / "negotiator.sock"
    argv = [str(BIN / "negotiator"), "serve", "--listen", f"unix:{socket}", "--grace", "1", *call_log]
    sidecar = await launch(argv, env)
    cleanup.append(sidecar)
    async with grpc.aio.insecure_channel(sidecar.bound[0]) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        refused_call = negotiator_pb2.InvokeRequest(
            adapter="demo", prompt="hi", options=negotiator_pb2.CallOptions(persona="pirate")
        )
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Invoke(refused_call, timeout=5)
        await stub.Invoke(negotiator_pb2.InvokeRequest(adapter="demo", prompt="hi"), timeout=5)

    code, stderr = await sidecar.stop()
    assert code == 0
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    decisions = [r for r in records if r.get("event") == "negotiator.decision"]
    assert [(d["operation"], d["outcome"], d["gaps"]) for d in decisions] == [
        ("invoke", "refused", ["persona"]),
        ("invoke", "accepted", []),
    ]
    calls = [(r["method"], r["status"]) for r in records if "method" in r]
    if call_log:
        assert calls == []
    else:
        # One writer for both: each call's decision line comes before its call line.
        not_lifecycle = [r for r in records if not r.get("event", "").startswith("sidecar.")]
        assert [r.get("event") or r["status"] for r in not_lifecycle] == [
            "negotiator.decision",
            "FAILED_PRECONDITION",
            "negotiator.decision",
            "OK",
        ]
