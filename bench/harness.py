"""Closed-loop load generation, interleaved A/B rounds and server subprocesses.

The machine has two shared, noisy cores, so absolute figures drift by tens of
percent between minutes. Every benchmark therefore measures the echo baseline
in the same run, in alternating rounds with the subject, and reports the
median across rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.echo_server import ECHO_METHOD
from bench.report import Comparison, StartupTimes, Stats, median_startup, median_stats, summarize

BENCH_DIR = Path(__file__).resolve().parent
ECHO_SERVER_SCRIPT = BENCH_DIR / "echo_server.py"

TimedCall = Callable[[], Awaitable[float]]


@dataclass(frozen=True, slots=True)
class Settings:
    """How long and how often to measure; `quick` trades precision for a ~1 minute smoke run."""

    duration_s: float
    warmup_s: float
    rounds: int
    startup_repeats: int
    quick: bool
    workdir: Path

    @classmethod
    def for_run(cls, *, quick: bool, workdir: Path) -> Settings:
        if quick:
            return cls(duration_s=0.8, warmup_s=0.2, rounds=2, startup_repeats=2, quick=True, workdir=workdir)
        return cls(duration_s=2.0, warmup_s=0.5, rounds=5, startup_repeats=5, quick=False, workdir=workdir)


async def _closed_loop(timed_call: TimedCall, concurrency: int, duration_s: float) -> Stats:
    """`concurrency` callers, each starting its next call as soon as the last ends."""
    latencies: list[float] = []
    started = time.perf_counter()
    deadline = started + duration_s
    finished_at = started

    async def caller() -> None:
        nonlocal finished_at
        while time.perf_counter() < deadline:
            latencies.append(await timed_call())
        finished_at = max(finished_at, time.perf_counter())

    # A TaskGroup cancels the other callers when one call fails: a broken
    # subject stops the benchmark instead of producing flattering numbers.
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(caller())
    except ExceptionGroup as failures:
        # Callers fail alike; the first failure is the readable one.
        raise failures.exceptions[0] from failures
    return summarize(latencies, finished_at - started)


async def measure_self_timed(
    timed_call: TimedCall, *, concurrency: int, duration_s: float, warmup_s: float
) -> Stats:
    """Like `measure`, for calls that time themselves (returning seconds).

    Used where the interesting latency is only part of the call, e.g. the
    first event of a stream that is then drained.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if warmup_s > 0:
        await _closed_loop(timed_call, concurrency, warmup_s)
    return await _closed_loop(timed_call, concurrency, duration_s)


async def measure(
    call: Callable[[], Awaitable[object]], *, concurrency: int, duration_s: float, warmup_s: float
) -> Stats:
    """Closed-loop load: `concurrency` callers for `duration_s` after `warmup_s` discarded."""

    async def timed() -> float:
        start = time.perf_counter()
        await call()
        return time.perf_counter() - start

    return await measure_self_timed(timed, concurrency=concurrency, duration_s=duration_s, warmup_s=warmup_s)


async def compare(
    baseline: Callable[[], Awaitable[Stats]],
    subject: Callable[[], Awaitable[Stats]],
    *,
    rounds: int,
) -> Comparison:
    """Interleave baseline and subject windows and take the median of each.

    Rounds go A B, B A, A B, ... so that a slow drift of the machine (another
    process ramping up) weighs on both sides alike instead of always hitting
    whichever runs second.
    """
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    baseline_rounds: list[Stats] = []
    subject_rounds: list[Stats] = []
    for index in range(rounds):
        if index % 2 == 0:
            baseline_rounds.append(await baseline())
            subject_rounds.append(await subject())
        else:
            subject_rounds.append(await subject())
            baseline_rounds.append(await baseline())
    return Comparison(
        baseline=median_stats(baseline_rounds),
        subject=median_stats(subject_rounds),
        baseline_rounds=tuple(baseline_rounds),
        subject_rounds=tuple(subject_rounds),
    )


def window(
    call: Callable[[], Awaitable[object]], settings: Settings, *, concurrency: int = 1
) -> Callable[[], Awaitable[Stats]]:
    """One measurement window of `call` with the run's durations, ready for `compare`."""

    async def run_window() -> Stats:
        return await measure(
            call, concurrency=concurrency, duration_s=settings.duration_s, warmup_s=settings.warmup_s
        )

    return run_window


