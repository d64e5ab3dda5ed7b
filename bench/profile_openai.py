"""Where the openai path's time goes (a profiling aid, not a benchmark).

    python -m bench.profile_openai [--seconds S] [--rounds N] [--calls N] [--cprofile] [--top K]
                                   [--skip-negotiator]

Starts `bench/mock_chat_server.py` in its own process, as bench_negotiator.py
does, then:

1. pieces: the openai adapter's own per-call work, without any network, in µs
   per call (the best of several batches: the machine is noisy): check_call,
   request_body, the headers, the deadline, read_response of the mock's reply,
   and a whole `invoke` whose HTTP exchange returns the mock's reply at once;
2. in this process, no gRPC: `OpenAIAdapter.invoke` against the mock vs the
   bench's direct httpx POST (same body, same client settings), in
   interleaved rounds: p50 and CPU µs per call of each, so the difference is
   what the adapter does around the exchange;
3. through the negotiator (`negotiator serve` with the bench config) and the
   bare forwarder (`bench/floor_server.py --forward`): per round, the direct
   POST, Invoke to bench-openai, Invoke through the forwarder and Invoke to
   bench-scripted (an adapter that answers at once), each a closed loop of
   one caller, with the CPU this process and the server spend per call. It
   prints the negotiator's own share as bench_negotiator reports it (its
   openai overhead over the direct POST minus the forwarder's), in p50 and in
   CPU per call. With BENCH_NEGOTIATOR_BEFORE=<source tree> (see
   bench/README.md), that tree's negotiator and forwarder are measured in the
   same rounds and their share printed beside this tree's;
4. with --cprofile, cProfile of the adapter's in-process loop (2): the
   functions with the most own time.

Figures drift by tens of percent from minute to minute on the shared cores:
compare rows measured in the same rounds, never across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from agentsidecar.negotiator_service.adapters._calls import Deadline, call_deadline, check_call
from agentsidecar.negotiator_service.adapters.openai import (
    IMPLEMENTED,
    OpenAIAdapter,
    read_response,
    request_body,
)
from agentsidecar.negotiator_service.model import AdapterCall, AdapterSpec, CallKind, CallOptions, JsonValue
from bench.bench_negotiator import (
    API_KEY_ENV,
    BEFORE_ENV,
    MODEL,
    OPENAI,
    PROMPT,
    bench_config,
    floor_server_argv,
    negotiator_argv,
    negotiator_env,
    scripted_invoke_request,
)
from bench.harness import BENCH_DIR, ServerProcess, measure, open_channel, start_server_process
from bench.mock_chat_server import COMPLETION

REPEATS = 7  # batches per piece; the fastest is the work itself
API_KEY = negotiator_env()[API_KEY_ENV]
MOCK_REPLY = json.dumps(COMPLETION).encode()
_NO_HEADERS: Mapping[str, str] = {}

Call = Callable[[], Awaitable[object]]


class CannedExchange(OpenAIAdapter):
    """The openai adapter with its HTTP exchange answered at once by the mock's reply."""

    async def _post(
        self, body: dict[str, JsonValue], headers: dict[str, str], deadline: Deadline
    ) -> tuple[int, Mapping[str, str], bytes]:
        return 200, _NO_HEADERS, MOCK_REPLY


def adapter_spec(base_url: str) -> AdapterSpec:
    return AdapterSpec(
        shortname=OPENAI,
        implementation="openai",
        options={"base_url": base_url, "api_key_env": API_KEY_ENV, "model": MODEL},
    )


def direct_client() -> httpx.AsyncClient:
    """The bench baseline's client: the openai adapter's settings."""
    return httpx.AsyncClient(follow_redirects=False, timeout=None)


def direct_post(client: httpx.AsyncClient, base_url: str) -> Call:
    """The bench baseline: the adapter's POST, made straight from this process."""
    url = httpx.URL(f"{base_url}/chat/completions")
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"Authorization": f"Bearer {API_KEY}"}

    async def post() -> object:
        response = await client.post(url, json=body, headers=headers)
        response.raise_for_status()
        return response.content

    return post


