"""Instructions per call in the server process, counted by valgrind: a figure the machine's noise cannot move.

    python -m bench.count_instructions [--calls N] [--schemas] [--cold-options]

Wall-clock figures on this shared two-core machine drift by tens of percent
from one minute to the next; an instruction count for the same binary,
inputs and environment does not (callgrind gives the same total twice, with
the other core loaded or not). It is not time: Python's cache misses are not
in it, and under load they make every instruction dearer. But it says
exactly how much work a change added or removed, which the ratios against
the echo baseline can only say within their noise.

For each server (the echo baseline, the Invoke floor of floor_server.py,
then the negotiator with the bench config of bench_negotiator.py, started as
`negotiator serve` does, call log on stderr), the server runs under `valgrind --tool=callgrind` with
instrumentation off; a client process makes N calls to warm it up, then
instrumentation is switched on (`callgrind_control -i on`), the client makes
N more calls, and it is switched off again. The figure is the server
process's instructions (all its threads) over those N calls, per call.
Valgrind runs the server some 50 times slower, so work done per unit of time
rather than per call (the call log's writer, which wakes once per 50 ms
batch, a batch of a few calls here against hundreds in a real run; grpc's
timers) weighs a little more here than in a real run.

Needs valgrind (Debian package `valgrind`). Takes about a minute.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent

# The client, run as `python -c CLIENT TARGET N METHOD`: N sequential calls, one caller.
# Produce sends bench_negotiator's 20-property schema: the same one every call
# (warm), or one of this client's own each call (cold, as the bench's cold rows).
# The plain cold methods send new call options each call (another `seed` value,
# one of this client's own), as the bench's "cold (new options each call)" rows.
CLIENT = """
import asyncio, os, sys
import grpc
from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from bench.bench_negotiator import produce_request, scripted_invoke_request

async def main(target, calls, method):
    async with grpc.aio.insecure_channel(target) as channel:
        await asyncio.wait_for(channel.channel_ready(), 120)
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        invoke = scripted_invoke_request()
        negotiate = negotiator_pb2.NegotiateRequest(invoke=invoke)
        echo = channel.unary_unary("/bench.Echo/Echo")
        raw = invoke.SerializeToString()
        warm = produce_request("warm")
        prefix = os.urandom(4).hex()
        seeds = int.from_bytes(os.urandom(4), "big") * 1000
        for index in range(calls):
            if method == "Echo":
                await echo(raw, timeout=60)
            elif method == "Invoke":
                await stub.Invoke(invoke, timeout=60)
            elif method == "Produce":
                await stub.Produce(warm, timeout=60)
            elif method == "ProduceCold":
                await stub.Produce(produce_request(f"{prefix}{index}"), timeout=60)
            elif method == "InvokeCold":
                await stub.Invoke(scripted_invoke_request(seeds + index), timeout=60)
            elif method == "NegotiatePlainCold":
                plain = negotiator_pb2.NegotiateRequest(invoke=scripted_invoke_request(seeds + index))
                await stub.Negotiate(plain, timeout=60)
            elif method == "NegotiateCold":
                cold = negotiator_pb2.NegotiateRequest(produce=produce_request(f"{prefix}{index}"))
                await stub.Negotiate(cold, timeout=60)
            else:
                await stub.Negotiate(negotiate, timeout=60)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
