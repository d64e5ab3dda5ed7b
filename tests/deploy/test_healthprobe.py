"""agentsidecar-health-probe against real servers: grpc_health_probe's exit codes and messages.

Servers are real grpc.aio servers (agentsidecar.sidecar_runtime.server.start_server on a
Unix socket in tmp_path and 127.0.0.1:0; a TLS server for the -tls flags).
The probe runs in a worker thread (the server needs the event loop) or as a
real `python -m agentsidecar.sidecar_runtime.healthprobe` subprocess.
"""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentsidecar.sidecar_runtime import healthprobe
from agentsidecar.sidecar_runtime.server import RunningServer, ServerOptions, start_server

REPO = Path(__file__).resolve().parents[2]
FAKE_SERVICE = "test.healthprobe.v1.FakeService"
Capture = pytest.CaptureFixture[str]
FAST = ["-connect-timeout", "300ms", "-rpc-timeout", "2s"]


class UserAgentRecorder(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Remembers the user-agent of every call, to check -user-agent end to end."""

    def __init__(self) -> None:
        self.user_agents: list[str] = []

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[object, object]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[object, object]:
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "user-agent":
                self.user_agents.append(str(value))
        return await continuation(handler_call_details)


@dataclass
class HealthServer:
    running: RunningServer
    socket_path: Path
    tcp: str  # 127.0.0.1:PORT
    recorder: UserAgentRecorder = field(default_factory=UserAgentRecorder)

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket_path}"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[HealthServer]:
    socket_path = tmp_path / "probe.sock"
    recorder = UserAgentRecorder()
    running = await start_server(
        lambda _server: None,  # no application servicers: health and reflection only
        (FAKE_SERVICE,),
        ServerOptions(listen=(f"unix:{socket_path}", "127.0.0.1:0"), grace_seconds=0.1),
        interceptors=(recorder,),
    )
    tcp = next(target for target in running.bound if not target.startswith("unix:"))
    yield HealthServer(running=running, socket_path=socket_path, tcp=tcp, recorder=recorder)
    await running.stop()


async def probe(*args: str) -> int:
    """Run the probe in-process, off the event loop the server lives on."""
    return await asyncio.to_thread(healthprobe.main, list(args))


async def probe_process(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentsidecar.sidecar_runtime.healthprobe",
        *args,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=30)
    assert stdout == b"", "the probe writes nothing to stdout"
    assert process.returncode is not None
    return process.returncode, stderr.decode()


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- exit 0: SERVING -----------------------------------------------------------


async def test_serving_overall_over_unix_url(server: HealthServer, capsys: Capture) -> None:
    assert await probe("-addr", server.unix_url, *FAST) == 0
    assert capsys.readouterr().err == "status: SERVING\n"


async def test_serving_by_service_name_over_tcp(server: HealthServer, capsys: Capture) -> None:
    assert await probe("-addr", server.tcp, "-service", FAKE_SERVICE, *FAST) == 0
    assert capsys.readouterr().err == "status: SERVING\n"


async def test_serving_over_unix_relative_form(server: HealthServer) -> None:
    assert await probe("-addr", f"unix:{server.socket_path}", "-service", FAKE_SERVICE) == 0


async def test_double_dash_and_equals_spellings(server: HealthServer) -> None:
    assert await probe(f"--addr={server.unix_url}", "--service", FAKE_SERVICE, "--connect-timeout=2s") == 0


async def test_verbose_reports_options_and_timings(server: HealthServer, capsys: Capture) -> None:
    assert await probe("-addr", server.tcp, "-v", "-connect-timeout", "1.5s") == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "parsed options:"
    assert lines[1] == f"> addr={server.tcp} conn_timeout=1.5s rpc_timeout=1s"
    assert "establishing connection" in lines
    assert any(line.startswith("connection established (took ") for line in lines)
    assert lines[-2].startswith("time elapsed: connect=")
    assert lines[-1] == "status: SERVING"


@pytest.mark.slow
async def test_user_agent_reaches_the_server(server: HealthServer) -> None:
    assert await probe("-addr", server.tcp) == 0
    assert await probe("-addr", server.tcp, "-user-agent", "kubelet-ish/9.9") == 0
    default_agent, custom_agent = server.recorder.user_agents
    assert default_agent.startswith("agentsidecar-health-probe")
    assert custom_agent.startswith("kubelet-ish/9.9")


@pytest.mark.slow
async def test_serving_exit_code_from_a_real_process(server: HealthServer) -> None:
    code, stderr = await probe_process("-addr", server.unix_url, "-service", FAKE_SERVICE)
    assert (code, stderr) == (0, "status: SERVING\n")


# --- exit 4: answered, but not SERVING ----------------------------------------


@pytest.mark.slow
async def test_not_serving_exits_4(server: HealthServer, capsys: Capture) -> None:
    await server.running.health.set(FAKE_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert await probe("-addr", server.tcp, "-service", FAKE_SERVICE) == 4
    assert capsys.readouterr().err == 'service unhealthy (responded with "NOT_SERVING")\n'
    # The overall status is separate and still SERVING.
    assert await probe("-addr", server.tcp) == 0


@pytest.mark.slow
async def test_not_serving_from_a_real_process_during_graceful_shutdown(server: HealthServer) -> None:
    await server.running.health.enter_graceful_shutdown()
    code, stderr = await probe_process("-addr", server.unix_url)
    assert code == 4
    assert stderr == 'service unhealthy (responded with "NOT_SERVING")\n'


# --- exit 3: the RPC failed ----------------------------------------------------


async def test_unknown_service_is_an_rpc_failure(server: HealthServer, capsys: Capture) -> None:
    assert await probe("-addr", server.tcp, "-service", "no.such.Service") == 3
    assert capsys.readouterr().err.startswith("error: health rpc failed: rpc error: code = NotFound desc = ")


async def test_server_without_health_service_exits_3(capsys: Capture) -> None:
    bare = grpc.aio.server()
    port = bare.add_insecure_port("127.0.0.1:0")
    await bare.start()
    try:
        assert await probe("-addr", f"127.0.0.1:{port}") == 3
    finally:
        await bare.stop(None)
    assert capsys.readouterr().err == (
        "error: this server does not implement the grpc health protocol (grpc.health.v1.Health)\n"
    )


# --- exit 2: no connection -------------------------------------------------------


async def test_absent_socket_exits_2(tmp_path: Path, capsys: Capture) -> None:
    missing = tmp_path / "missing.sock"
    assert await probe("-addr", f"unix://{missing}", "-connect-timeout", "200ms") == 2
    assert capsys.readouterr().err == f'timeout: failed to connect service "unix://{missing}" within 200ms\n'


@pytest.mark.slow
async def test_closed_port_exits_2(capsys: Capture) -> None:
    port = closed_port()
    assert await probe("-addr", f"127.0.0.1:{port}", "-connect-timeout", "300ms") == 2
    assert capsys.readouterr().err == f'timeout: failed to connect service "127.0.0.1:{port}" within 300ms\n'


@pytest.mark.slow
async def test_absent_socket_from_a_real_process(tmp_path: Path) -> None:
    code, stderr = await probe_process(
        "-addr", f"unix://{tmp_path / 'gone.sock'}", "-connect-timeout", "200ms"
    )
    assert code == 2
    assert stderr.startswith("timeout: failed to connect service ")


@pytest.mark.slow
async def test_socket_removed_after_stop_exits_2(server: HealthServer) -> None:
    assert await probe("-addr", server.unix_url) == 0
    await server.running.stop()
    assert not server.socket_path.exists()
    assert await probe("-addr", server.unix_url, "-connect-timeout", "200ms") == 2


# --- exit 1: invalid arguments ---------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "error: -addr not specified"),
        (["-addr"], "error: flag needs an argument: -addr"),
        (["-addr", "h:1", "-bogus"], "error: flag provided but not defined: -bogus"),
        (["-addr", "h:1", "---tls"], "error: bad flag syntax: ---tls"),
        (["-addr", "no-port-here"], "error: -addr: address must be unix:PATH or HOST:PORT"),
        (["-addr", "unix://relative.sock"], "error: -addr: unix:// addresses need an absolute path"),
        (["-addr", "h:1", "-connect-timeout", "1"], 'error: invalid value "1" for flag -connect-timeout'),
        (
            ["-addr", "h:1", "-rpc-timeout", "0s"],
            "error: -rpc-timeout must be greater than zero (specified: 0s)",
        ),
        (["-addr", "h:1", "-connect-timeout=-1s"], "must be greater than zero (specified: -1s)"),
        (["-addr", "h:1", "-tls=maybe"], 'error: invalid boolean value "maybe" for -tls'),
        (["-addr", "h:1", "-tls-ca-cert", "ca.pem"], "error: specified -tls-ca-cert without specifying -tls"),
        (["-addr", "h:1", "-tls=false", "-tls-server-name", "x"], "without specifying -tls"),
        (["-addr", "h:1", "-tls", "-tls-client-cert", "c.pem"], "without specifying -tls-client-key"),
        (["-addr", "h:1", "-tls", "-tls-client-key", "k.pem"], "without specifying -tls-client-cert"),
        (["-addr", "h:1", "-tls", "-tls-no-verify"], "error: -tls-no-verify is not supported"),
        (["-addr", "h:1", "stray"], "error: unexpected argument 'stray'"),
        (["-addr", "h:1", "--", "stray"], "error: unexpected argument 'stray'"),
    ],
)
def test_invalid_arguments_exit_1(argv: list[str], message: str, capsys: Capture) -> None:
    assert healthprobe.main(argv) == 1
    first_line = capsys.readouterr().err.splitlines()[0]
    assert message in first_line


@pytest.mark.slow
def test_invalid_arguments_from_a_real_process() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agentsidecar.sidecar_runtime.healthprobe", "-addr", "h:1", "-nope"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: flag provided but not defined: -nope\n")


@pytest.mark.parametrize("flag", ["-h", "--help", "-help"])
def test_help_exits_0_and_documents_the_flags(flag: str, capsys: Capture) -> None:
    assert healthprobe.main([flag]) == 0
    text = capsys.readouterr().err
    grpc_health_probe_flags = [
        "addr",
        "service",
        "connect-timeout",
        "rpc-timeout",
        "tls",
        "tls-no-verify",
        "tls-ca-cert",
        "tls-client-cert",
        "tls-client-key",
        "tls-server-name",
        "user-agent",
        "v",
    ]
    for name in grpc_health_probe_flags:
        assert re.search(rf"^  -{name}( string| duration)?$", text, re.MULTILINE), name
    assert "NOT SUPPORTED" in text


def test_go_boolean_spellings() -> None:
    assert healthprobe.build_options(["-addr", "h:1", "-v=true"]).verbose is True
    assert healthprobe.build_options(["-addr", "h:1", "-v=0"]).verbose is False
    assert healthprobe.build_options(["-addr", "h:1", "-v", "-v=F"]).verbose is False  # the last one wins


# --- durations -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("1s", 1_000_000_000),
        ("500ms", 500_000_000),
        ("2.5s", 2_500_000_000),
        ("1m30s", 90_000_000_000),
        ("1h", 3_600_000_000_000),
        ("300us", 300_000),
        ("1.5µs", 1_500),
        ("7ns", 7),
        (".5s", 500_000_000),
        ("0", 0),
        ("-1.5s", -1_500_000_000),
    ],
)
def test_parse_go_duration(text: str, nanos: int) -> None:
    assert healthprobe.parse_go_duration(text) == nanos


@pytest.mark.parametrize("text", ["", "1", "s", "1x", "1s2", "-", "1.5", "ms", "1 s"])
def test_parse_go_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        healthprobe.parse_go_duration(text)


@pytest.mark.parametrize(
    ("nanos", "text"),
    [
        (0, "0s"),
        (1_000_000_000, "1s"),
        (500_000_000, "500ms"),
        (2_500_000_000, "2.5s"),
        (90_000_000_000, "1m30s"),
        (3_600_000_000_000, "1h0m0s"),
        (1_500, "1.5µs"),
        (42, "42ns"),
        (-2_000_000_000, "-2s"),
    ],
)
def test_format_go_duration(nanos: int, text: str) -> None:
    assert healthprobe.format_go_duration(nanos) == text


# --- TLS ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, f"openssl {' '.join(map(str, args))} failed: {result.stderr}"


def _issue(directory: Path, name: str, subject: str, extensions: str) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=directory)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=directory)
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=directory,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throwaway CA, a server cert for `sidecar.test` only, and a client cert."""
    directory = tmp_path_factory.mktemp("pki")
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=directory)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=healthprobe test CA", "-days", "1",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-out", "ca.pem", cwd=directory,
    )  # fmt: skip
    _issue(
        directory,
        "server",
        "/CN=sidecar.test",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:sidecar.test\n",
    )
    _issue(
        directory,
        "client",
        "/CN=worker",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    return Pki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )


