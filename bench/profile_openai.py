"""Where the openai path's time goes (a profiling aid, not a benchmark).

    python -m bench.profile_openai [--seconds S] [--rounds N] [--calls N] [--cprofile] [--top K]
                                   [--skip-negotiator]
    python -m bench.profile_openai --instructions [--calls N]

Starts `bench/mock_chat_server.py` in its own process, as bench_negotiator.py
does, then:

1. pieces: the openai adapter's own per-call work, without any network, in µs
   per call (the best of several batches: the machine is noisy): check_call,
   request_body, the headers, the deadline, read_response of the mock's reply,
   and a whole `invoke` whose HTTP exchange returns the mock's reply at once;
2. in this process, no gRPC: `OpenAIAdapter.invoke` against the mock vs the
   bench's direct aiohttp POST (same body; one ClientSession without
   timeouts, the client the adapter itself uses), in
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

With --instructions (needs valgrind), none of that: instructions per call in
the server process instead, the figure machine load cannot move (see
bench/count_instructions.py, whose method this follows). The negotiator and
the bare forwarder each run under `valgrind --tool=callgrind` with
instrumentation off, pointed at the mock chat server (unary) or the mock SSE
server (streamed; a second pair of servers); this process makes N calls to
warm each up, switches instrumentation on, makes N more, and reads the
server's total. Rows: Invoke to bench-openai and to bench-scripted through
the negotiator, Invoke through the forwarder and through the floor (no
forwarding: the prompt answered at once), InvokeStream through the
negotiator and the forwarder. The negotiator's own share is its openai row
minus the forwarder's; it splits into what the negotiator's generic path
costs over the floor (scripted minus floor) and what the openai adapter's
exchange costs over the forwarder's (openai minus scripted, against
forwarder minus floor).

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
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

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
from bench.bench_stream import stream_config
from bench.count_instructions import total_instructions
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


def direct_client() -> aiohttp.ClientSession:
    """The bench baseline's client: aiohttp, as the openai adapter, with no per-phase timeouts."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout())


def direct_post(session: aiohttp.ClientSession, base_url: str) -> Call:
    """The bench baseline: the adapter's POST, made straight from this process."""
    url = URL(f"{base_url}/chat/completions")
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"Authorization": f"Bearer {API_KEY}"}

    async def post() -> object:
        async with session.post(url, json=body, headers=headers, allow_redirects=False) as response:
            response.raise_for_status()
            return await response.read()

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
            subjects: dict[str, Call] = {"direct aiohttp POST": direct_post(client, base_url)}

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
                difference = p50s["OpenAIAdapter.invoke"][-1] - p50s["direct aiohttp POST"][-1]
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