"""


@dataclass(frozen=True, slots=True)
class Count:
    subject: str
    method: str
    instructions_per_call: int


def total_instructions(profile: Path) -> int:
    """The PROGRAM TOTALS of a callgrind profile (callgrind_annotate's count)."""
    annotated = subprocess.run(
        ["callgrind_annotate", str(profile)], capture_output=True, text=True, check=True
    ).stdout
    for line in annotated.splitlines():
        if "PROGRAM TOTALS" in line:
            return int(line.split()[0].replace(",", ""))
    raise RuntimeError(f"no PROGRAM TOTALS in callgrind_annotate {profile}")


def _client(target: str, calls: int, method: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(
        [sys.executable, "-c", CLIENT, target, str(calls), method], check=True, env=env, cwd=ROOT, timeout=900
    )


def _control(pid: int, *command: str) -> None:
    subprocess.run(["callgrind_control", *command, str(pid)], capture_output=True, check=True)


def count(subject: str, server_argv: list[str], methods: list[str], calls: int, workdir: Path) -> list[Count]:
    """Start `server_argv` (plus `--listen unix:…`) under callgrind; count `calls` calls of each method."""
    socket = workdir / f"{subject}.sock"
    profile = workdir / f"{subject}.callgrind"
    stdout = (workdir / f"{subject}.out").open("w")
    stderr = (workdir / f"{subject}.err").open("w")
    env = dict(os.environ, BENCH_OPENAI_API_KEY="bench-not-a-secret", PYTHONPATH=str(ROOT))
    process = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={profile}",
            "--instr-atstart=no",
            *server_argv,
            "--listen",
            f"unix:{socket}",
        ],
        stdout=stdout,
        stderr=stderr,
        env=env,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 300
        while "READY" not in (workdir / f"{subject}.out").read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{subject} did not start: {(workdir / f'{subject}.err').read_text()[-2000:]}"
                )
            time.sleep(0.2)
        results = []
        for method in methods:
            _client(f"unix:{socket}", calls, method)  # warm-up, not counted
            subprocess.run(["callgrind_control", "--zero", str(process.pid)], capture_output=True, check=True)
            subprocess.run(
                ["callgrind_control", "-i", "on", str(process.pid)], capture_output=True, check=True
            )
            _client(f"unix:{socket}", calls, method)
            subprocess.run(
                ["callgrind_control", "-i", "off", str(process.pid)], capture_output=True, check=True
            )
            subprocess.run(["callgrind_control", "--dump", str(process.pid)], capture_output=True, check=True)
            dumps = sorted(workdir.glob(f"{subject}.callgrind.*"), key=lambda p: p.stat().st_mtime)
            results.append(Count(subject, method, total_instructions(dumps[-1]) // calls))
        return results
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        stdout.close()
        stderr.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--calls", type=int, default=300, help="calls counted per method (and as many to warm up)"
    )
    parser.add_argument(
        "--schemas",
        action="store_true",
        help="also Produce with the 20-property schema, warm and cold, and Negotiate with it cold",
    )
    parser.add_argument(
        "--cold-options",
        action="store_true",
        help="also Negotiate and Invoke without a schema with new call options each call",
    )
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (Debian package valgrind)")
    from bench.bench_negotiator import bench_config  # ROOT is on sys.path only now

    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        workdir = Path(tmp)
        config = workdir / "negotiator.yaml"
        config.write_text(bench_config("http://127.0.0.1:9/v1"))  # the openai adapter is not called here
        echo = count(
            "echo", [sys.executable, str(BENCH_DIR / "echo_server.py")], ["Echo"], args.calls, workdir
        )
        floor = count(
            "floor",
            [sys.executable, str(BENCH_DIR / "floor_server.py")],
            ["Invoke"],
            args.calls,
            workdir,
        )
        negotiator_argv = [str(Path(sys.executable).parent / "negotiator"), "serve", "--config", str(config)]
        methods = ["Negotiate", "Invoke"]
        if args.cold_options:
            methods += ["NegotiatePlainCold", "InvokeCold"]
        if args.schemas:
            methods += ["NegotiateCold", "Produce", "ProduceCold"]
        negotiator = count("negotiator", negotiator_argv, methods, args.calls, workdir)
    baseline = echo[0].instructions_per_call
    print(f"server instructions per call, {args.calls} calls each (callgrind):")
    print("| server | method | instructions/call | vs echo |")
    print("|---|---|---|---|")
    for result in (*echo, *floor, *negotiator):
        ratio = result.instructions_per_call / baseline
        print(f"| {result.subject} | {result.method} | {result.instructions_per_call:,} | {ratio:.2f}× |")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