@pytest.fixture
async def mtls_server(pki: Pki) -> AsyncIterator[str]:
    """A health server that demands a client certificate signed by the test CA."""
    server = grpc.aio.server()
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    credentials = grpc.ssl_server_credentials(
        [(pki.server_key.read_bytes(), pki.server_cert.read_bytes())],
        root_certificates=pki.ca.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    yield f"127.0.0.1:{port}"
    await server.stop(None)


def _tls_args(pki: Pki, *, ca: bool = True, server_name: bool = True, client: bool = True) -> list[str]:
    args = ["-tls", "-connect-timeout", "500ms"]
    if ca:
        args += ["-tls-ca-cert", str(pki.ca)]
    if server_name:
        args += ["-tls-server-name", "sidecar.test"]
    if client:
        args += ["-tls-client-cert", str(pki.client_cert), "-tls-client-key", str(pki.client_key)]
    return args


@pytest.mark.slow
async def test_mtls_with_ca_server_name_and_client_cert(mtls_server: str, pki: Pki) -> None:
    assert await probe("-addr", mtls_server, *_tls_args(pki)) == 0


@pytest.mark.slow
async def test_mtls_without_client_cert_cannot_connect(mtls_server: str, pki: Pki) -> None:
    assert await probe("-addr", mtls_server, *_tls_args(pki, client=False)) == 2


@pytest.mark.slow
async def test_tls_name_mismatch_without_server_name_override(mtls_server: str, pki: Pki) -> None:
    # The certificate names only sidecar.test, not 127.0.0.1.
    assert await probe("-addr", mtls_server, *_tls_args(pki, server_name=False)) == 2


@pytest.mark.slow
async def test_tls_with_system_roots_does_not_trust_the_test_ca(mtls_server: str, pki: Pki) -> None:
    assert await probe("-addr", mtls_server, *_tls_args(pki, ca=False)) == 2


@pytest.mark.slow
async def test_plaintext_probe_against_tls_server_cannot_connect(mtls_server: str) -> None:
    assert await probe("-addr", mtls_server, "-connect-timeout", "500ms") == 2


def test_unreadable_ca_file_is_invalid_arguments(tmp_path: Path, capsys: Capture) -> None:
    missing = tmp_path / "no-ca.pem"
    assert healthprobe.main(["-addr", "127.0.0.1:1", "-tls", "-tls-ca-cert", str(missing)]) == 1
    assert capsys.readouterr().err.startswith("failed to initialize tls credentials. error=")