def best_us(work: Callable[[], object], calls: int) -> float:
    for _ in range(min(calls, 500)):
        work()
    batch = max(calls // REPEATS, 1)
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        for _ in range(batch):
            work()
        best = min(best, (time.perf_counter() - started) / batch)
    return best * 1e6


async def best_us_async(work: Call, calls: int) -> float:
    for _ in range(min(calls, 500)):
        await work()
    batch = max(calls // REPEATS, 1)
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        for _ in range(batch):
            await work()
        best = min(best, (time.perf_counter() - started) / batch)
    return best * 1e6


async def pieces(base_url: str, calls: int) -> None:
    adapter = CannedExchange(adapter_spec(base_url))
    try:
        call = AdapterCall(prompt=PROMPT, options=CallOptions())
        declaration = adapter.declaration
        print(f"1. the adapter's own work per call, no network (best of {REPEATS} batches):")
        rows: list[tuple[str, float]] = [
            (
                "check_call",
                best_us(
                    lambda: check_call(declaration, call, CallKind.INVOKE, implemented=IMPLEMENTED), calls
                ),
            ),
            ("request_body", best_us(lambda: request_body(call, MODEL, produce=False), calls)),
            ("headers (key read from the environment)", best_us(adapter._headers, calls)),
            ("call_deadline", best_us(lambda: call_deadline(OPENAI, None, 60.0), calls)),
            (
                "read_response (the mock's reply)",
                best_us(lambda: read_response(OPENAI, 200, _NO_HEADERS, MOCK_REPLY, produce=False), calls),
            ),
        ]

        async def canned_invoke() -> object:
            return await adapter.invoke(call)

        rows.append(
            ("invoke, all of it, exchange answered at once", await best_us_async(canned_invoke, calls))
        )
        for label, micros in rows:
            print(f"  {label:<48} {micros:8.2f} µs")
    finally:
        await adapter.close()


async def cpu_window(call: Call, seconds: float) -> tuple[float, float]:
    """p50 ms and this process's CPU µs per call over one closed-loop window (after a short warm-up)."""
    await measure(call, concurrency=1, duration_s=min(seconds, 0.2), warmup_s=0)
    cpu_started = time.process_time()
    stats = await measure(call, concurrency=1, duration_s=seconds, warmup_s=0)
    return stats.p50_ms, (time.process_time() - cpu_started) / stats.count * 1e6


async def in_process(base_url: str, rounds: int, seconds: float) -> None:
    adapter = OpenAIAdapter(adapter_spec(base_url))
    call = AdapterCall(prompt=PROMPT, options=CallOptions())
    try:
        async with direct_client() as client:
            subjects: dict[str, Call] = {"direct httpx POST": direct_post(client, base_url)}

            async def adapter_invoke() -> object:
                return await adapter.invoke(call)

            subjects["OpenAIAdapter.invoke"] = adapter_invoke
            print(f"\n2. in this process, no gRPC ({rounds} interleaved rounds of {seconds:g} s):")
            print("  round  " + "  ".join(f"{name:>28}" for name in subjects) + "   difference")
            p50s: dict[str, list[float]] = {name: [] for name in subjects}
            cpus: dict[str, list[float]] = {name: [] for name in subjects}
            for index in range(rounds):
                order = list(subjects) if index % 2 == 0 else list(subjects)[::-1]
                for name in order:
                    p50, cpu = await cpu_window(subjects[name], seconds)
                    p50s[name].append(p50)
                    cpus[name].append(cpu)
                cells = "  ".join(f"{p50s[n][-1]:9.3f} ms p50 {cpus[n][-1]:6.0f} µs CPU" for n in subjects)
                difference = p50s["OpenAIAdapter.invoke"][-1] - p50s["direct httpx POST"][-1]
                print(f"  {index:5d}  {cells}   {difference * 1000:+7.0f} µs")
            cells = "  ".join(
                f"{statistics.median(p50s[n]):9.3f} ms p50 {statistics.median(cpus[n]):6.0f} µs CPU"
                for n in subjects
            )
            print(f"  median {cells}")
    finally:
        await adapter.close()


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def through_negotiator(
    base_url: str, workdir: Path, rounds: int, seconds: float, before_tree: str | None
) -> None:
    config = workdir / "negotiator.yaml"
    config.write_text(bench_config(base_url))
    url = f"{base_url}/chat/completions"
    trees: dict[str, str | None] = {"": None}
    if before_tree is not None:
        trees[" before"] = before_tree
    async with contextlib.AsyncExitStack() as stack:
        servers: dict[str, ServerProcess] = {}
        for suffix, tree in trees.items():
            servers[f"openai{suffix}"] = await start_server_process(
                negotiator_argv(f"unix:{workdir / f'negotiator{suffix.strip()}.sock'}", config),
                log_path=workdir / f"negotiator{suffix.strip()}.log",
                env=negotiator_env(tree),
            )
            stack.push_async_callback(servers[f"openai{suffix}"].stop)
            argv = floor_server_argv(f"unix:{workdir / f'forwarder{suffix.strip()}.sock'}", forward=url)
            if tree is not None:
                argv[1] = str(Path(tree) / "bench" / "floor_server.py")
            servers[f"forwarder{suffix}"] = await start_server_process(
                argv, log_path=workdir / f"forwarder{suffix.strip()}.log", env=negotiator_env(tree)
            )
            stack.push_async_callback(servers[f"forwarder{suffix}"].stop)
        stubs = {}
        for name, server in servers.items():
            channel = await open_channel(server.target)
            stack.push_async_callback(channel.close, None)
            stubs[name] = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        openai_request = negotiator_pb2.InvokeRequest(adapter=OPENAI, prompt=PROMPT)
        scripted_request = scripted_invoke_request()

        def invoking(stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, request: Any) -> Call:
            async def call() -> object:
                return await stub.Invoke(request)

            return call

        client = await stack.enter_async_context(direct_client())
        subjects: dict[str, tuple[Call, int | None]] = {"direct": (direct_post(client, base_url), None)}
        for name, server in servers.items():
            subjects[name] = (invoking(stubs[name], openai_request), server.pid)
        subjects["scripted"] = (invoking(stubs["openai"], scripted_request), servers["openai"].pid)
        await negotiator_rounds(subjects, rounds, seconds)


async def negotiator_rounds(
    subjects: Mapping[str, tuple[Call, int | None]], rounds: int, seconds: float
) -> None:
    print(
        f"\n3. through the negotiator and the bare forwarder (floor_server.py --forward), "
        f"{rounds} interleaved rounds of {seconds:g} s:"
    )
    p50s: dict[str, list[float]] = {name: [] for name in subjects}
    cpus: dict[str, list[float]] = {name: [] for name in subjects}
    print("  p50 ms per round:  " + " ".join(f"{name:>16}" for name in subjects))
    for index in range(rounds):
        order = list(subjects) if index % 2 == 0 else list(subjects)[::-1]
        for name in order:
            call, pid = subjects[name]
            await measure(call, concurrency=1, duration_s=min(seconds, 0.2), warmup_s=0)
            own, theirs = time.process_time(), (process_cpu_s(pid) if pid is not None else 0.0)
            stats = await measure(call, concurrency=1, duration_s=seconds, warmup_s=0)
            server_cpu = (process_cpu_s(pid) - theirs) if pid is not None else 0.0
            p50s[name].append(stats.p50_ms)
            cpus[name].append(((time.process_time() - own) + server_cpu) / stats.count * 1e6)
        print(f"  {index:>17}  " + " ".join(f"{p50s[name][-1]:16.3f}" for name in subjects))
    p50 = {name: statistics.median(values) for name, values in p50s.items()}
    cpu = {name: statistics.median(values) for name, values in cpus.items()}
    print(f"  {'median':>17}  " + " ".join(f"{p50[name]:16.3f}" for name in subjects))
    print("  CPU µs per call (this process + the server's), median:")
    print("  " + "  ".join(f"{name} {cpu[name]:.0f}" for name in subjects))
    for suffix in ("", " before"):
        if f"openai{suffix}" not in subjects:
            continue
        figure = p50[f"openai{suffix}"] - p50["direct"]
        floor = p50[f"forwarder{suffix}"] - p50["direct"]
        cpu_share = cpu[f"openai{suffix}"] - cpu[f"forwarder{suffix}"]
        label = "this tree" if not suffix else "before tree"
        print(
            f"  {label}: openai - direct {figure:+.3f} ms, forwarder - direct {floor:+.3f} ms, "
            f"own share {figure - floor:+.3f} ms p50 / {cpu_share:+.0f} µs CPU; "
            f"openai - scripted {p50[f'openai{suffix}'] - p50['scripted']:+.3f} ms"
        )
    print(
        "  own share = (openai - direct) - (forwarder - direct), what bench_negotiator reports;\n"
        "  scripted: the whole gRPC round trip plus the negotiator's generic path, which every adapter pays."
    )


async def profiled(base_url: str, calls: int, top: int) -> None:
    adapter = OpenAIAdapter(adapter_spec(base_url))
    call = AdapterCall(prompt=PROMPT, options=CallOptions())
    try:
        for _ in range(200):
            await adapter.invoke(call)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            await adapter.invoke(call)
        profile.disable()
    finally:
        await adapter.close()
    print(
        f"\n4. cProfile of {calls} OpenAIAdapter.invoke calls against the mock (counts are for all {calls}):"
    )
    pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(top)


async def main(args: argparse.Namespace) -> None:
    os.environ[API_KEY_ENV] = API_KEY  # the in-process adapters read it, as the negotiator does
    with tempfile.TemporaryDirectory(prefix="profile-openai-") as tmp:
        workdir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            mock = await start_server_process(
                [sys.executable, str(BENCH_DIR / "mock_chat_server.py")], log_path=workdir / "mock-chat.log"
            )
            stack.push_async_callback(mock.stop)
            base_url = f"http://{mock.target}/v1"
            await pieces(base_url, args.calls)
            await in_process(base_url, args.rounds, args.seconds)
            if not args.skip_negotiator:
                before = os.environ.get(BEFORE_ENV) or None
                await through_negotiator(base_url, workdir, args.rounds, args.seconds, before)
            if args.cprofile:
                await profiled(base_url, min(args.calls, 3000), args.top)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.8, help="length of each measured window")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds in 2 and 3")
    parser.add_argument(
        "--calls", type=int, default=20000, help="calls per piece in 1; cProfile takes ≤ 3000"
    )
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--skip-negotiator", action="store_true")
    asyncio.run(main(parser.parse_args()))