async def _callgrind(pid: int, *command: str) -> None:
    process = await asyncio.create_subprocess_exec(
        "callgrind_control",
        *command,
        str(pid),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    if await process.wait() != 0:
        raise RuntimeError(f"callgrind_control {' '.join(command)} {pid} failed")


async def _counted(server: ServerProcess, profile: Path, call: Call, calls: int) -> int:
    """Server instructions per call over `calls` calls, after as many uncounted ones."""
    for _ in range(calls):
        await call()
    await _callgrind(server.pid, "--zero")
    await _callgrind(server.pid, "-i", "on")
    for _ in range(calls):
        await call()
    await _callgrind(server.pid, "-i", "off")
    await _callgrind(server.pid, "--dump")
    dumps = sorted(profile.parent.glob(f"{profile.name}.*"), key=lambda path: path.stat().st_mtime)
    return total_instructions(dumps[-1]) // calls


def _unary(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, request: negotiator_pb2.InvokeRequest
) -> Call:
    async def call() -> object:
        return await stub.Invoke(request)

    return call


def _streaming(stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, adapter: str) -> Call:
    request = negotiator_pb2.InvokeStreamRequest(
        invoke=negotiator_pb2.InvokeRequest(adapter=adapter, prompt=PROMPT)
    )

    async def call() -> object:
        deltas = [message async for message in stub.InvokeStream(request)]
        if not any(message.WhichOneof("kind") == "delta" for message in deltas):
            raise RuntimeError(f"InvokeStream to {adapter or 'the forwarder'} streamed no delta")
        return deltas

    return call


async def instructions(workdir: Path, calls: int) -> None:
    """Callgrind counts of the negotiator's and the bare forwarder's server process per call."""
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (Debian package valgrind)")
    rows: list[tuple[str, str, int]] = []
    async with contextlib.AsyncExitStack() as stack:
        chat = await start_server_process(
            [sys.executable, str(BENCH_DIR / "mock_chat_server.py")], log_path=workdir / "mock-chat.log"
        )
        stack.push_async_callback(chat.stop)
        sse = await start_server_process(
            [sys.executable, str(BENCH_DIR / "mock_sse_server.py")], log_path=workdir / "mock-sse.log"
        )
        stack.push_async_callback(sse.stop)
        chat_url, sse_url = f"http://{chat.target}/v1", f"http://{sse.target}/v1"
        (workdir / "unary.yaml").write_text(bench_config(chat_url))
        (workdir / "stream.yaml").write_text(stream_config(sse_url))
        servers = {
            "negotiator": negotiator_argv(f"unix:{workdir / 'negotiator.sock'}", workdir / "unary.yaml"),
            "forwarder": floor_server_argv(
                f"unix:{workdir / 'forwarder.sock'}", forward=f"{chat_url}/chat/completions"
            ),
            "floor": floor_server_argv(f"unix:{workdir / 'floor.sock'}"),
            "negotiator, SSE mock": negotiator_argv(
                f"unix:{workdir / 'negotiator-sse.sock'}", workdir / "stream.yaml"
            ),
            "forwarder, SSE mock": floor_server_argv(
                f"unix:{workdir / 'forwarder-sse.sock'}", forward=f"{sse_url}/chat/completions"
            ),
        }
        for index, (name, argv) in enumerate(servers.items()):
            profile = workdir / f"server{index}.callgrind"
            server = await start_server_process(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={profile}",
                    "--instr-atstart=no",
                    *argv,
                ],
                log_path=workdir / f"server{index}.log",
                env=negotiator_env(),
                ready_timeout_s=300,
            )
            try:
                channel = await open_channel(server.target)
                try:
                    stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
                    subjects: dict[str, Call]
                    if name == "negotiator":
                        openai = negotiator_pb2.InvokeRequest(adapter=OPENAI, prompt=PROMPT)
                        scripted = scripted_invoke_request()
                        subjects = {
                            "Invoke bench-openai": _unary(stub, openai),
                            "Invoke bench-scripted": _unary(stub, scripted),
                        }
                    elif name in ("forwarder", "floor"):
                        forwarded = negotiator_pb2.InvokeRequest(prompt=PROMPT)
                        subjects = {"Invoke": _unary(stub, forwarded)}
                    else:
                        subjects = {"InvokeStream": _streaming(stub, OPENAI if "negotiator" in name else "")}
                    for method, call in subjects.items():
                        rows.append((name, method, await _counted(server, profile, call, calls)))
                        print(f"  {name}: {method} {rows[-1][2]:,}", flush=True)
                finally:
                    await channel.close(None)
            finally:
                await server.stop(timeout_s=120)
    counted = {(name, method): figure for name, method, figure in rows}
    print(f"\nserver instructions per call, {calls} calls each (callgrind):")
    print("| server | method | instructions/call |")
    print("|---|---|---|")
    for name, method, figure in rows:
        print(f"| {name} | {method} | {figure:,} |")
    unary_share = counted["negotiator", "Invoke bench-openai"] - counted["forwarder", "Invoke"]
    stream_share = (
        counted["negotiator, SSE mock", "InvokeStream"] - counted["forwarder, SSE mock", "InvokeStream"]
    )
    adapter = counted["negotiator", "Invoke bench-openai"] - counted["negotiator", "Invoke bench-scripted"]
    print(
        "negotiator's own share (negotiator - forwarder): "
        f"Invoke {unary_share:+,}, InvokeStream {stream_share:+,}"
    )
    exchange = counted["forwarder", "Invoke"] - counted["floor", "Invoke"]
    print(f"the openai exchange over the scripted adapter (openai - scripted): {adapter:+,}")
    print(f"the forwarder's HTTP exchange over the floor's answer (forwarder - floor): {exchange:+,}")


async def main(args: argparse.Namespace) -> None:
    os.environ[API_KEY_ENV] = API_KEY  # the in-process adapters read it, as the negotiator does
    with tempfile.TemporaryDirectory(prefix="profile-openai-") as tmp:
        workdir = Path(tmp)
        if args.instructions:
            await instructions(workdir, args.calls)
            return
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
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count server instructions per call under callgrind instead (--calls each; try 300)",
    )
    asyncio.run(main(parser.parse_args()))
