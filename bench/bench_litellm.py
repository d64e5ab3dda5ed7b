"""LiteLLM proxy as a peer: the same chat completions direct, through the negotiator, through LiteLLM.

All three reach the same mocks in the same run: `bench/mock_chat_server.py` (unary) and
`bench/mock_sse_server.py` (streamed). LiteLLM proxy 1.80.0 runs on loopback with a config
whose two models point at them (`openai/...` with `api_base`), as an operator would deploy it
in front of a provider; the negotiator runs its openai adapter against the same two URLs.

* unary, 1 caller: p50 and p95 of a direct POST (with httpx and with aiohttp), of Invoke to
  the openai adapter, and of a POST to LiteLLM's /v1/chat/completions;
* unary, 16 in flight: calls/s of each;
* streamed: the first content delta of a direct SSE request (each client), of InvokeStream,
  and of LiteLLM's SSE (the rest of each stream drained before the next call);
* the ratios: the negotiator's overhead over direct (p50 minus direct p50) against LiteLLM's
  over the same direct p50 (goal ≤ 1/8), for the unary p50 and the first delta; the goal is
  held against the faster direct client, the other's ratio kept beside it.

Windows rotate the direct clients / negotiator / LiteLLM, the order reversed every other round,
and each figure is the median over rounds. LiteLLM is looked up at `$LITELLM_BIN`, then in
`.peers/litellm` (scripts/peers/python-servers.sh installs it there, in a venv of its own: its
uvicorn pin excludes the one the mcp SDK needs), then on PATH; when it is not there the rows say
so and nothing else is skipped. Never 1.107.0 (a compromised release): the script pins 1.80.0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
from yarl import URL

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from bench.bench_negotiator import API_KEY_ENV, MODEL, PROMPT, negotiator_argv, negotiator_env
from bench.bench_stream import direct_first_delta, direct_first_delta_aiohttp, negotiator_first_delta
from bench.harness import BENCH_DIR, Settings, open_channel, start_server_process
from bench.report import Row, info_row, missing_row, percentile

UNARY = "bench-openai"
STREAMED = "bench-openai-stream"
IN_FLIGHT = 16
OVERHEAD_GOAL = 1 / 8
MASTER_KEY = "sk-bench-litellm-master"
GAP_MS = 5.0
READY_TIMEOUT_S = 240.0
# Nothing may reach the network: the packaged cost map, no telemetry, no schema updates.
LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "NO_DOCS": "True",
    "DISABLE_SCHEMA_UPDATE": "True",
}
REPO = BENCH_DIR.parent

TimedCall = Callable[[], Awaitable[float]]


def litellm_binary() -> Path | None:
    """The `litellm` proxy command: $LITELLM_BIN, the peers' venv, else PATH; None when absent."""
    named = os.environ.get("LITELLM_BIN")
    candidates = [Path(named)] if named else []
    candidates.append(REPO / ".peers" / "litellm" / "bin" / "litellm")
    on_path = shutil.which("litellm")
    if on_path:
        candidates.append(Path(on_path))
    return next((path for path in candidates if path.is_file() and os.access(path, os.X_OK)), None)


def litellm_config(unary_base: str, streamed_base: str) -> str:
    """Two models in front of the mocks; JSON is YAML."""
    config = {
        "model_list": [
            {
                "model_name": UNARY,
                "litellm_params": {"model": f"openai/{MODEL}", "api_base": unary_base, "api_key": "sk-mock"},
            },
            {
                "model_name": STREAMED,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": streamed_base,
                    "api_key": "sk-mock",
                },
            },
        ],
        "general_settings": {"master_key": MASTER_KEY},
    }
    return json.dumps(config, indent=2) + "\n"


def negotiator_config(unary_base: str, streamed_base: str) -> str:
    adapters = [
        {
            "shortname": name,
            "implementation": "openai",
            "options": {"base_url": base, "api_key_env": API_KEY_ENV, "model": MODEL},
        }
        for name, base in ((UNARY, unary_base), (STREAMED, streamed_base))
    ]
    return json.dumps({"adapters": adapters}, indent=2) + "\n"