def self_timed_window(
    timed_call: TimedCall, settings: Settings, *, concurrency: int = 1
) -> Callable[[], Awaitable[Stats]]:
    """Like `window`, for calls that time themselves."""

    async def run_window() -> Stats:
        return await measure_self_timed(
            timed_call, concurrency=concurrency, duration_s=settings.duration_s, warmup_s=settings.warmup_s
        )

    return run_window


# --- gRPC client helpers ---------------------------------------------------


def echo_call(channel: grpc.aio.Channel, payload: bytes) -> Callable[[], Awaitable[bytes]]:
    """A call to the echo baseline: raw bytes, no serializers on either side."""
    method = channel.unary_unary(ECHO_METHOD, request_serializer=None, response_deserializer=None)

    async def call() -> bytes:
        reply: bytes = await method(payload)
        return reply

    return call


async def open_channel(target: str, timeout_s: float = 10.0) -> grpc.aio.Channel:
    """A connected channel; connection set-up is never part of a measurement."""
    channel = grpc.aio.insecure_channel(target)
    await asyncio.wait_for(channel.channel_ready(), timeout_s)
    return channel


async def health_is_serving(target: str, timeout_s: float = 0.5) -> bool:
    """One overall-health check on a fresh channel (a fresh channel has no reconnect backoff)."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        serving: bool = reply.status == health_pb2.HealthCheckResponse.SERVING
        return serving


# --- server subprocesses ---------------------------------------------------


class ServerStartError(RuntimeError):
    """A server process exited or stayed silent instead of printing READY.

    `str()` is one line for the results table; `log_tail` holds the end of
    the server's stderr for the console.
    """

    def __init__(self, summary: str, log_tail: str) -> None:
        super().__init__(summary)
        self.log_tail = log_tail


@dataclass(slots=True)
class ServerProcess:
    """A server started by the bench, with the targets it announced."""

    name: str
    process: asyncio.subprocess.Process
    targets: tuple[str, ...]
    spawned_at: float
    ready_at: float
    log_path: Path
    _log: IO[bytes]
    _drain: asyncio.Task[None] | None = field(default=None)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def target(self) -> str:
        return self.targets[0]

    @property
    def seconds_to_ready(self) -> float:
        return self.ready_at - self.spawned_at

    async def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM (the sidecars' graceful stop), then SIGKILL if it hangs."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), timeout_s)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain
        self._log.close()
        returncode = self.process.returncode
        assert returncode is not None
        return returncode


def parse_ready_line(line: str) -> tuple[str, tuple[str, ...]] | None:
    """`READY <name> <target...>` (or `READY <target>`) → (name, targets); None for other lines."""
    words = line.split()
    if not words or words[0] != "READY" or len(words) < 2:
        return None
    if len(words) == 2:
        return "", (words[1],)
    return words[1], tuple(words[2:])


def _log_lines(path: Path) -> list[str]:
    try:
        return [line.rstrip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return []


def _telling_line(lines: Sequence[str]) -> str:
    """The line of a crash log worth quoting: the last `SomethingError: ...`, else the last line."""
    for line in reversed(lines):
        head = line.strip().split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Exit")) and " " not in head:
            return line.strip()
    return lines[-1].strip() if lines else "(no output on stderr)"


def _start_failure(what: str, log_path: Path) -> ServerStartError:
    lines = _log_lines(log_path)
    return ServerStartError(f"{what}: {_telling_line(lines)}", "\n".join(lines[-30:]))


async def start_server_process(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 120.0,
    spawned_hook: Callable[[float], None] | None = None,
) -> ServerProcess:
    """Spawn a server and wait for its READY line; stderr goes to `log_path`.

    `spawned_hook` receives the spawn instant (perf_counter) so a caller can
    start probing health at the same moment.
    """
    full_env = dict(os.environ if env is None else env)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("wb")
    spawned_at = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
        env=full_env,
    )
    if spawned_hook is not None:
        spawned_hook(spawned_at)
    assert process.stdout is not None
    stdout = process.stdout

    async def read_until_ready() -> tuple[str, tuple[str, ...]]:
        while True:
            raw = await stdout.readline()
            if not raw:
                await process.wait()
                raise _start_failure(
                    f"{Path(argv[0]).name} exited with {process.returncode} before READY", log_path
                )
            text = raw.decode(errors="replace").strip()
            parsed = parse_ready_line(text)
            if parsed is not None:
                return parsed

    try:
        name, targets = await asyncio.wait_for(read_until_ready(), ready_timeout_s)
    except BaseException as err:
        if process.returncode is None:
            process.kill()
            await process.wait()
        log.close()
        if isinstance(err, TimeoutError):
            raise _start_failure(
                f"{Path(argv[0]).name} printed no READY within {ready_timeout_s:g}s", log_path
            ) from err
        raise
    ready_at = time.perf_counter()

    async def drain() -> None:
        # Anything printed after READY must be read, or a full pipe would
        # eventually block the server's own writes.
        while await stdout.readline():
            pass

    running = ServerProcess(
        name=name or Path(argv[-1]).name,
        process=process,
        targets=targets,
        spawned_at=spawned_at,
        ready_at=ready_at,
        log_path=log_path,
        _log=log,
    )
    running._drain = asyncio.create_task(drain())
    return running


def echo_server_argv(listen: str) -> list[str]:
    return [sys.executable, str(ECHO_SERVER_SCRIPT), "--listen", listen]


def _socket_exists(path: Path) -> bool:
    return path.exists()  # one stat: cheaper than a thread hop


async def measure_startup(
    argv: Sequence[str],
    *,
    unix_path: Path,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    poll_interval_s: float = 0.005,
) -> StartupTimes:
    """Start a server on a known Unix socket, time READY and health SERVING, stop it.

    Health is probed from the moment of spawn (only once the socket file
    exists, to avoid burning the CPU the starting server needs).
    """
    target = f"unix:{unix_path}"
    spawn_instant: list[float] = []
    serving_at: list[float] = []
    probing_started = asyncio.Event()

    def on_spawn(instant: float) -> None:
        spawn_instant.append(instant)
        probing_started.set()

    async def probe() -> None:
        await probing_started.wait()
        while True:
            if _socket_exists(unix_path) and await health_is_serving(target):
                serving_at.append(time.perf_counter())
                return
            await asyncio.sleep(poll_interval_s)

    prober = asyncio.create_task(probe())
    try:
        server = await start_server_process(argv, log_path=log_path, env=env, spawned_hook=on_spawn)
    except BaseException:
        prober.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await prober
        raise
    try:
        await asyncio.wait_for(prober, 60.0)
    finally:
        await server.stop()
    return StartupTimes(
        to_ready_s=server.ready_at - spawn_instant[0],
        to_serving_s=serving_at[0] - spawn_instant[0],
    )


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User plus system CPU seconds of a process (all its threads), or of one of its threads (the
    main thread's id is the pid), from /proc (clock ticks: 10 ms here)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()  # past the command name
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident set size of a process, from /proc/<pid>/status (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            kib = int(line.split()[1])
            return kib / 1024.0
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def compare_startup(
    subject_argv: Callable[[str], list[str]],
    *,
    label: str,
    workdir: Path,
    repeats: int,
    env: Mapping[str, str] | None = None,
) -> tuple[StartupTimes, StartupTimes]:
    """Median start-up times of (echo server, subject), started alternately `repeats` times.

    `subject_argv` maps a listen address to the subject's command line.
    """
    echo_times: list[StartupTimes] = []
    subject_times: list[StartupTimes] = []
    for attempt in range(repeats):
        echo_sock = workdir / f"startup-echo-{attempt}.sock"
        subject_sock = workdir / f"startup-{label}-{attempt}.sock"
        echo_times.append(
            await measure_startup(
                echo_server_argv(f"unix:{echo_sock}"),
                unix_path=echo_sock,
                log_path=workdir / "startup-echo.log",
            )
        )
        subject_times.append(
            await measure_startup(
                subject_argv(f"unix:{subject_sock}"),
                unix_path=subject_sock,
                log_path=workdir / f"startup-{label}.log",
                env=env,
            )
        )
    return median_startup(echo_times), median_startup(subject_times)


async def cold_direct_seconds(module: str, url: str, client_name: str) -> float:
    """The seconds a fresh Python process's first direct request takes, timed inside it:
    `python -m <module> --cold-direct URL CLIENT` prints them."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, "--cold-direct", url, client_name, stdout=asyncio.subprocess.PIPE
    )
    output, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{module} --cold-direct exited with {process.returncode}")
    return float(output)


def compile_sources() -> None:
    """Write the bytecode of the project's packages and generated code (PYTHONDONTWRITEBYTECODE
    may be set): otherwise every process a benchmark starts compiles its imports again, which
    an installed package never does."""
    repo = Path(__file__).resolve().parent.parent
    packages = [
        str(repo / name)
        for name in ("seedstore_service", "sidecar_runtime", "clients", "negotiator_service", "protos")
    ]
    import subprocess

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *packages], check=False, stdout=subprocess.DEVNULL
    )
