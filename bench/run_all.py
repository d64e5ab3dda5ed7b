"""Run every benchmark and write bench/results/latest.md.

    python -m bench.run_all            # full run, under ~10 minutes
    python -m bench.run_all --quick    # smoke run, about a minute, 100k seeds skipped

Performance goals are reported (met / NOT met), never enforced: the exit
status is non-zero only when a benchmark could not run at all.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from importlib import metadata
from pathlib import Path

from bench import (
    bench_cli,
    bench_echo,
    bench_litellm,
    bench_negotiator,
    bench_seedstore,
    bench_stream,
    bench_validators,
)
from bench.harness import BENCH_DIR, ServerStartError, Settings, compile_sources
from bench.report import Row, missing_row, render_table

RESULTS_FILE = BENCH_DIR / "results" / "latest.md"

# A benchmark appends each row as soon as it has it, so a failure half-way keeps the figures so far.
Benchmark = Callable[[Settings, list[Row]], Awaitable[None]]
BENCHMARKS: dict[str, Benchmark] = {
    "echo": bench_echo.run,
    "seedstore": bench_seedstore.run,
    # The `seedstore` CLI one process per command, against the bare interpreter (or $SKILLSPEC_BIN).
    "cli": bench_cli.run_suite,
    "negotiator": bench_negotiator.run,
    "stream": bench_stream.run,
    # LiteLLM proxy as a peer on the same mocks; a row says why when it is not installed.
    "litellm": bench_litellm.run,
    # The output-schema validator against its alternatives, in process, on the cold Produce's schemas.
    "validators": bench_validators.run,
}


async def run_benchmarks(names: list[str], settings: Settings) -> tuple[list[Row], list[str]]:
    """All rows, and the names of the benchmarks that failed (their rows say why)."""
    rows: list[Row] = []
    failed: list[str] = []
    for name in names:
        started = time.perf_counter()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        try:
            await BENCHMARKS[name](settings, rows)
        except Exception as err:  # one broken service must not hide the other figures
            traceback.print_exc()
            if isinstance(err, ServerStartError):
                print(f"--- end of the server's stderr ---\n{err.log_tail}\n---", file=sys.stderr)
            failed.append(name)
            reason = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            rows.append(missing_row(f"{name} (remaining figures)", "—", f"benchmark failed: {reason}"))
        print(f"[bench] {name} done in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return rows, failed


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def render_report(rows: list[Row], settings: Settings, command: str, elapsed_s: float) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    mode = "quick (smoke)" if settings.quick else "full"
    header = [
        "# Benchmark results",
        "",
        f"- Run: {now}, `{command}`, {mode}, {elapsed_s:.0f} s",
        f"- Machine: {os.cpu_count()} CPUs (shared by client and servers),"
        f" Python {platform.python_version()}, grpcio {_version('grpcio')}, {platform.platform()}",
        f"- Method: closed loop; each figure is the median of {settings.rounds} rounds of"
        f" {settings.duration_s:g} s (after {settings.warmup_s:g} s warm-up), subject and echo baseline"
        f" interleaved A B / B A; start-up is the median of {settings.startup_repeats} alternated starts."
        " All gRPC calls go over Unix sockets.",
        "- Ratios are subject / echo baseline measured in the same run;"
        ' "—" in the goal column marks a figure kept for context.',
        "",
        "",
    ]
    return "\n".join(header) + render_table(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the benchmark suite.")
    parser.add_argument("--quick", action="store_true", help="short windows, 100k seeds skipped (~1 min)")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(BENCHMARKS),
        help="run only this benchmark (repeatable); the results file is still written",
    )
    args = parser.parse_args()
    names = args.only or list(BENCHMARKS)
    command = " ".join(["python -m bench.run_all", *sys.argv[1:]])
    started = time.perf_counter()
    compile_sources()
    # Unix socket paths must stay short (sun_path), so work under the system temp dir.
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        settings = Settings.for_run(quick=args.quick, workdir=Path(tmp))
        rows, failed = asyncio.run(run_benchmarks(names, settings))
    report = render_report(rows, settings, command, time.perf_counter() - started)
    RESULTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_FILE.write_text(report)
    print(report)
    print(f"written to {RESULTS_FILE}", file=sys.stderr)
    if failed:
        print(f"benchmarks that failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
