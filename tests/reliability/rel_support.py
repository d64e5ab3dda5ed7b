"""Shared machinery of the reliability suite: sizes, sidecar processes, figures, status checks.

Imported as `tests.reliability.rel_support` (the repository root is on sys.path
through the editable install), so mypy and pytest agree on its name.

Every sidecar here is a real process (`seedstore serve`, `negotiator serve`)
listening on a Unix socket, so its memory can be read from /proc and it can be
killed or stopped like a deployed one. Their stderr goes to a file, never a
pipe: a chatty server writing into a pipe nobody reads would block.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentsidecar.negotiator_service import errors as negotiator_errors
from agentsidecar.seedstore_service import errors as seedstore_errors
from agentsidecar.seedstore_service import status as seedstore_status
from agentsidecar.sidecar_runtime.richstatus import DecodedError, decode_error

PYTHON = sys.executable
REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("rel_worker.py")
REMOTE_ADAPTER = REPO / "tests" / "negotiator" / "remote_double.py"
READY_TIMEOUT_SECONDS = 30.0

SEEDSTORE_DOMAIN = seedstore_status.ERROR_DOMAIN
NEGOTIATOR_DOMAIN = "negotiator.agentsidecar"


_Error = TypeVar("_Error", bound=Exception)


def _subclasses(root: type[_Error]) -> Iterator[type[_Error]]:
    yield root
    for child in root.__subclasses__():
        yield from _subclasses(child)


# The ErrorInfo reasons each service documents (its error taxonomy). The base
# classes' reasons are left out: nothing raises them on purpose.
SEEDSTORE_REASONS = frozenset(
    cls.reason
    for cls in _subclasses(seedstore_errors.SeedStoreError)
    if cls is not seedstore_errors.SeedStoreError
)
NEGOTIATOR_REASONS = frozenset(
    {
        *(
            cls.reason
            for cls in _subclasses(negotiator_errors.NegotiatorError)
            if cls is not negotiator_errors.NegotiatorError
        ),
        "SHUTTING_DOWN",  # a watch ended by shutdown (servicer._shutting_down)
    }
)
# INTERNAL is by design for these two: the adapter broke its contract, not the caller.
NEGOTIATOR_INTERNAL_REASONS = frozenset({"OUTPUT_SCHEMA_VIOLATION", "ADAPTER_INTERNAL"})


# --- sizes ---------------------------------------------------------------------


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    value = int(text)
    if value < 1:
        raise ValueError(f"{name} must be at least 1, not {value}")
    return value


@dataclass(frozen=True)
class Sizes:
    """How big each part of the suite runs; CI defaults, or full size with RELIABILITY_FULL=1."""

    full: bool
    processes: int
    updates: int
    shared_seeds: int
    kills: int
    fuzz_examples: int
    clients: int
    soak_seconds: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Sizes:
        full = env.get("RELIABILITY_FULL", "").strip() not in ("", "0")
        return cls(
            full=full,
            processes=_env_int(env, "RELIABILITY_PROCESSES", 8 if full else 4),
            updates=_env_int(env, "RELIABILITY_UPDATES", 200 if full else 25),
            shared_seeds=_env_int(env, "RELIABILITY_SHARED_SEEDS", 3),
            kills=_env_int(env, "RELIABILITY_KILLS", 50 if full else 20),
            fuzz_examples=_env_int(env, "RELIABILITY_FUZZ_EXAMPLES", 500 if full else 100),
            clients=_env_int(env, "RELIABILITY_CLIENTS", 16 if full else 8),
            soak_seconds=_env_int(env, "RELIABILITY_SOAK_SECONDS", 60 if full else 15),
        )


# --- figures -------------------------------------------------------------------


@dataclass
class Figures:
    """Numbers the suite reports: printed as they come, written as JSON at the end."""

    path: Path
    sizes: Sizes
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self, section: str, values: Mapping[str, Any]) -> None:
        self.sections.setdefault(section, {}).update(values)
        print(f"\n[reliability] {section}: {json.dumps(dict(values), sort_keys=True)}", flush=True)

    def write(self) -> None:
        document = {"sizes": self.sizes.__dict__, "sections": self.sections}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        print(f"\n[reliability] figures written to {self.path}", flush=True)


def percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def latency_summary(seconds: Sequence[float], prefix: str) -> dict[str, float]:
    """p50/p95/max in milliseconds, rounded for reading."""
    if not seconds:
        return {}
    return {
        f"{prefix}_p50_ms": round(statistics.median(seconds) * 1000, 2),
        f"{prefix}_p95_ms": round(percentile(seconds, 0.95) * 1000, 2),
        f"{prefix}_max_ms": round(max(seconds) * 1000, 2),
    }


# --- processes -----------------------------------------------------------------


def rss_kib(pid: int) -> int:
    """Resident set size of a live process, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def process_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (Z for a zombie), or None once the pid is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name is in parentheses and may hold spaces; the state follows it.
    return text.rpartition(")")[2].split()[0]


