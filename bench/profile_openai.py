"""Where the openai path's time goes (a profiling aid, not a benchmark).

    python bench/profile_openai.py [--seconds S] [--rounds N] [--calls N] [--cprofile] [--top K]
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
3. through the negotiator (`negotiator serve` with the bench config): per
   round, the direct POST, Invoke to bench-openai and Invoke to bench-scripted
   (an adapter that answers at once), each a closed loop of one caller. It
   prints the bench's figure (openai Invoke p50 minus direct POST p50), how
   much of it the scripted Invoke already takes (the gRPC round trip plus the
   negotiator's generic path, paid by every adapter), the remainder (the
   adapter, plus the exchange being made from inside the negotiator between
   gRPC hops rather than from a client looping on it), and the CPU each
   process spends per call;
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
    MODEL,
    OPENAI,
    PROMPT,
    bench_config,
    negotiator_argv,
    negotiator_env,
    scripted_invoke_request,
)
from bench.harness import BENCH_DIR, measure, open_channel, start_server_process
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


async def through_negotiator(base_url: str, workdir: Path, rounds: int, seconds: float) -> None:
    config = workdir / "negotiator.yaml"
    config.write_text(bench_config(base_url))
    negotiator = await start_server_process(
        negotiator_argv(f"unix:{workdir / 'negotiator.sock'}", config),
        log_path=workdir / "negotiator.log",
        env=negotiator_env(),
    )
    try:
        channel = await open_channel(negotiator.target)
        try:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            openai_request = negotiator_pb2.InvokeRequest(adapter=OPENAI, prompt=PROMPT)
            scripted_request = scripted_invoke_request()

            async def via_openai() -> object:
                return await stub.Invoke(openai_request)

            async def via_scripted() -> object:
                return await stub.Invoke(scripted_request)

            async with direct_client() as client:
                subjects: dict[str, Call] = {
                    "direct": direct_post(client, base_url),
                    "openai": via_openai,
                    "scripted": via_scripted,
                }
                await negotiator_rounds(subjects, negotiator.pid, rounds, seconds)
        finally:
            await channel.close(None)
    finally:
        await negotiator.stop()


async def negotiator_rounds(subjects: Mapping[str, Call], pid: int, rounds: int, seconds: float) -> None:
    print(f"\n3. through the negotiator ({rounds} interleaved rounds of {seconds:g} s; p50 ms):")
    print(
        "  round   direct   openai scripted |   figure  scripted remainder | CPU µs per call (both processes)"
    )
    p50s: dict[str, list[float]] = {name: [] for name in subjects}
    cpus: dict[str, list[float]] = {name: [] for name in subjects}
    for index in range(rounds):
        order = list(subjects) if index % 2 == 0 else list(subjects)[::-1]
        for name in order:
            call = subjects[name]
            await measure(call, concurrency=1, duration_s=min(seconds, 0.2), warmup_s=0)
            own, theirs = time.process_time(), process_cpu_s(pid)
            stats = await measure(call, concurrency=1, duration_s=seconds, warmup_s=0)
            cpu = (time.process_time() - own) + (process_cpu_s(pid) - theirs)
            p50s[name].append(stats.p50_ms)
            cpus[name].append(cpu / stats.count * 1e6)
        print("  " + _negotiator_line(str(index), {n: v[-1] for n, v in p50s.items()}, cpus, index))
    medians = {n: statistics.median(v) for n, v in p50s.items()}
    print("  " + _negotiator_line("median", medians, cpus, None))
    print(
        "  figure = openai - direct (what bench_negotiator reports); remainder = figure - scripted\n"
        "  (scripted: the whole gRPC round trip plus the negotiator's generic path, which every\n"
        "  adapter pays; remainder: the adapter's work plus the exchange made from inside the\n"
        "  negotiator between gRPC hops, slower than from a client looping on it)."
    )


def _negotiator_line(
    label: str, p50: Mapping[str, float], cpus: Mapping[str, list[float]], index: int | None
) -> str:
    figure = p50["openai"] - p50["direct"]
    cpu = {n: (v[index] if index is not None else statistics.median(v)) for n, v in cpus.items()}
    return (
        f"{label:>6} {p50['direct']:8.3f} {p50['openai']:8.3f} {p50['scripted']:8.3f} | "
        f"{figure:+8.3f} {p50['scripted']:9.3f} {figure - p50['scripted']:+9.3f} | "
        f"direct {cpu['direct']:5.0f}  openai {cpu['openai']:5.0f}  scripted {cpu['scripted']:5.0f}"
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
                await through_negotiator(base_url, workdir, args.rounds, args.seconds)
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