@dataclass(frozen=True, slots=True)
class Window:
    """One closed-loop window: p50/p95 in ms and calls per second."""

    p50_ms: float
    p95_ms: float
    per_s: float


async def _window(timed: TimedCall, *, concurrency: int, duration_s: float, warmup_s: float) -> Window:
    async def loop(seconds: float, into: list[float]) -> float:
        started = time.perf_counter()
        deadline = started + seconds

        async def caller() -> None:
            while time.perf_counter() < deadline:
                into.append(await timed())

        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(caller())
        return time.perf_counter() - started

    await loop(warmup_s, [])
    latencies: list[float] = []
    elapsed = await loop(duration_s, latencies)
    ordered = sorted(latencies)
    return Window(
        p50_ms=percentile(ordered, 0.50) * 1000,
        p95_ms=percentile(ordered, 0.95) * 1000,
        per_s=len(ordered) / elapsed,
    )


async def rotate(
    subjects: dict[str, TimedCall], settings: Settings, *, concurrency: int
) -> dict[str, list[Window]]:
    """Each subject's windows, round by round, in rotating order."""
    names = list(subjects)
    windows: dict[str, list[Window]] = {name: [] for name in names}
    for index in range(settings.rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            windows[name].append(
                await _window(
                    subjects[name],
                    concurrency=concurrency,
                    duration_s=settings.duration_s,
                    warmup_s=settings.warmup_s,
                )
            )
    return windows


def _median(windows: Sequence[Window], field: str) -> float:
    values: list[float] = [getattr(window, field) for window in windows]
    return statistics.median(values)


def _timed(call: Callable[[], Awaitable[object]]) -> TimedCall:
    async def timed() -> float:
        started = time.perf_counter()
        await call()
        return time.perf_counter() - started

    return timed


def unary_post(client: httpx.AsyncClient, url: httpx.URL, model: str, api_key: str) -> TimedCall:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"Authorization": f"Bearer {api_key}"}

    async def post() -> None:
        response = await client.post(url, json=body, headers=headers)
        response.raise_for_status()
        text = response.json()["choices"][0]["message"]["content"]
        if text != "pong":
            raise RuntimeError(f"{url} answered {text!r}, not the mock's reply")

    return _timed(post)


def unary_post_aiohttp(session: aiohttp.ClientSession, url: URL, model: str, api_key: str) -> TimedCall:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"Authorization": f"Bearer {api_key}"}

    async def post() -> None:
        async with session.post(url, json=body, headers=headers, allow_redirects=False) as response:
            response.raise_for_status()
            text = (await response.json())["choices"][0]["message"]["content"]
        if text != "pong":
            raise RuntimeError(f"{url} answered {text!r}, not the mock's reply")

    return _timed(post)


def negotiator_invoke(stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub) -> TimedCall:
    request = negotiator_pb2.InvokeRequest(adapter=UNARY, prompt=PROMPT)

    async def invoke() -> None:
        reply = await stub.Invoke(request)
        if reply.text != "pong":
            raise RuntimeError(f"{UNARY} returned {reply.text!r}, not the mock's reply")

    return _timed(invoke)


def overhead_ratio_row(
    benchmark: str, direct: float, negotiator: float, litellm: float, *, goal: bool = True
) -> Row:
    """The negotiator's added ms over direct against LiteLLM's over the same direct; `goal`: held to ≤ 1/8."""
    ours = negotiator - direct
    theirs = litellm - direct
    ratio = ours / theirs if theirs > 0 else float("inf")
    return Row(
        benchmark=benchmark,
        subject=f"negotiator {ours:+.3f} ms",
        baseline=f"LiteLLM {theirs:+.3f} ms",
        relation=f"{ratio:.3f}" + (f" (1/{1 / ratio:.0f})" if ratio > 0 else ""),
        goal="≤ 1/8" if goal else "—",
        met=ratio <= OVERHEAD_GOAL if goal else None,
    )


