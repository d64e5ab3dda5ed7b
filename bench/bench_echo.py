"""Harness sanity check: the echo server measured against a second echo server.

Two identical servers must come out at a ratio near 1.0; if they do not, the
machine is too noisy in this run for the other ratios to mean much.
"""

from __future__ import annotations

import asyncio
import contextlib

from bench.harness import (
    Settings,
    compare,
    echo_call,
    echo_server_argv,
    open_channel,
    start_server_process,
    window,
)
from bench.report import Row, compared_band

PAYLOAD = b"x" * 64


async def run(settings: Settings, rows: list[Row]) -> None:
    workdir = settings.workdir / "echo"
    workdir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        calls = []
        for label in ("a", "b"):
            server = await start_server_process(
                echo_server_argv(f"unix:{workdir / label}.sock"), log_path=workdir / f"{label}.log"
            )
            stack.push_async_callback(server.stop)
            channel = await open_channel(server.target)
            stack.push_async_callback(channel.close, None)
            calls.append(echo_call(channel, PAYLOAD))
        call_a, call_b = calls
        single = await compare(window(call_a, settings), window(call_b, settings), rounds=settings.rounds)
        loaded = await compare(
            window(call_a, settings, concurrency=16),
            window(call_b, settings, concurrency=16),
            rounds=settings.rounds,
        )
    rows += [
        compared_band("harness sanity: echo B vs echo A, p50 (1 caller)", single, "p50_ms", 0.8, 1.25),
        compared_band("harness sanity: echo B vs echo A, p99 (1 caller)", single, "p99_ms", 0.67, 1.5),
        compared_band(
            "harness sanity: echo B vs echo A, throughput (16 in flight)",
            loaded,
            "throughput_per_s",
            0.8,
            1.25,
        ),
    ]


if __name__ == "__main__":
    import sys
    import tempfile
    from pathlib import Path

    from bench.report import render_table

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        settings = Settings.for_run(quick="--quick" in sys.argv, workdir=Path(tmp))
        collected: list[Row] = []
        asyncio.run(run(settings, collected))
        print(render_table(collected))
