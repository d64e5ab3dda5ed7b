"""What the runtime itself adds per call: the same trivial handler with and without start_server.

    python -m bench.bench_runtime [--quick] [--rounds N] [--window SECONDS] [--before DIR]

Four servers, each a subprocess serving `/bench.Echo/Echo` (a protobuf
InvokeRequest decoded and re-encoded, no other work) over a Unix socket:

* `bare`: a plain `grpc.aio.server` with the same channel options and no
  runtime at all: the floor;
* `none`: hosted by `start_server` with no options (as `bench/echo_server.py`);
* `cli`: the options both sidecar CLIs set by default (`serve --listen ...`:
  call log on stderr, limits and auth off);
* `all`: everything on: a bearer token (Echo is a mutating method), Prometheus
  metrics, `--max-concurrent-calls`, `--default-timeout`, call log.

Each round measures every server once (1 caller, then 16 in flight), in an
order rotated from round to round, so a drift of the machine weighs on all
alike; each figure is the median across rounds, and ratios are against
`bare` measured in the same run.

`--before DIR` adds `none`, `cli` and `all` servers importing
`agentsidecar.sidecar_runtime` from DIR (a copy of the package as it was), labelled
`*-before`, so a change to the runtime is measured before and after in the
same run.

`python -m bench.bench_runtime serve --config NAME --listen ADDR` runs one of
the servers (what the benchmark spawns).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agentsidecar.negotiator.v1 import negotiator_pb2
from agentsidecar.sidecar_runtime.serve_args import add_serve_arguments, server_options_from_args
from agentsidecar.sidecar_runtime.server import DEFAULT_MAX_MESSAGE_BYTES, serve_until_signalled, start_server
from bench.harness import Settings, measure, open_channel, start_server_process
from bench.report import Stats, median_stats

ECHO_SERVICE = "bench.Echo"
ECHO_METHOD = f"/{ECHO_SERVICE}/Echo"
TOKEN_ENV = "BENCH_RUNTIME_TOKEN"
TOKEN = "bench-runtime-token"
CONFIGS = ("bare", "none", "cli", "all")
IN_FLIGHT = 16


def payload() -> bytes:
    """The negotiator benchmark's Invoke request: a realistic message to decode and encode."""
    request = negotiator_pb2.InvokeRequest(
        adapter="bench-scripted",
        prompt="Summarise the benchmark in one word.",
        options=negotiator_pb2.CallOptions(model="bench-model"),
    )
    request.options.settings.update({"temperature": 0.2, "seed": 7})
    return request.SerializeToString()


async def _echo(request: negotiator_pb2.InvokeRequest, context: Any) -> negotiator_pb2.InvokeRequest:
    return request


def _register(server: grpc.aio.Server) -> None:
    handler = grpc.unary_unary_rpc_method_handler(
        _echo,
        request_deserializer=negotiator_pb2.InvokeRequest.FromString,
        response_serializer=negotiator_pb2.InvokeRequest.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(ECHO_SERVICE, {"Echo": handler}),))


def _serve_flags(config: str, listen: str) -> list[str]:
    flags = ["--listen", listen]
    if config == "none":
        return [*flags, "--no-call-log"]
    if config == "all":
        flags += ["--token-env", TOKEN_ENV, "--metrics-listen", "127.0.0.1:0"]
        flags += ["--max-concurrent-calls", "64", "--default-timeout", "30"]
    return flags


async def _serve_bare(listen: str) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", DEFAULT_MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", DEFAULT_MAX_MESSAGE_BYTES),
        ]
    )
    _register(server)
    server.add_insecure_port(listen)
    await server.start()
    print(f"READY bare {listen}", flush=True)
    await server.wait_for_termination()


async def _serve(config: str, listen: str) -> None:
    if config == "bare":
        await _serve_bare(listen)
        return
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    options = server_options_from_args(parser.parse_args(_serve_flags(config, listen)), {TOKEN_ENV: TOKEN})
    running = await start_server(_register, (ECHO_SERVICE,), options)  # with a token, Echo needs it
    await serve_until_signalled(running, config)


def _echo_call(channel: grpc.aio.Channel, body: bytes) -> Callable[[], Awaitable[object]]:
    method = channel.unary_unary(ECHO_METHOD, request_serializer=None, response_deserializer=None)
    metadata = (("authorization", f"Bearer {TOKEN}"),)

    async def call() -> object:
        return await method(body, metadata=metadata)

    return call


def _round_ratio(subject: list[Window], baseline: list[Window], figure: str) -> str:
    """The median over rounds of subject / bare within the round: a drift between rounds cancels out."""
    ratios = [
        getattr(s.stats, figure) / getattr(b.stats, figure)
        for s, b in zip(subject, baseline, strict=True)
        if getattr(b.stats, figure)
    ]
    return f"{statistics.median(ratios):.2f}×" if ratios else "—"


def server_cpu_seconds(pid: int) -> float:
    """CPU time of every thread of `pid` so far (schedstat: nanoseconds on a CPU)."""
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total_ns += int((task / "schedstat").read_text().split()[0])
    return total_ns / 1e9


@dataclass(frozen=True, slots=True)
class Window:
    stats: Stats
    server_cpu_us_per_call: float


async def _window(
    call: Callable[[], Awaitable[object]], pid: int, concurrency: int, settings: Settings
) -> Window:
    await measure(call, concurrency=concurrency, duration_s=settings.warmup_s, warmup_s=0)
    cpu_before = server_cpu_seconds(pid)
    stats = await measure(call, concurrency=concurrency, duration_s=settings.duration_s, warmup_s=0)
    cpu_used = server_cpu_seconds(pid) - cpu_before
    return Window(stats, cpu_used / stats.count * 1e6 if stats.count else 0.0)