def _last_line(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else "(no output)"


@contextlib.asynccontextmanager
async def running_litellm(binary: Path, config: Path, log: Path) -> AsyncIterator[str]:
    """LiteLLM proxy on a free loopback port; yields its origin once /health/liveliness answers 200."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    origin = f"http://127.0.0.1:{port}"
    argv = [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=asyncio.subprocess.STDOUT,
            cwd=config.parent,
            env={**os.environ, **LITELLM_ENV},
            start_new_session=True,
        )
    try:
        started = time.monotonic()
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"litellm exited with {process.returncode}: {_last_line(log)}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{origin}/health/liveliness")).status_code == 200:
                        break
                if time.monotonic() - started > READY_TIMEOUT_S:
                    raise RuntimeError(f"litellm did not answer within {READY_TIMEOUT_S:g} s")
                await asyncio.sleep(0.25)
        print(f"LiteLLM proxy answered after {time.monotonic() - started:.1f} s", file=sys.stderr)
        yield origin
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()


async def run(settings: Settings, rows: list[Row]) -> None:
    binary = litellm_binary()
    if binary is None:
        reason = "LiteLLM proxy is not installed (run scripts/peers/python-servers.sh, or set LITELLM_BIN)"
        print(f"bench_litellm: skipped: {reason}", file=sys.stderr)
        rows.append(missing_row("litellm peer: negotiator overhead vs LiteLLM proxy's", "≤ 1/8", reason))
        return
    workdir = settings.workdir / "litellm"
    workdir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        chat = await start_server_process(
            [sys.executable, str(BENCH_DIR / "mock_chat_server.py")], log_path=workdir / "mock-chat.log"
        )
        stack.push_async_callback(chat.stop)
        sse = await start_server_process(
            [sys.executable, str(BENCH_DIR / "mock_sse_server.py"), "--gap-ms", str(GAP_MS)],
            log_path=workdir / "mock-sse.log",
        )
        stack.push_async_callback(sse.stop)
        unary_base = f"http://{chat.target}/v1"
        streamed_base = f"http://{sse.target}/v1"

        litellm_yaml = workdir / "litellm.yaml"
        litellm_yaml.write_text(litellm_config(unary_base, streamed_base))
        origin = await stack.enter_async_context(
            running_litellm(binary, litellm_yaml, workdir / "litellm.log")
        )
        negotiator_yaml = workdir / "negotiator.yaml"
        negotiator_yaml.write_text(negotiator_config(unary_base, streamed_base))
        negotiator = await start_server_process(
            negotiator_argv(f"unix:{workdir / 'negotiator.sock'}", negotiator_yaml),
            log_path=workdir / "negotiator.log",
            env=negotiator_env(),
        )
        stack.push_async_callback(negotiator.stop)
        channel = await open_channel(negotiator.target)
        stack.push_async_callback(channel.close, None)
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        client = await stack.enter_async_context(httpx.AsyncClient(follow_redirects=False, timeout=None))
        session = await stack.enter_async_context(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout()))
        # A LiteLLM connection pool of its own: 16 in flight must not queue behind the mock's.
        peer_client = await stack.enter_async_context(
            httpx.AsyncClient(
                follow_redirects=False, timeout=None, limits=httpx.Limits(max_connections=IN_FLIGHT * 2)
            )
        )

        unary = {
            "direct httpx": unary_post(client, httpx.URL(f"{unary_base}/chat/completions"), MODEL, "bench"),
            "direct aiohttp": unary_post_aiohttp(
                session, URL(f"{unary_base}/chat/completions"), MODEL, "bench"
            ),
            "negotiator": negotiator_invoke(stub),
            "LiteLLM": unary_post(peer_client, httpx.URL(f"{origin}/v1/chat/completions"), UNARY, MASTER_KEY),
        }
        streamed = {
            "direct httpx": direct_first_delta(client, httpx.URL(f"{streamed_base}/chat/completions")),
            "direct aiohttp": direct_first_delta_aiohttp(session, URL(f"{streamed_base}/chat/completions")),
            "negotiator": negotiator_first_delta(stub, adapter=STREAMED),
            "LiteLLM": direct_first_delta(
                peer_client, httpx.URL(f"{origin}/v1/chat/completions"), model=STREAMED, api_key=MASTER_KEY
            ),
        }
        for call in (*unary.values(), *streamed.values()):
            await call()  # each path works (and its connections exist) before anything is timed

        one = await rotate(unary, settings, concurrency=1)
        many = await rotate(unary, settings, concurrency=IN_FLIGHT)
        first = await rotate(streamed, settings, concurrency=1)

    p50 = {name: _median(windows, "p50_ms") for name, windows in one.items()}
    p95 = {name: _median(windows, "p95_ms") for name, windows in one.items()}
    per_s = {name: _median(windows, "per_s") for name, windows in many.items()}
    delta50 = {name: _median(windows, "p50_ms") for name, windows in first.items()}
    delta95 = {name: _median(windows, "p95_ms") for name, windows in first.items()}
    unary_direct = _directs_fastest_first(p50)
    stream_direct = _directs_fastest_first(delta50)
    for name in ("negotiator", "LiteLLM"):
        for direct in unary_direct:
            rows.append(
                info_row(
                    f"litellm peer: unary p50 / p95, 1 caller, {name} vs {direct} POST",
                    f"{p50[name]:.3f} / {p95[name]:.3f} ms",
                    f"{p50[direct]:.3f} / {p95[direct]:.3f} ms",
                    f"{p50[name] - p50[direct]:+.3f} / {p95[name] - p95[direct]:+.3f} ms",
                )
            )
    for index, direct in enumerate(unary_direct):
        rows.append(
            overhead_ratio_row(
                f"litellm peer: unary p50 overhead over {direct}"
                + (" (the faster direct client)" if index == 0 else ""),
                p50[direct],
                p50["negotiator"],
                p50["LiteLLM"],
                goal=index == 0,
            )
        )
    directs = ", ".join(f"{direct} {per_s[direct]:.0f}" for direct in unary_direct)
    rows.append(
        info_row(
            f"litellm peer: unary at {IN_FLIGHT} in flight, negotiator vs LiteLLM (direct)",
            f"{per_s['negotiator']:.0f} calls/s",
            f"{per_s['LiteLLM']:.0f} calls/s ({directs})",
            f"{per_s['negotiator'] / per_s['LiteLLM']:.1f}×",
        )
    )
    for name in ("negotiator", "LiteLLM"):
        for direct in stream_direct:
            rows.append(
                info_row(
                    f"litellm peer: first delta p50 / p95, {name} vs {direct} SSE",
                    f"{delta50[name]:.3f} / {delta95[name]:.3f} ms",
                    f"{delta50[direct]:.3f} / {delta95[direct]:.3f} ms",
                    f"{delta50[name] - delta50[direct]:+.3f} / {delta95[name] - delta95[direct]:+.3f} ms",
                )
            )
    for index, direct in enumerate(stream_direct):
        rows.append(
            overhead_ratio_row(
                f"litellm peer: first delta p50 overhead over {direct} SSE"
                + (" (the faster direct client)" if index == 0 else ""),
                delta50[direct],
                delta50["negotiator"],
                delta50["LiteLLM"],
                goal=index == 0,
            )
        )


def _directs_fastest_first(p50: dict[str, float]) -> list[str]:
    """The direct subjects, the one with the lower p50 (the strict baseline) first."""
    return sorted((name for name in p50 if name.startswith("direct ")), key=lambda name: p50[name])


if __name__ == "__main__":
    import tempfile

    from bench.report import render_table

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        bench_settings = Settings.for_run(quick="--quick" in sys.argv, workdir=Path(tmp))
        collected: list[Row] = []
        asyncio.run(run(bench_settings, collected))
        print(render_table(collected))
