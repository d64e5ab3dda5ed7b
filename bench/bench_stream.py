"""First-delta latency of a streamed call: InvokeStream through the negotiator vs direct SSE.

Both sides read the same stream from the same mock (`bench/mock_sse_server.py`, which sends
its first content chunk at once and the rest a few ms later) and time the moment the first
content delta is in hand; the rest of the stream is drained before the next call.

* warm: closed loop, one caller, windows alternating direct / negotiator (`harness.compare`):
  p50 and p99 of each, their ratio, and the negotiator's added p50 (goal ≤ 1 ms);
* floor: the same stream through `floor_server.py --forward` (a bare gRPC-to-SSE forwarder, no
  negotiation), so the gap splits into what grpc.aio and httpx cost any Python service here and
  what the negotiator adds;
* cold: the first call of a fresh negotiator process (its HTTP client connects to the mock on
  that call) vs the first request of a fresh Python process doing the direct SSE request
  (`bench_stream.py --cold-direct URL`: the same first-time code paths), alternated, median of
  the repeats.

The direct side is httpx as an application calls it (`AsyncClient.stream`, no per-phase timeouts,
the same request body with `stream: true` and `stream_options.include_usage`, lines read with
`aiter_lines`), so the difference is what the negotiator and the adapter add over that; the
adapter itself sends through the client's transport (bench_litellm.py reuses these calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from bench.bench_negotiator import (
    API_KEY_ENV,
    MODEL,
    OPENAI,
    PROMPT,
    floor_server_argv,
    negotiator_argv,
    negotiator_env,
)
from bench.harness import BENCH_DIR, Settings, compare, open_channel, self_timed_window, start_server_process
from bench.report import Row, compared_overhead, info_row

GAP_MS = 5.0


def stream_config(base_url: str) -> str:
    config = {
        "adapters": [
            {
                "shortname": OPENAI,
                "implementation": "openai",
                "options": {"base_url": base_url, "api_key_env": API_KEY_ENV, "model": MODEL},
            }
        ]
    }
    return json.dumps(config, indent=2) + "\n"


def _is_content(line: str) -> bool:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return False
    choices = json.loads(line[6:]).get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


def direct_first_delta(
    client: httpx.AsyncClient, url: httpx.URL, *, model: str = MODEL, api_key: str = "bench-not-a-secret"
) -> Callable[[], Awaitable[float]]:
    """A streamed chat completion posted to `url`, timed to its first content line, drained."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {api_key}"}

    async def timed() -> float:
        started = time.perf_counter()
        first: float | None = None
        async with client.stream("POST", url, json=body, headers=headers) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if first is None and _is_content(line):
                    first = time.perf_counter() - started
        if first is None:
            raise RuntimeError("the mock streamed no content")
        return first

    return timed


def negotiator_first_delta(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, *, adapter: str = OPENAI
) -> Callable[[], Awaitable[float]]:
    """InvokeStream to `adapter`, timed to its first delta, read to its final message."""
    request = negotiator_pb2.InvokeRequest(adapter=adapter, prompt=PROMPT)

    async def timed() -> float:
        started = time.perf_counter()
        first: float | None = None
        final = ""
        async for message in stub.InvokeStream(negotiator_pb2.InvokeStreamRequest(invoke=request)):
            kind = message.WhichOneof("kind")
            if first is None and kind == "delta":
                first = time.perf_counter() - started
            elif kind == "final":
                final = message.final.text
        if first is None or final != "pong":
            raise RuntimeError(f"{adapter} streamed no delta or ended with {final!r}, not the mock's reply")
        return first

    return timed


def forwarder_first_delta(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
) -> Callable[[], Awaitable[float]]:
    """The floor: the same call to `floor_server.py --forward` (no negotiation at all)."""
    request = negotiator_pb2.InvokeRequest(prompt=PROMPT)

    async def timed() -> float:
        started = time.perf_counter()
        first: float | None = None
        async for message in stub.InvokeStream(negotiator_pb2.InvokeStreamRequest(invoke=request)):
            if first is None and message.WhichOneof("kind") == "delta":
                first = time.perf_counter() - started
        if first is None:
            raise RuntimeError("the forwarder streamed no delta")
        return first

    return timed