def is_gone(pid: int) -> bool:
    """Dead: absent, or a zombie nobody reaps (PID 1 here does not reap orphans)."""
    return process_state(pid) in (None, "Z", "X")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any sidecar settings, plus `extra`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SEEDSTORE_", "NEGOTIATOR_", "SKILLSPEC_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def read_ready_line(process: subprocess.Popen[str], timeout: float, what: str) -> str:
    """The first stdout line of a process that announces itself with `READY ...`."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else ""
    if not line.startswith("READY"):
        process.kill()
        process.wait(timeout=10)
        raise AssertionError(f"{what} did not start: {line!r}")
    return line.strip()


@dataclass
class Sidecar:
    """A sidecar (or adapter) process started by a test."""

    name: str
    process: subprocess.Popen[str]
    target: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_kib(self) -> int:
        return rss_kib(self.process.pid)

    def log_tail(self, characters: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-characters:]
        return ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not stop in time; always reaped."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)  # in case a test stopped it
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_process(
    name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path | None = None
) -> tuple[subprocess.Popen[str], str]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        process = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            env=dict(env),
            cwd=cwd or REPO,
        )
    try:
        line = read_ready_line(process, READY_TIMEOUT_SECONDS, name)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{log_path.read_text(errors='replace')[-4000:]}") from None
    return process, line


def start_seedstore(
    home: Path,
    socket_path: Path,
    log_path: Path,
    *,
    check_path: str = "/usr/local/bin:/usr/bin:/bin",
    refresh_interval: float = 0.2,
    cwd: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> Sidecar:
    """`seedstore serve` on a Unix socket, with SKILLSPEC_HOME=home."""
    env = clean_env(SKILLSPEC_HOME=str(home), SEEDSTORE_CHECK_PATH=check_path, **(extra_env or {}))
    argv = [
        PYTHON,
        "-m",
        "agentsidecar.seedstore_service.cli",
        "serve",
        "--listen",
        f"unix:{socket_path}",
        "--refresh-interval",
        str(refresh_interval),
        "--grace-seconds",
        "1",
        *extra_args,
    ]
    process, _ = start_process("seedstore serve", argv, env, log_path, cwd)
    return Sidecar("seedstore", process, f"unix:{socket_path}", log_path)


def start_negotiator(
    config: Path, socket_path: Path, log_path: Path, *, extra_env: Mapping[str, str] | None = None
) -> Sidecar:
    """`negotiator serve --config CONFIG` on a Unix socket."""
    env = clean_env(**(extra_env or {}))
    argv = [
        PYTHON,
        "-m",
        "agentsidecar.negotiator_service.cli",
        "serve",
        "--config",
        str(config),
        "--listen",
        f"unix:{socket_path}",
        "--grace",
        "1",
    ]
    process, _ = start_process("negotiator serve", argv, env, log_path)
    return Sidecar("negotiator", process, f"unix:{socket_path}", log_path)


def start_remote_adapter(socket_path: Path, log_path: Path, shortname: str) -> Sidecar:
    """tests/negotiator/remote_double.py: Invoke answers "remote:<prompt>"; "sleep:<s>" sleeps first."""
    argv = [PYTHON, str(REMOTE_ADAPTER), "--listen", f"unix:{socket_path}", "--shortname", shortname]
    process, _ = start_process("remote adapter", argv, clean_env(), log_path)
    return Sidecar(f"remote adapter {shortname}", process, f"unix:{socket_path}", log_path)


def health(target: str, timeout: float = 5.0) -> str:
    """The overall grpc.health.v1 status of a server, by name (SERVING, NOT_SERVING, ...)."""
    with grpc.insecure_channel(target) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout
        )
    name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return name


# --- statuses ------------------------------------------------------------------


def decoded(error: grpc.RpcError) -> DecodedError:
    return decode_error(error)


def describe(error: DecodedError) -> str:
    return f"{error.code.name} reason={error.reason!r} domain={error.domain!r}: {error.message[:300]}"


def seedstore_error_problem(error: DecodedError) -> str | None:
    """Why a seedstore error is outside its documented set, or None when it is documented."""
    if error.code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
        return f"undocumented status {describe(error)}"
    if error.reason not in SEEDSTORE_REASONS or error.domain != SEEDSTORE_DOMAIN:
        return f"no documented ErrorInfo: {describe(error)}"
    return None


def negotiator_error_problem(error: DecodedError) -> str | None:
    """Why a negotiator error is outside its documented set, or None when it is documented."""
    if error.code is grpc.StatusCode.UNKNOWN:
        return f"UNKNOWN status: {describe(error)}"
    if error.reason not in NEGOTIATOR_REASONS or error.domain != NEGOTIATOR_DOMAIN:
        return f"no documented ErrorInfo: {describe(error)}"
    if error.code is grpc.StatusCode.INTERNAL and error.reason not in NEGOTIATOR_INTERNAL_REASONS:
        return f"INTERNAL outside the by-design reasons: {describe(error)}"
    return None


# --- files ---------------------------------------------------------------------

Snapshot = dict[str, tuple[str, int, int, int]]


def snapshot_tree(root: Path, excluded: Sequence[Path]) -> Snapshot:
    """Every entry under `root` but the `excluded` subtrees: kind, size, mode, mtime (ns)."""
    skipped = {str(path) for path in excluded}
    entries: Snapshot = {}
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = [name for name in dirnames if os.path.join(directory, name) not in skipped]
        for name in (*dirnames, *filenames):
            path = os.path.join(directory, name)
            if path in skipped:
                continue
            info = os.lstat(path)
            kind = "dir" if os.path.isdir(path) else "file"
            # A directory's mtime changes with its listing, which the names already show.
            mtime = 0 if kind == "dir" else info.st_mtime_ns
            entries[os.path.relpath(path, root)] = (
                kind,
                info.st_size if kind == "file" else 0,
                info.st_mode,
                mtime,
            )
    return entries


def snapshot_difference(before: Snapshot, after: Snapshot) -> list[str]:
    changes = [f"created {path}" for path in sorted(after.keys() - before.keys())]
    changes += [f"removed {path}" for path in sorted(before.keys() - after.keys())]
    changes += [
        f"modified {path}" for path in sorted(before.keys() & after.keys()) if before[path] != after[path]
    ]
    return changes


def make_short_dir(prefix: str) -> Path:
    """A fresh directory directly under /tmp: Unix socket paths must fit in ~107 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# Not a valid encoding of any request message (a truncated varint).
UNDECODABLE = b"\xff\xff\xff\xff\x0f"


def raw_call(channel: grpc.Channel, path: str, streaming: bool) -> Any:
    """A callable sending raw bytes to `path`; streamed answers are read to the end."""
    if streaming:
        stream = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
        return lambda payload: list(stream(payload, timeout=10))
    unary = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    return lambda payload: unary(payload, timeout=10)
