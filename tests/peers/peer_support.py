"""Third-party OpenAI-compatible servers for the peer tests: started on loopback, observed through a proxy.

The servers live in venvs of their own under .peers/ (scripts/install-peers.sh). Each is put behind a
`RecordingProxy`, which forwards every request unchanged and keeps its path and JSON body, so a test
can assert on exactly what the upstream received, including that nothing was sent at all.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
PEERS = REPO / ".peers"
START_TIMEOUT_SECONDS = 120.0


def peer_binary(venv: str, name: str) -> Path:
    """The peer's executable; skipped when not installed, except under CI, where that is a failure."""
    path = PEERS / venv / "bin" / name
    if not path.exists():
        message = f"{path} is not installed: run scripts/peers/python-servers.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Peer:
    base_url: str  # ends in /v1
    startup_seconds: float


@contextmanager
def running_peer(
    argv: Sequence[str], port: int, health_path: str, log: Path, env: Mapping[str, str] | None = None
) -> Iterator[Peer]:
    """Start a server process, wait until `health_path` answers 200, stop it (its whole group) after."""
    started = time.monotonic()
    with log.open("w") as output:
        process = subprocess.Popen(
            list(argv),
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with {process.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(url + health_path, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > START_TIMEOUT_SECONDS:
                raise RuntimeError(f"{argv[0]} did not answer within {START_TIMEOUT_SECONDS} s")
            time.sleep(0.2)
        yield Peer(base_url=f"{url}/v1", startup_seconds=time.monotonic() - started)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 15)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait(timeout=5)


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    body: Any  # parsed JSON, None without a body


class RecordingProxy:
    """Forwards HTTP to `upstream` (an origin, no path) and records each request as received."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.received: list[Received] = []
        self.answers: list[Any] = []  # the parsed bodies of the chat completions answers
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=30)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="peer-proxy")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def chat_requests(self) -> list[Any]:
        with self._lock:
            return [r.body for r in self.received if r.path.endswith("/chat/completions")]

    def clear(self) -> None:
        with self._lock:
            self.received.clear()
            self.answers.clear()

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                with proxy._lock:
                    proxy.received.append(Received(self.command, self.path, json.loads(raw) if raw else None))
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")
                }
                answer = proxy._client.request(
                    self.command, proxy.upstream + self.path, content=raw, headers=headers
                )
                body = answer.content
                if self.path.endswith("/chat/completions"):
                    # A streamed answer (text/event-stream) is kept as its text.
                    is_json = "json" in answer.headers.get("content-type", "")
                    parsed = (
                        (json.loads(body) if is_json else body.decode("utf-8", "replace")) if body else None
                    )
                    with proxy._lock:
                        proxy.answers.append(parsed)
                self.send_response(answer.status_code)
                self.send_header("content-type", answer.headers.get("content-type", "application/json"))
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = _forward
            do_POST = _forward

        return Handler
