"""First-delta latency of a streamed call: InvokeStream through the negotiator vs direct SSE.

Both sides read the same stream from the same mock (`bench/mock_sse_server.py`, which sends
its first content chunk at once and the rest a few ms later) and time the moment the first
content delta is in hand; the rest of the stream is drained before the next call.

* warm: closed loop, one caller, windows alternating direct / negotiator (`harness.compare`):
  p50 and p99 of each, their ratio, and the negotiator's added p50 (goal ≤ 1 ms, held against
  the faster of the two direct clients);
* floor: the same stream through `floor_server.py --forward` (a bare gRPC-to-SSE forwarder on
  aiohttp, no negotiation), so the gap splits into what grpc.aio and the HTTP client cost any
  Python service here and what the negotiator adds;
* cold: the first call of a fresh negotiator process (its HTTP client connects to the mock on
  that call) vs the first request of a fresh Python process doing the direct SSE request
  (`bench_stream.py --cold-direct URL [httpx|aiohttp]`: the same first-time code paths),
  alternated, median of the repeats.

The direct side is made twice, each client as an application calls it, with the same request
body (`stream: true`, `stream_options.include_usage`): httpx (`AsyncClient.stream`, no per-phase
timeouts, lines read with `aiter_lines`) and aiohttp (one `ClientSession` without timeouts, the
lines of `response.content`), the HTTP client the adapter itself uses. The difference to the
faster one is what the negotiator and the adapter add (bench_litellm.py reuses these calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx
from yarl import URL

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from bench.bench_negotiator import (
    API_KEY_ENV,
    MODEL,
    OPENAI,
    PROMPT,
    cold_rows,
    floor_server_argv,
    fresh_negotiator,
)
from bench.harness import (
    BENCH_DIR,
    Settings,
    compare,
    open_channel,
    self_timed_window,
    start_server_process,
)
from bench.report import Comparison, Row, compared_overhead, info_row, with_rounds

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


def _stream_request(model: str) -> dict[str, object]:
    """The streamed chat completion both direct baselines post."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def direct_first_delta(
    client: httpx.AsyncClient, url: httpx.URL, *, model: str = MODEL, api_key: str = "bench-not-a-secret"
) -> Callable[[], Awaitable[float]]:
    """A streamed chat completion posted to `url`, timed to its first content line, drained."""
    body = _stream_request(model)
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


def direct_first_delta_aiohttp(
    session: aiohttp.ClientSession, url: URL, *, model: str = MODEL, api_key: str = "bench-not-a-secret"
) -> Callable[[], Awaitable[float]]:
    """The same streamed chat completion with aiohttp, timed to its first content line, drained."""
    body = _stream_request(model)
    headers = {"Authorization": f"Bearer {api_key}"}

    async def timed() -> float:
        started = time.perf_counter()
        first: float | None = None
        async with session.post(url, json=body, headers=headers, allow_redirects=False) as response:
            response.raise_for_status()
            async for raw in response.content:
                if first is None and _is_content(raw.decode().rstrip("\r\n")):
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

        rows += await cold_rows(
            settings,
            workdir,
            config,
            ("bench.bench_stream", str(url)),
            lambda cold_stub: negotiator_first_delta(cold_stub)(),
            lambda client, repeats: (
                f"stream: first delta, cold (first call of a fresh process) vs direct {client} SSE, "
                f"median of {repeats}"
            ),
        )

        stub = await stack.enter_async_context(fresh_negotiator(workdir, config, "warm"))
        forwarder = await start_server_process(
            floor_server_argv(f"unix:{workdir / 'forwarder.sock'}", forward=str(url)),
            log_path=workdir / "forwarder.log",
        )
        stack.push_async_callback(forwarder.stop)
        forwarder_channel = await open_channel(forwarder.target)
        stack.push_async_callback(forwarder_channel.close, None)
        forwarder_stub = negotiator_pb2_grpc.NegotiatorServiceStub(forwarder_channel)
        async with (
            httpx.AsyncClient(follow_redirects=False, timeout=None) as client,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout()) as session,
        ):
            directs = {
                "httpx": direct_first_delta(client, url),
                "aiohttp": direct_first_delta_aiohttp(session, URL(str(url))),
            }
            via = negotiator_first_delta(stub)
            floor_via = forwarder_first_delta(forwarder_stub)
            await via()
            await floor_via()
            through: dict[str, Comparison] = {}
            floors: dict[str, Comparison] = {}
            for client_name, direct in directs.items():
                await direct()
                through[client_name] = await compare(
                    self_timed_window(direct, settings),
                    self_timed_window(via, settings),
                    rounds=settings.rounds,
                )
                floors[client_name] = await compare(
                    self_timed_window(direct, settings),
                    self_timed_window(floor_via, settings),
                    rounds=settings.rounds,
                )
        strict = min(through, key=lambda name: through[name].baseline.p50_ms)
        for client_name in (strict, *(other for other in through if other != strict)):
            rows += _warm_rows(
                client_name, through[client_name], floors[client_name], strict=client_name == strict
            )