async def run(settings: Settings, before: Path | None = None) -> str:
    """Measure every server in rotated rounds; the markdown table of medians and ratios."""
    body = payload()
    servers: dict[str, tuple[str, Mapping[str, str]]] = {name: (name, os.environ) for name in CONFIGS}
    if before is not None:
        old_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, (str(before), os.environ.get("PYTHONPATH")))),
        }
        servers |= {f"{name}-before": (name, old_env) for name in CONFIGS[1:]}
    names = tuple(servers)
    single: dict[str, list[Window]] = {name: [] for name in names}
    loaded: dict[str, list[Window]] = {name: [] for name in names}
    async with contextlib.AsyncExitStack() as stack:
        calls: dict[str, Callable[[], Awaitable[object]]] = {}
        pids: dict[str, int] = {}
        for name, (config, env) in servers.items():
            server = await start_server_process(
                [sys.executable, "-m", "bench.bench_runtime", "serve", "--config", config, "--listen",
                 f"unix:{settings.workdir / name}.sock"],
                log_path=settings.workdir / f"{name}.log",
                env=env,
            )  # fmt: skip
            stack.push_async_callback(server.stop)
            channel = await open_channel(server.target)
            stack.push_async_callback(channel.close, None)
            calls[name] = _echo_call(channel, body)
            pids[name] = server.pid
            await calls[name]()  # a broken server fails here, not mid-measurement
        for index in range(settings.rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            for name in order if index % 2 == 0 else tuple(reversed(order)):
                for concurrency, into in ((1, single), (IN_FLIGHT, loaded)):
                    into[name].append(await _window(calls[name], pids[name], concurrency, settings))
            print(f"[bench_runtime] round {index + 1}/{settings.rounds} done", file=sys.stderr, flush=True)
    ones = {name: median_stats([w.stats for w in rounds]) for name, rounds in single.items()}
    many = {name: median_stats([w.stats for w in rounds]) for name, rounds in loaded.items()}
    # CPU time is what neighbours disturb least, and they can only add to it: the lowest round is
    # the steadiest estimate of what a call costs the server.
    cpu_one = {name: min(w.server_cpu_us_per_call for w in rounds) for name, rounds in single.items()}
    cpu_many = {name: min(w.server_cpu_us_per_call for w in rounds) for name, rounds in loaded.items()}
    lines = [
        f"{settings.rounds} rounds of {settings.duration_s:g} s per window (after {settings.warmup_s:g} s "
        "warm-up); latency and throughput are medians across rounds; a ratio is the median across rounds "
        "of the figure over `bare`'s in the same round; server CPU per call (all its threads) is the "
        "lowest round's",
        "",
        "| server | p50 (1 caller) | p99 (1 caller) | throughput (16 in flight) | p50 ratio | p99 ratio "
        "| throughput ratio | server CPU/call, 1 caller | server CPU/call, 16 in flight |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        one, loaded_stats = ones[name], many[name]
        lines.append(
            f"| {name} | {one.p50_ms:.3f} ms | {one.p99_ms:.3f} ms | {loaded_stats.throughput_per_s:.0f} /s "
            f"| {_round_ratio(single[name], single['bare'], 'p50_ms')} "
            f"| {_round_ratio(single[name], single['bare'], 'p99_ms')} "
            f"| {_round_ratio(loaded[name], loaded['bare'], 'throughput_per_s')} "
            f"| {cpu_one[name]:.0f} µs ({cpu_one[name] - cpu_one['bare']:+.0f}) "
            f"| {cpu_many[name]:.0f} µs ({cpu_many[name] - cpu_many['bare']:+.0f}) |"
        )
    lines.append("")
    for name in names:
        p50s = ", ".join(f"{w.stats.p50_ms:.3f}" for w in single[name])
        rates = ", ".join(f"{w.stats.throughput_per_s:.0f}" for w in loaded[name])
        cpus = ", ".join(
            f"{a.server_cpu_us_per_call:.0f}/{b.server_cpu_us_per_call:.0f}"
            for a, b in zip(single[name], loaded[name], strict=True)
        )
        lines.append(f"- {name}: p50 ms {p50s}; throughput /s {rates}; server CPU µs/call (1/16) {cpus}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser("serve", help="run one of the benchmarked servers")
    serve.add_argument("--config", choices=CONFIGS, required=True)
    serve.add_argument("--listen", required=True)
    parser.add_argument("--quick", action="store_true", help="short windows, 2 rounds")
    parser.add_argument("--rounds", type=int, help="override the number of rounds")
    parser.add_argument("--window", type=float, metavar="SECONDS", help="override the measured window")
    parser.add_argument(
        "--before", type=Path, metavar="DIR", help="also measure agentsidecar.sidecar_runtime from DIR"
    )
    args = parser.parse_args(argv)
    if args.command == "serve":
        asyncio.run(_serve(args.config, args.listen))
        return
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        settings = Settings.for_run(quick=args.quick, workdir=Path(tmp))
        settings = dataclasses.replace(
            settings,
            rounds=settings.rounds if args.rounds is None else args.rounds,
            duration_s=settings.duration_s if args.window is None else args.window,
        )
        print(asyncio.run(run(settings, args.before)))


if __name__ == "__main__":
    main()
