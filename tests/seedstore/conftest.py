"""Shared fixtures for the seedstore service and CLI tests.

* `home`: a fresh SKILLSPEC_HOME; `fake_bin`: a directory of fake tools put first on PATH.
* `start_server(...)`: a real seedstore service (grpc.aio) on a Unix socket and on
  127.0.0.1:0, run on its own event loop in a background thread, so tests can
  call it with blocking clients and CLI subprocesses.
* `cli`: the `seedstore` CLI in a subprocess, parametrized "local" (files) and
  "server" (`--server unix:...`). `cli.run(...)` is one `python -m
  agentsidecar.seedstore_service.cli` process; `cli.batch([...])` runs many commands through
  `main()` in one subprocess, which keeps the suite fast on a busy machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from agentsidecar.seedstore_service.server import SeedStoreServer, Settings, create_server

PYTHON = sys.executable
MAIN_ROOT = Path(__file__).resolve().parents[2]

# Runs each argv list of a JSON array (stdin) through main(), capturing what it prints.
_BATCH_SCRIPT = """
import contextlib, io, json, sys
from agentsidecar.seedstore_service.cli import main
results = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
json.dump(results, sys.__stdout__)
"""


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return json.loads(self.stdout)


class ServerThread:
    """A SeedStoreServer on its own loop in a daemon thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.running: SeedStoreServer | None = None
        self._thread = threading.Thread(target=self._run, name="seedstore-test-server", daemon=True)

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("the seedstore server did not start")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:  # surfaced by start()
            self._error = error
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.running = await create_server(self.settings)
        self._ready.set()
        await self._stop.wait()
        await self.running.stop()

    @property
    def unix_target(self) -> str:
        assert self.running is not None
        return next(target for target in self.running.bound if target.startswith("unix:"))

    @property
    def tcp_target(self) -> str:
        assert self.running is not None
        return next(target for target in self.running.bound if not target.startswith("unix:"))

    def sync(self) -> None:
        """Make the index see files the test wrote itself (as the background refresh soon would)."""
        assert self.running is not None
        assert self.running.operations is not None
        self.running.operations.refresh_index()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Short: a Unix socket path must fit in 107 bytes, and pytest's tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="ss-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write_tool(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """`voice-cli` (succeeds) and `broken-cli` (exits 3)."""
    path = tmp_path / "bin"
    path.mkdir()
    write_tool(path, "voice-cli", "exit 0")
    write_tool(path, "broken-cli", "exit 3")
    return path


@pytest.fixture
def check_path(fake_bin: Path) -> str:
    return f"{fake_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"


@pytest.fixture
def base_settings(home: Path, socket_dir: Path, check_path: str) -> Settings:
    return Settings(
        listen=(f"unix:{socket_dir / 'seedstore.sock'}", "127.0.0.1:0"),
        store_root=home / "capabilities",
        equivalents_file=home / "equivalents.yml",
        check_timeout=10.0,
        verify_concurrency=4,
        refresh_interval=0.1,
        grace_seconds=2.0,
        check_path=check_path,
    )


@pytest.fixture
def start_server(base_settings: Settings) -> Iterator[Callable[..., ServerThread]]:
    """`start_server(**setting_overrides)`; every server started is stopped at teardown."""
    started: list[ServerThread] = []

    def start(**overrides: Any) -> ServerThread:
        server = ServerThread(replace(base_settings, **overrides)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def server(start_server: Callable[..., ServerThread]) -> ServerThread:
    return start_server()


@pytest.fixture
def cli_env(home: Path, check_path: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SEEDSTORE_")}
    env["SKILLSPEC_HOME"] = str(home)
    env["PATH"] = check_path
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(MAIN_ROOT), env.get("PYTHONPATH", "")]))
    return env


class Cli:
    """The `seedstore` CLI as a user runs it, locally or through a server."""

    def __init__(self, mode: str, env: dict[str, str], server: ServerThread | None) -> None:
        self.mode = mode
        self.env = env
        self.server = server

    def sync(self) -> None:
        if self.server is not None:
            self.server.sync()

    def argv(self, args: Sequence[str]) -> list[str]:
        if self.server is None:
            return list(args)
        return ["--server", self.server.unix_target, *args]

    def run(self, *args: str, timeout: float = 30) -> CliResult:
        completed = subprocess.run(
            [PYTHON, "-m", "agentsidecar.seedstore_service.cli", *self.argv(args)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return CliResult(completed.returncode, completed.stdout, completed.stderr)

    def batch(self, *commands: Sequence[str], timeout: float = 60) -> list[CliResult]:
        completed = subprocess.run(
            [PYTHON, "-c", _BATCH_SCRIPT],
            input=json.dumps([self.argv(command) for command in commands]),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert completed.returncode == 0, completed.stderr
        return [CliResult(**result) for result in json.loads(completed.stdout)]


@pytest.fixture(params=["local", "server"])
def cli(
    request: pytest.FixtureRequest, cli_env: dict[str, str], start_server: Callable[..., ServerThread]
) -> Cli:
    mode: str = request.param
    return Cli(mode, cli_env, start_server() if mode == "server" else None)


@pytest.fixture
def make_cli(cli_env: dict[str, str]) -> Callable[[ServerThread | None], Cli]:
    def make(server: ServerThread | None) -> Cli:
        return Cli("server" if server is not None else "local", cli_env, server)

    return make