def _warm_rows(client_name: str, comparison: Comparison, floor: Comparison, *, strict: bool) -> list[Row]:
    """The warm rows against one direct client; `strict`: the faster one, which holds the goal."""
    what = f"direct {client_name} SSE"
    overhead = f"stream: first delta, warm, InvokeStream p50 minus {what} p50"
    floor_overhead = floor.subject.p50_ms - floor.baseline.p50_ms
    negotiator_overhead = comparison.subject.p50_ms - comparison.baseline.p50_ms
    return [
        compared_overhead(f"{overhead} (the faster direct client)", comparison, "p50_ms", 1.0)
        if strict
        else with_rounds(
            info_row(
                overhead,
                f"{comparison.subject.p50_ms:.3f} ms",
                f"{comparison.baseline.p50_ms:.3f} ms",
                f"{negotiator_overhead:+.3f} ms",
            ),
            comparison,
            "p50_ms",
        ),
        info_row(
            f"stream: first delta, warm, ratio p50 / p99 vs {what}",
            f"{comparison.subject.p50_ms:.3f} / {comparison.subject.p99_ms:.3f} ms",
            f"{comparison.baseline.p50_ms:.3f} / {comparison.baseline.p99_ms:.3f} ms",
            f"{comparison.subject.p50_ms / comparison.baseline.p50_ms:.2f}x / "
            f"{comparison.subject.p99_ms / comparison.baseline.p99_ms:.2f}x",
        ),
        info_row(
            f"floor: first delta through a bare gRPC-to-SSE forwarder (aiohttp), p50 minus {what} p50",
            f"{floor.subject.p50_ms:.3f} ms",
            f"{floor.baseline.p50_ms:.3f} ms",
            f"{floor_overhead:+.3f} ms",
        ),
        info_row(
            f"stream: the negotiator's own share (its overhead minus the forwarder's), vs {what}",
            f"{negotiator_overhead:+.3f} ms",
            f"{floor_overhead:+.3f} ms",
            f"{negotiator_overhead - floor_overhead:+.3f} ms",
        ),
    ]


async def _one_direct(url: str, client_name: str) -> None:
    if client_name == "aiohttp":
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout()) as session:
            print(await direct_first_delta_aiohttp(session, URL(url))())
        return
    async with httpx.AsyncClient(follow_redirects=False, timeout=None) as client:
        print(await direct_first_delta(client, httpx.URL(url))())


if __name__ == "__main__" and sys.argv[1:2] == ["--cold-direct"]:
    asyncio.run(_one_direct(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "httpx"))
elif __name__ == "__main__":
    import tempfile

    from bench.report import render_table

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        bench_settings = Settings.for_run(quick="--quick" in sys.argv, workdir=Path(tmp))
        collected: list[Row] = []
        asyncio.run(run(bench_settings, collected))
        print(render_table(collected))
