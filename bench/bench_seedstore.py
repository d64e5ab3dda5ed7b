"""Seedstore benchmarks, each against the echo baseline over the same kind of socket.

* start-up: spawn → READY line and spawn → first SERVING health check, for the
  seedstore (empty store) and for the bare echo server, alternated;
* idle RSS: with 0 seeds, and with 10,000 seeds both right after start-up and
  after it has served searches (an index built lazily shows up only then);
* first VerifySeeds event: from starting the stream to its first event, for a
  seed whose only checks are a PATH lookup of `true` and the evidence command `true`;
* SearchSeeds, one caller, at 10,000 and 100,000 seeds: p50/p99.

Seeds are written as SkillSpec YAML files under a SKILLSPEC_HOME
(`capabilities/<domain>/<id>.yml`), spread over 50 domains, each seed
providing its own capability; five of them also provide the searched one.
The 10k and 100k stores are kept in ~/.cache/agentsidecar-bench between runs
(see `cached_store`); the empty and verify stores are temporary.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import grpc

from agentsidecar.seedstore.v1 import seedstore_pb2, seedstore_pb2_grpc
from agentsidecar.seedstore_service.model import Evidence, Seed
from agentsidecar.seedstore_service.seedfile import dump_seed
from bench.harness import (
    ServerProcess,
    Settings,
    compare,
    compare_startup,
    echo_call,
    echo_server_argv,
    open_channel,
    rss_mib,
    self_timed_window,
    start_server_process,
    window,
)
from bench.report import Row, absolute_row, compared_ratio, info_row, missing_row, startup_rows

DOMAINS = 50
SEARCHED_CAPABILITY = "bench_target"
TARGET_PROVIDERS = 5
STORE_FORMAT_VERSION = 1  # bump when seed_of/seed_text change, so cached stores are rebuilt
VERIFY_SEED_ID = "verify-true"
VERIFY_DOMAIN = "bench"
SEEDSTORE_SERVICE = "agentsidecar.seedstore.v1.SeedStoreService"


def seedstore_executable() -> Path:
    return Path(sys.executable).parent / "seedstore"


def seedstore_argv(listen: str) -> list[str]:
    return [str(seedstore_executable()), "serve", "--listen", listen]


def seedstore_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SKILLSPEC_HOME"] = str(home)
    return env


def target_indices(count: int) -> frozenset[int]:
    """Which seeds also provide the searched capability: spread over the store and over domains."""
    step = max(1, count // TARGET_PROVIDERS)
    return frozenset(k * step + k for k in range(TARGET_PROVIDERS) if k * step + k < count)


def seed_of(index: int, targets: frozenset[int]) -> Seed:
    provides = (f"cap_{index}", SEARCHED_CAPABILITY) if index in targets else (f"cap_{index}",)
    return Seed(
        id=f"seed-{index:06d}",
        domain=f"d{index % DOMAINS:02d}",
        kind="cli",
        command=f"tool-{index}",
        provides=provides,
        aliases=(f"alias text {index}",),
        evidence=(Evidence(source="cli_help", command=f"tool-{index} --help"),),
    )


def seed_text(seed: Seed) -> str:
    """The YAML `dump_seed` writes for a seed shaped like `seed_of`'s, five times faster.

    `write_store` checks it against `dump_seed` on a sample, so the files stay
    exactly what SkillSpec (and the seedstore) would write.
    """
    provides = "".join(f"- {capability}\n" for capability in seed.provides)
    return (
        f"id: {seed.id}\ndomain: {seed.domain}\nkind: {seed.kind}\ncommand: {seed.command}\n"
        f"provides:\n{provides}aliases:\n- {seed.aliases[0]}\n"
        f"evidence:\n- source: cli_help\n  command: {seed.evidence[0].command}\n"
    )


def write_store(home: Path, count: int) -> float:
    """Write `count` seed files under `home`; returns the seconds it took."""
    started = time.perf_counter()
    root = home / "capabilities"
    for domain_index in range(DOMAINS):
        (root / f"d{domain_index:02d}").mkdir(parents=True, exist_ok=True)
    targets = target_indices(count)
    for index in sorted({0, 1, count - 1, *targets}):
        seed = seed_of(index, targets)
        if seed_text(seed) != dump_seed(seed):
            raise RuntimeError(f"bench seed template differs from dump_seed for {seed.id}")
    for index in range(count):
        seed = seed_of(index, targets)
        (root / seed.domain / f"{seed.id}.yml").write_text(seed_text(seed))
    return time.perf_counter() - started


def seed_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentsidecar-bench"


def cached_store(count: int) -> tuple[Path, float | None]:
    """A SKILLSPEC_HOME holding `count` bench seeds, and the seconds spent writing it (None if reused).

    The stores are kept between runs: on this machine's file system deleting
    100,000 small files took minutes (longer than writing them), which would
    have dominated the run. Searches never write to the store, so a complete
    store can be reused as is; a half-written one (no marker) is rebuilt.
    """
    home = seed_cache_root() / f"seeds-{count}-v{STORE_FORMAT_VERSION}"
    marker = home / "complete"
    if marker.is_file():
        return home, None
    if home.exists():
        shutil.rmtree(home)
    seconds = write_store(home, count)
    marker.write_text(f"{count} seeds written in {seconds:.1f} s\n")
    return home, seconds


async def settled_rss_mib(pid: int, *, settle_s: float = 1.0, timeout_s: float = 8.0) -> float:
    """VmRSS once it stops moving: two readings 250 ms apart within 1 %, after `settle_s`."""
    await asyncio.sleep(settle_s)
    deadline = time.monotonic() + timeout_s
    previous = rss_mib(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        current = rss_mib(pid)
        if abs(current - previous) <= 0.01 * previous:
            return current
        previous = current
    return previous


async def _check_search(stub: seedstore_pb2_grpc.SeedStoreServiceAsyncStub) -> int:
    reply = await stub.SearchSeeds(seedstore_pb2.SearchSeedsRequest(capability=SEARCHED_CAPABILITY))
    return len(reply.candidates)


async def _start_seedstore(workdir: Path, home: Path, label: str) -> ServerProcess:
    sock = workdir / f"seedstore-{label}.sock"
    return await start_server_process(
        seedstore_argv(f"unix:{sock}"),
        log_path=workdir / f"seedstore-{label}.log",
        env=seedstore_env(home),
        ready_timeout_s=600.0,
    )


async def _empty_store_rows(
    settings: Settings, workdir: Path, echo: ServerProcess, echo_channel: grpc.aio.Channel, rows: list[Row]
) -> None:
    """Idle RSS with 0 seeds, then the first VerifySeeds event after adding one seed."""
    home = workdir / "home-empty"
    (home / "capabilities").mkdir(parents=True, exist_ok=True)
    server = await _start_seedstore(workdir, home, "empty")
    try:
        echo_rss = await settled_rss_mib(echo.pid)
        store_rss = await settled_rss_mib(server.pid)
        echo_text = f"echo {echo_rss:.1f} MiB"
        rows.append(absolute_row("seedstore idle RSS, 0 seeds", store_rss, "MiB", 80, baseline=echo_text))
        async with grpc.aio.insecure_channel(server.target) as channel:
            await channel.channel_ready()
            stub = seedstore_pb2_grpc.SeedStoreServiceStub(channel)
            await stub.AddSeed(
                seedstore_pb2.AddSeedRequest(
                    id=VERIFY_SEED_ID,
                    domain=VERIFY_DOMAIN,
                    kind="cli",
                    command="true",
                    provides=["bench_verify"],
                    evidence_commands=["true"],
                )
            )
            request = seedstore_pb2.VerifySeedsRequest(ids=[VERIFY_SEED_ID], domain=VERIFY_DOMAIN)
            whole_stream: list[float] = []

            async def first_event() -> float:
                started = time.perf_counter()
                events = aiter(stub.VerifySeeds(request))
                try:
                    await anext(events)
                except StopAsyncIteration:
                    raise RuntimeError("VerifySeeds ended without any event") from None
                arrived = time.perf_counter()
                # Drain the rest so each verification completes before the next starts.
                async for _ in events:
                    pass
                whole_stream.append(time.perf_counter() - started)
                return arrived - started

            comparison = await compare(
                window(echo_call(echo_channel, request.SerializeToString()), settings),
                self_timed_window(first_event, settings),
                rounds=settings.rounds,
            )
        rows.append(compared_ratio("VerifySeeds: first event (p50) vs echo p50", comparison, "p50_ms", 2))
        rows.append(
            info_row(
                "VerifySeeds: whole stream of one seed (`true` ×2), median",
                f"{statistics.median(whole_stream) * 1000:.3f} ms",
            )
        )
    finally:
        await server.stop()


def _rss_row(benchmark: str, rss: float, goal: float | None) -> Row:
    if goal is None:
        return info_row(benchmark, f"{rss:.1f} MiB")
    return absolute_row(benchmark, rss, "MiB", goal)


async def _search_rows(
    settings: Settings,
    workdir: Path,
    echo_channel: grpc.aio.Channel,
    count: int,
    search_goal: float,
    rss_goal: float | None,
    rows: list[Row],
) -> None:
    home, generation_s = await asyncio.to_thread(cached_store, count)
    if generation_s is None:
        rows.append(info_row(f"generate {count:,} seed files", f"reused {home}"))
    else:
        rows.append(info_row(f"generate {count:,} seed files", f"{generation_s:.1f} s (kept in {home})"))
    server = await _start_seedstore(workdir, home, str(count))
    try:
        rows.append(
            info_row(f"seedstore start-up to READY, {count:,} seeds", f"{server.seconds_to_ready:.2f} s")
        )
        rss = await settled_rss_mib(server.pid)
        rows.append(_rss_row(f"seedstore idle RSS, {count:,} seeds, after start-up", rss, rss_goal))
        async with grpc.aio.insecure_channel(server.target) as channel:
            await channel.channel_ready()
            stub = seedstore_pb2_grpc.SeedStoreServiceStub(channel)
            first_started = time.perf_counter()
            found = await _check_search(stub)
            first_search_ms = (time.perf_counter() - first_started) * 1000
            if found != TARGET_PROVIDERS:
                raise RuntimeError(
                    f"search for {SEARCHED_CAPABILITY} found {found} seeds, expected {TARGET_PROVIDERS}"
                )
            label = f"first SearchSeeds after start-up, {count:,} seeds"
            rows.append(info_row(label, f"{first_search_ms:.1f} ms"))
            request = seedstore_pb2.SearchSeedsRequest(capability=SEARCHED_CAPABILITY)

            async def search() -> object:
                return await stub.SearchSeeds(request)

            comparison = await compare(
                window(echo_call(echo_channel, request.SerializeToString()), settings),
                window(search, settings),
                rounds=settings.rounds,
            )
        rows.append(
            compared_ratio(f"SearchSeeds p50, {count:,} seeds, 1 caller", comparison, "p50_ms", search_goal)
        )
        rows.append(
            info_row(
                f"SearchSeeds p99, {count:,} seeds, 1 caller",
                f"{comparison.subject.p99_ms:.3f} ms",
                f"{comparison.baseline.p99_ms:.3f} ms",
                f"{comparison.subject.p99_ms / comparison.baseline.p99_ms:.2f}×",
            )
        )
        rss = await settled_rss_mib(server.pid, settle_s=0.5)
        rows.append(_rss_row(f"seedstore idle RSS, {count:,} seeds, after searches", rss, rss_goal))
    finally:
        await server.stop()


async def run(settings: Settings, rows: list[Row]) -> None:
    """Append each figure to `rows` as soon as it is measured (a later failure keeps them)."""
    workdir = settings.workdir / "seedstore"
    workdir.mkdir(parents=True, exist_ok=True)
    if not seedstore_executable().exists():
        rows.append(missing_row("seedstore (all)", "—", f"{seedstore_executable()} does not exist"))
        return
    startup_home = workdir / "startup-home"  # an empty store
    (startup_home / "capabilities").mkdir(parents=True, exist_ok=True)
    echo_startup, seedstore_startup = await compare_startup(
        seedstore_argv,
        label="seedstore",
        workdir=workdir,
        repeats=settings.startup_repeats,
        env=seedstore_env(startup_home),
    )
    rows += startup_rows("seedstore (0 seeds)", echo_startup, seedstore_startup, 4)
    async with contextlib.AsyncExitStack() as stack:
        echo = await start_server_process(
            echo_server_argv(f"unix:{workdir / 'echo.sock'}"), log_path=workdir / "echo.log"
        )
        stack.push_async_callback(echo.stop)
        echo_channel = await open_channel(echo.target)
        stack.push_async_callback(echo_channel.close, None)
        await _empty_store_rows(settings, workdir, echo, echo_channel, rows)
        await _search_rows(settings, workdir, echo_channel, 10_000, search_goal=2, rss_goal=150, rows=rows)
        if settings.quick:
            label = "SearchSeeds p50, 100,000 seeds, 1 caller"
            rows.append(missing_row(label, "≤ 10×", "skipped with --quick"))
        else:
            await _search_rows(
                settings, workdir, echo_channel, 100_000, search_goal=10, rss_goal=300, rows=rows
            )


if __name__ == "__main__":
    import tempfile

    from bench.report import render_table

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        settings = Settings.for_run(quick="--quick" in sys.argv, workdir=Path(tmp))
        collected: list[Row] = []
        asyncio.run(run(settings, collected))
        print(render_table(collected))