async def run(settings: Settings, rows: list[Row]) -> None:
    workdir = settings.workdir / "stream"
    workdir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        mock = await start_server_process(
            [sys.executable, str(BENCH_DIR / "mock_sse_server.py"), "--gap-ms", str(GAP_MS)],
            log_path=workdir / "mock-sse.log",
        )
        stack.push_async_callback(mock.stop)
        base_url = f"http://{mock.target}/v1"
        url = httpx.URL(f"{base_url}/chat/completions")
        config = workdir / "negotiator.yaml"
        config.write_text(stream_config(base_url))

        @contextlib.asynccontextmanager
        async def fresh_negotiator(
            name: str,
        ) -> AsyncIterator[negotiator_pb2_grpc.NegotiatorServiceAsyncStub]:
            server = await start_server_process(
                negotiator_argv(f"unix:{workdir / name}.sock", config),
                log_path=workdir / f"{name}.log",
                env=negotiator_env(),
            )
            try:
                channel = await open_channel(server.target)
                try:
                    yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)
                finally:
                    await channel.close(None)
            finally:
                await server.stop()

        # Cold: alternate a fresh httpx client's first request and a fresh negotiator's first call.
        cold_direct: list[float] = []
        cold_negotiator: list[float] = []
        for attempt in range(settings.startup_repeats):
            cold_direct.append(await _cold_direct(url))
            async with fresh_negotiator(f"cold{attempt}") as cold_stub:
                cold_negotiator.append(await negotiator_first_delta(cold_stub)())
        direct_ms = statistics.median(cold_direct) * 1000
        negotiator_ms = statistics.median(cold_negotiator) * 1000
        rows.append(
            info_row(
                f"stream: first delta, cold (first call of a fresh process), median of {len(cold_direct)}",
                f"{negotiator_ms:.3f} ms",
                f"{direct_ms:.3f} ms",
                f"{negotiator_ms / direct_ms:.2f}x, {negotiator_ms - direct_ms:+.3f} ms",
            )
        )

        stub = await stack.enter_async_context(fresh_negotiator("warm"))
        forwarder = await start_server_process(
            floor_server_argv(f"unix:{workdir / 'forwarder.sock'}", forward=str(url)),
            log_path=workdir / "forwarder.log",
        )
        stack.push_async_callback(forwarder.stop)
        forwarder_channel = await open_channel(forwarder.target)
        stack.push_async_callback(forwarder_channel.close, None)
        forwarder_stub = negotiator_pb2_grpc.NegotiatorServiceStub(forwarder_channel)
        async with httpx.AsyncClient(follow_redirects=False, timeout=None) as client:
            direct = direct_first_delta(client, url)
            via = negotiator_first_delta(stub)
            floor_via = forwarder_first_delta(forwarder_stub)
            await direct()
            await via()
            await floor_via()
            comparison = await compare(
                self_timed_window(direct, settings), self_timed_window(via, settings), rounds=settings.rounds
            )
            floor = await compare(
                self_timed_window(direct, settings),
                self_timed_window(floor_via, settings),
                rounds=settings.rounds,
            )
        rows.append(
            compared_overhead(
                "stream: first delta, warm, InvokeStream p50 minus direct SSE p50", comparison, "p50_ms", 1.0
            )
        )
        rows.append(
            info_row(
                "stream: first delta, warm, ratio p50 / p99",
                f"{comparison.subject.p50_ms:.3f} / {comparison.subject.p99_ms:.3f} ms",
                f"{comparison.baseline.p50_ms:.3f} / {comparison.baseline.p99_ms:.3f} ms",
                f"{comparison.subject.p50_ms / comparison.baseline.p50_ms:.2f}x / "
                f"{comparison.subject.p99_ms / comparison.baseline.p99_ms:.2f}x",
            )
        )
        floor_overhead = floor.subject.p50_ms - floor.baseline.p50_ms
        negotiator_overhead = comparison.subject.p50_ms - comparison.baseline.p50_ms
        rows.append(
            info_row(
                "floor: first delta through a bare gRPC-to-SSE forwarder, p50 minus direct SSE p50",
                f"{floor.subject.p50_ms:.3f} ms",
                f"{floor.baseline.p50_ms:.3f} ms",
                f"{floor_overhead:+.3f} ms",
            )
        )
        rows.append(
            info_row(
                "stream: the negotiator's own share (its overhead minus the bare forwarder's)",
                f"{negotiator_overhead:+.3f} ms",
                f"{floor_overhead:+.3f} ms",
                f"{negotiator_overhead - floor_overhead:+.3f} ms",
            )
        )


async def _cold_direct(url: httpx.URL) -> float:
    """The first direct SSE request of a fresh Python process, timed inside it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.bench_stream", "--cold-direct", str(url), stdout=asyncio.subprocess.PIPE
    )
    output, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the cold direct request exited with {process.returncode}")
    return float(output)


async def _one_direct(url: str) -> None:
    async with httpx.AsyncClient(follow_redirects=False, timeout=None) as client:
        print(await direct_first_delta(client, httpx.URL(url))())


if __name__ == "__main__" and sys.argv[1:2] == ["--cold-direct"]:
    asyncio.run(_one_direct(sys.argv[2]))
elif __name__ == "__main__":
    import tempfile

    from bench.report import render_table

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        bench_settings = Settings.for_run(quick="--quick" in sys.argv, workdir=Path(tmp))
        collected: list[Row] = []
        asyncio.run(run(bench_settings, collected))
        print(render_table(collected))
