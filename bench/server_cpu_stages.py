"""The server's CPU per Invoke, stage by stage: where the negotiator's cost over the floor lies.

    python -m bench.server_cpu_stages [--calls N] [--rounds R] [--output PATH]

bench_negotiator's CPU rows say how much more CPU the negotiator's server spends
per Invoke than the floor's (floor_server.py: protobuf in and out); a loop in
one process (profile_negotiator) says the pieces of the call path cost several
times less than that difference, because between two calls in a server gRPC's
core and the event loop run too and the call path's code and data are no
longer in the CPU's caches. This tool measures the pieces where they cost what
they cost: in the server, between real calls.

It starts the floor, then `negotiator serve` with the bench config (call log to
a file, as bench_negotiator runs it) once per stage below, each with its
servicer's Invoke cut short after that stage and answering as the floor does
(patched in at start-up through `python -c`, so everything else, the server,
its options, its interceptor and call log, its start-up heap, is the real
one's), and the real negotiator last:

1. the floor's answer inside the negotiator's server: what its server costs;
2. + the request converted (CallCaches.invoke_request);
3. + the broker's call (judgement, audit record, the scripted adapter);
4. + the response built (CallCaches.invoke_response);
5. the real Invoke: + the servicer's plumbing (the reply's size check,
   delegation depth, time budget, caller).

A profiling aid, not one of run_all's benchmarks. One caller sends the
bench's Invoke to each server in turn, rounds alternating the order; per
round, user + system CPU of the whole process and of its main thread (the
event loop, where the servicer runs) over N calls, from /proc; each figure is
the median of the rounds, with what the stage adds to the one before. Stages
1-4 name the servicer's attributes (`_calls`, `_broker`): a
renamed one fails that stage's calls, and the tool stops saying which.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from bench.bench_negotiator import bench_config, floor_server_argv, scripted_invoke_request
from bench.harness import ServerProcess, compile_sources, cpu_seconds, start_server_process

# Each stage's Invoke, defined in the server before it starts: `answer` ends every stage as the
# floor answers (the prompt back, no decision).
_PREAMBLE = """
from agentsidecar.negotiator.v1 import negotiator_pb2
from agentsidecar.negotiator_service import servicer as _servicer

def answer(request):
    return negotiator_pb2.InvokeResponse(text=request.prompt)
"""
STAGES: tuple[tuple[str, str | None], ...] = (
    (
        "the floor's answer in the negotiator's server",
        """
async def Invoke(self, request, context):
    return answer(request)
""",
    ),
    (
        "+ the request converted",
        """
async def Invoke(self, request, context):
    _servicer.with_conversation_id(self._calls.invoke_request(request))
    return answer(request)
""",
    ),
    (
        "+ the broker's call",
        """
async def Invoke(self, request, context):
    call = _servicer.with_conversation_id(self._calls.invoke_request(request))
    await self._broker.call(call, time_budget=None)
    return answer(request)
""",
    ),
    (
        "+ the response built",
        """
async def Invoke(self, request, context):
    call = _servicer.with_conversation_id(self._calls.invoke_request(request))
    reply, decision = await self._broker.call(call, time_budget=None)
    return self._calls.invoke_response(reply, decision)
""",
    ),
    ("the negotiator's Invoke (+ the servicer's plumbing)", None),
)


def negotiator_stage_argv(listen: str, config: Path, stage: str | None) -> list[str]:
    """`negotiator serve` in this interpreter, its servicer's Invoke replaced by `stage` (None: kept)."""
    patch = "" if stage is None else _PREAMBLE + stage + "_servicer.NegotiatorServicer.Invoke = Invoke\n"
    serve = ["serve", "--listen", listen, "--config", str(config)]
    code = f"{patch}\nimport sys\nfrom agentsidecar.negotiator_service.cli import main\n"
    code += f"sys.exit(main({serve!r}))\n"
    return [sys.executable, "-c", code]


async def measure(calls: int, rounds: int) -> list[tuple[str, float, float]]:
    """(what, whole-process µs per call, main-thread µs per call) for the floor and each stage."""
    with tempfile.TemporaryDirectory(prefix="cpu-stages-") as tmp:
        workdir = Path(tmp)
        config = workdir / "negotiator.yaml"
        config.write_text(bench_config("http://127.0.0.1:9/v1"))
        subjects: list[tuple[str, list[str]]] = [
            ("the floor (floor_server.py)", floor_server_argv(f"unix:{workdir / 'floor.sock'}"))
        ]
        for index, (label, stage) in enumerate(STAGES):
            listen = f"unix:{workdir / f'stage{index}.sock'}"
            subjects.append((f"{index + 1}. {label}", negotiator_stage_argv(listen, config, stage)))
        async with contextlib.AsyncExitStack() as stack:
            servers: list[ServerProcess] = []
            for index, (_label, argv) in enumerate(subjects):
                server = await start_server_process(argv, log_path=workdir / f"server{index}.log")
                stack.push_async_callback(server.stop)
                servers.append(server)
            request = scripted_invoke_request()
            invokes = []
            for server in servers:
                channel = await stack.enter_async_context(grpc.aio.insecure_channel(server.target))
                invokes.append(negotiator_pb2_grpc.NegotiatorServiceStub(channel).Invoke)
            measured: list[list[tuple[float, float]]] = [[] for _ in servers]
            for round_index in range(rounds):
                order = list(range(len(servers)))
                if round_index % 2:
                    order.reverse()
                for index in order:
                    pid, invoke = servers[index].pid, invokes[index]
                    try:
                        for _ in range(max(calls // 20, 50)):  # warm-up
                            await invoke(request)
                        before = cpu_seconds(pid), cpu_seconds(pid, pid)
                        for _ in range(calls):
                            await invoke(request)
                        after = cpu_seconds(pid), cpu_seconds(pid, pid)
                    except grpc.aio.AioRpcError as error:
                        failed = f"{subjects[index][0]}: {error.code().name} {error.details()}"
                        raise SystemExit(failed) from None
                    measured[index].append(
                        ((after[0] - before[0]) / calls * 1e6, (after[1] - before[1]) / calls * 1e6)
                    )
    return [
        (label, statistics.median(p for p, _ in figures), statistics.median(m for _, m in figures))
        for (label, _argv), figures in zip(subjects, measured, strict=True)
    ]


def report(rows: list[tuple[str, float, float]], calls: int, rounds: int) -> str:
    lines = [
        "# The server's CPU per Invoke, stage by stage",
        "",
        f"- Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"`python -m bench.server_cpu_stages --calls {calls} --rounds {rounds}`",
        "- One caller, the bench's Invoke to bench-scripted; user + system CPU from /proc "
        "(clock ticks), median of the rounds; stages 1-4 answer as the floor does.",
        "",
        "| server | whole process µs/call | main thread µs/call | main thread, + over the line before |",
        "|---|---|---|---|",
    ]
    previous: float | None = None
    for label, process_us, main_us in rows:
        added = "—" if previous is None else f"{main_us - previous:+.0f}"
        lines.append(f"| {label} | {process_us:.0f} | {main_us:.0f} | {added} |")
        previous = main_us
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=2000, help="calls per server per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--output", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    compile_sources()
    text = report(asyncio.run(measure(args.calls, args.rounds)), args.calls, args.rounds)
    print(text, end="")
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
