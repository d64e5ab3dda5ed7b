"""Negotiator benchmarks, each against the echo baseline over a Unix socket.

* Negotiate (a dry run: declaration checks only) p50 vs echo p50;
* Invoke through a scripted adapter (no adapter work: echoes the prompt),
  one caller, p50/p99 vs echo p50/p99, and 16 calls in flight, throughput vs
  echo at 16;
* the openai path: Invoke through the negotiator to the openai adapter,
  which posts to a local mock chat-completions server, minus the same POST
  made directly from the bench (p50 difference), with httpx and with
  aiohttp; the goal is held against the faster of the two;
* Negotiate-with-schema and Produce (scripted adapter) with a 20-property
  output schema, warm (the same schema every call) and cold (a new schema
  every call, so nothing derived from the schema can be reused), each
  against the echo of a request of the same size;
* with `BENCH_NEGOTIATOR_BEFORE=<source tree>` (another checkout's root,
  e.g. `git archive <commit> | tar -x -C <dir>`; its build hook lays it out
  and generates its gRPC modules first), the same calls against a second
  negotiator run from that tree, paired in the same run: what a change to
  the call path costs or saves;
* start-up (spawn → READY, spawn → health SERVING) vs the bare echo server,
  and idle RSS after start-up;
* for context, the floors under those figures (bench/floor_server.py): the
  Invoke method with no negotiation (protobuf in and out) against the echo
  at 1 and 16 in flight, and a bare gRPC-to-HTTP forwarder (aiohttp, as the
  adapter) against the direct POSTs. What the negotiator adds is its
  distance from these floors.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc
import httpx
from google.protobuf import struct_pb2
from yarl import URL

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from bench.harness import (
    BENCH_DIR,
    Settings,
    cold_direct_seconds,
    compare,
    compare_startup,
    cpu_seconds,
    echo_call,
    echo_server_argv,
    open_channel,
    rss_mib,
    start_server_process,
    window,
)
from bench.report import (
    Comparison,
    Row,
    absolute_row,
    compared_overhead,
    compared_ratio,
    compared_throughput,
    info_row,
    missing_row,
    startup_rows,
    with_rounds,
)

SCRIPTED = "bench-scripted"
OPENAI = "bench-openai"
MODEL = "bench-model"
API_KEY_ENV = "BENCH_OPENAI_API_KEY"
PROMPT = "Summarise the benchmark in one word."
IN_FLIGHT = 16
SCHEMA_PROPERTIES = 20
BEFORE_ENV = "BENCH_NEGOTIATOR_BEFORE"


def negotiator_executable() -> Path:
    return Path(sys.executable).parent / "negotiator"


def negotiator_argv(listen: str, config: Path) -> list[str]:
    return [str(negotiator_executable()), "serve", "--listen", listen, "--config", str(config)]


def negotiator_env(source_tree: str | None = None) -> dict[str, str]:
    """The negotiator's environment; `source_tree` runs another checkout's code (`source_tree_path`)."""
    env = dict(os.environ)
    env[API_KEY_ENV] = "bench-not-a-secret"
    if source_tree is not None:
        import_root = str(source_tree_path(source_tree))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [import_root, env.get("PYTHONPATH")]))
    return env


def source_tree_path(source_tree: str) -> Path:
    """The import root of another checkout, laid out as an editable install lays out this one.

    A checkout imports `agentsidecar` from `protos/`, where its build hook
    (hatch_build.py) generates the gRPC modules and links the top-level
    folders; a bare tree (`git archive | tar -x`) has neither, and with its
    root on the path every import would still find this checkout's code. So
    the tree's own hook runs here, and the import root is checked to be the
    tree's: a figure labelled "before" is never this tree's.
    """
    tree = Path(source_tree).resolve()
    hook = tree / "hatch_build.py"
    if not hook.is_file():
        raise SystemExit(f"{BEFORE_ENV}={source_tree}: no hatch_build.py there; give a checkout's root")
    subprocess.run([sys.executable, str(hook)], cwd=tree, check=True, capture_output=True)
    import_root = tree / "protos"
    found = subprocess.run(
        [sys.executable, "-c", "import agentsidecar.negotiator_service as m; print(m.__file__)"],
        env={**os.environ, "PYTHONPATH": str(import_root)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(tree):
        raise SystemExit(f"{BEFORE_ENV}={source_tree}: its negotiator does not import from it ({found})")
    return import_root


def output_schema(tag: str) -> str:
    """A 20-property object schema the scripted reply satisfies; `tag` makes its text unique.

    Strings (one with an email format), integers, arrays and booleans, as a
    structured-output schema of a model provider's would have.
    """
    kinds: list[dict[str, object]] = [
        {"type": "string", "maxLength": 200},
        {"type": "integer", "minimum": 0},
        {"type": "string", "format": "email"},
        {"type": "array", "items": {"type": "string"}},
        {"type": "boolean"},
    ]
    properties: dict[str, object] = {"summary": {"type": "string"}, "ok": {"type": "boolean"}}
    for index in range(SCHEMA_PROPERTIES - len(properties)):
        properties[f"field_{index}_{tag}"] = kinds[index % len(kinds)]
    schema = {"type": "object", "properties": properties, "required": ["summary", "ok"]}
    return json.dumps(schema)


def produce_request(tag: str) -> negotiator_pb2.ProduceRequest:
    return negotiator_pb2.ProduceRequest(adapter=SCRIPTED, prompt=PROMPT, output_schema=output_schema(tag))


def schema_calls(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
) -> dict[str, Callable[[], Awaitable[object]]]:
    """The cold rows and the schema-bearing warm ones by row name: warm reuses one request, cold
    makes new options (plain calls) or a new schema (schema calls) each call."""
    warm_produce = produce_request("warm")
    warm_negotiate = negotiator_pb2.NegotiateRequest(produce=warm_produce)
    # A prefix of its own per call set: another set's cold schemas, already seen, would be warm.
    prefix = os.urandom(4).hex()
    counter = itertools.count()

    async def negotiate_warm() -> object:
        return await stub.Negotiate(warm_negotiate)

    async def negotiate_cold() -> object:
        return await stub.Negotiate(
            negotiator_pb2.NegotiateRequest(produce=produce_request(f"{prefix}{next(counter)}"))
        )

    async def produce_warm() -> object:
        return await stub.Produce(warm_produce)

    async def produce_cold() -> object:
        return await stub.Produce(produce_request(f"{prefix}{next(counter)}"))

    plain_counter = itertools.count(1000)

    async def negotiate_plain_cold() -> object:
        request = negotiator_pb2.NegotiateRequest(invoke=scripted_invoke_request(next(plain_counter)))
        return await stub.Negotiate(request)

    async def invoke_cold() -> object:
        return await stub.Invoke(scripted_invoke_request(next(plain_counter)))

    return {
        # No schema, new call options each call (another `seed` setting value): nothing derived
        # from the options of an earlier call applies.
        "Negotiate (model override, two settings), cold (new options each call)": negotiate_plain_cold,
        f"Invoke ({SCRIPTED}), cold (new options each call)": invoke_cold,
        "Negotiate with a 20-property schema, warm": negotiate_warm,
        "Negotiate with a 20-property schema, cold (a new schema each call)": negotiate_cold,
        f"Produce ({SCRIPTED}) with a 20-property schema, warm": produce_warm,
        f"Produce ({SCRIPTED}) with a 20-property schema, cold (a new schema each call)": produce_cold,
    }


async def schema_rows(
    settings: Settings,
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
    echo_channel: grpc.aio.Channel,
) -> list[Row]:
    """Cold and warm rows side by side, each p50 against the echo of a same-sized request (the
    plain cold rows' warm twins are the main Negotiate and Invoke rows)."""
    reply = await stub.Produce(produce_request("check"))
    if json.loads(reply.output_json).get("ok") is not True:
        raise RuntimeError(f"{SCRIPTED} did not produce the bench reply: {reply.output_json!r}")
    echo = echo_call(
        echo_channel,
        negotiator_pb2.NegotiateRequest(produce=produce_request("0123abcd0000")).SerializeToString(),
    )
    plain_echo = echo_call(echo_channel, scripted_invoke_request(1000).SerializeToString())
    rows = []
    for name, call in schema_calls(stub).items():
        baseline = echo if "schema" in name else plain_echo
        comparison = await compare(window(baseline, settings), window(call, settings), rounds=settings.rounds)
        goal = 1.3 if name.startswith(("Produce", "Invoke")) else 1.2
        rows.append(compared_ratio(f"{name}: p50 vs echo p50", comparison, "p50_ms", goal))
        if "cold" in name:
            # A cold call's cost includes freeing what the caches drop for it, at once or spread.
            rows.append(paired_info_row(f"{name}: p99.9 vs echo p99.9", comparison, "p999_ms"))
    return rows


def paired_info_row(benchmark: str, comparison: Comparison, field: str) -> Row:
    """A latency field of a comparison, subject beside baseline with their ratio, no goal."""
    subject, baseline = getattr(comparison.subject, field), getattr(comparison.baseline, field)
    return with_rounds(
        info_row(benchmark, f"{subject:.3f} ms", f"{baseline:.3f} ms", f"{subject / baseline:.2f}×"),
        comparison,
        field,
    )


async def before_rows(
    settings: Settings,
    calls: dict[str, Callable[[], Awaitable[object]]],
    before_calls: dict[str, Callable[[], Awaitable[object]]],
) -> list[Row]:
    """Each call against the same call to the negotiator of the other tree, paired (no goal)."""
    rows = []
    for name, call in calls.items():
        comparison = await compare(
            window(before_calls[name], settings), window(call, settings), rounds=settings.rounds
        )
        rows.append(paired_info_row(f"this tree vs {BEFORE_ENV}: {name}, p50", comparison, "p50_ms"))
        rows.append(paired_info_row(f"this tree vs {BEFORE_ENV}: {name}, p99.9", comparison, "p999_ms"))
    return rows


def plain_calls(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
) -> dict[str, Callable[[], Awaitable[object]]]:
    """The schema-less calls the main rows measure, by row name."""
    invoke_request = scripted_invoke_request()
    negotiate_request = negotiator_pb2.NegotiateRequest(invoke=invoke_request)

    async def negotiate() -> object:
        return await stub.Negotiate(negotiate_request)

    async def invoke() -> object:
        return await stub.Invoke(invoke_request)

    return {"Negotiate (model override, two settings)": negotiate, f"Invoke ({SCRIPTED})": invoke}


async def run_calls(settings: Settings, rows: list[Row]) -> None:
    """Only the call rows (schema cold/warm, and the paired tree when set): a short run for call-path work."""
    workdir = settings.workdir / "negotiator"
    workdir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        config = workdir / "negotiator.yaml"
        config.write_text(bench_config("http://127.0.0.1:9/v1"))
        echo = await start_server_process(
            echo_server_argv(f"unix:{workdir / 'echo.sock'}"), log_path=workdir / "echo.log"
        )
        stack.push_async_callback(echo.stop)
        negotiator = await start_server_process(
            negotiator_argv(f"unix:{workdir / 'negotiator.sock'}", config),
            log_path=workdir / "negotiator.log",
            env=negotiator_env(),
        )
        stack.push_async_callback(negotiator.stop)
        echo_channel = await open_channel(echo.target)
        stack.push_async_callback(echo_channel.close, None)
        channel = await open_channel(negotiator.target)
        stack.push_async_callback(channel.close, None)
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        rows += await schema_rows(settings, stub, echo_channel)
        rows += await _before_tree_rows(settings, stack, workdir, config, stub)


async def _before_tree_rows(
    settings: Settings,
    stack: contextlib.AsyncExitStack,
    workdir: Path,
    config: Path,
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
) -> list[Row]:
    before_tree = os.environ.get(BEFORE_ENV)
    if not before_tree:
        return []
    before = await start_server_process(
        negotiator_argv(f"unix:{workdir / 'before.sock'}", config),
        log_path=workdir / "before.log",
        env=negotiator_env(before_tree),
    )
    stack.push_async_callback(before.stop)
    before_channel = await open_channel(before.target)
    stack.push_async_callback(before_channel.close, None)
    before_stub = negotiator_pb2_grpc.NegotiatorServiceStub(before_channel)
    calls = plain_calls(stub) | schema_calls(stub)
    return await before_rows(settings, calls, plain_calls(before_stub) | schema_calls(before_stub))


def bench_config(openai_base_url: str) -> str:
    """The negotiator config: a scripted framework adapter and an openai adapter (JSON is YAML)."""
    config = {
        "adapters": [
            {
                "shortname": SCRIPTED,
                "implementation": "scripted",
                "declaration": {
                    "kind": "agent-framework",
                    "capabilities": {
                        "structured_output": "supported",
                        "model_override": "supported",
                        "settings": "supported",
                    },
                    "accepted_settings": ["temperature", "seed"],
                    "string_formats": ["email", "date"],
                },
                "options": {
                    "invoke": {"echo": True},
                    "produce": {"json": {"summary": "scripted reply", "ok": True}},
                },
            },
            {
                "shortname": OPENAI,
                "implementation": "openai",
                "options": {"base_url": openai_base_url, "api_key_env": API_KEY_ENV, "model": MODEL},
            },
        ]
    }
    return json.dumps(config, indent=2) + "\n"


def scripted_invoke_request(seed: int = 7) -> negotiator_pb2.InvokeRequest:
    """A realistic call: a model override and two settings, each a requirement to check."""
    settings = struct_pb2.Struct()
    settings.update({"temperature": 0.2, "seed": seed})
    return negotiator_pb2.InvokeRequest(
        adapter=SCRIPTED,
        prompt=PROMPT,
        options=negotiator_pb2.CallOptions(model=MODEL, settings=settings),
    )


async def run(settings: Settings, rows: list[Row]) -> None:
    """Append each figure to `rows` as soon as it is measured (a later failure keeps them)."""
    workdir = settings.workdir / "negotiator"
    workdir.mkdir(parents=True, exist_ok=True)
    if not negotiator_executable().exists():
        rows.append(missing_row("negotiator (all)", "—", f"{negotiator_executable()} does not exist"))
        return
    async with contextlib.AsyncExitStack() as stack:
        mock = await start_server_process(
            [sys.executable, str(BENCH_DIR / "mock_chat_server.py")], log_path=workdir / "mock-chat.log"
        )
        stack.push_async_callback(mock.stop)
        base_url = f"http://{mock.target}/v1"
        config = workdir / "negotiator.yaml"
        config.write_text(bench_config(base_url))

        echo_startup, negotiator_startup = await compare_startup(
            lambda listen: negotiator_argv(listen, config),
            label="negotiator",
            workdir=workdir,
            repeats=settings.startup_repeats,
            env=negotiator_env(),
        )
        rows += startup_rows("negotiator", echo_startup, negotiator_startup, 4)

        echo = await start_server_process(
            echo_server_argv(f"unix:{workdir / 'echo.sock'}"), log_path=workdir / "echo.log"
        )
        stack.push_async_callback(echo.stop)
        negotiator = await start_server_process(
            negotiator_argv(f"unix:{workdir / 'negotiator.sock'}", config),
            log_path=workdir / "negotiator.log",
            env=negotiator_env(),
        )
        stack.push_async_callback(negotiator.stop)
        floor = await start_server_process(
            floor_server_argv(f"unix:{workdir / 'floor.sock'}"), log_path=workdir / "floor.log"
        )
        stack.push_async_callback(floor.stop)
        forwarder = await start_server_process(
            floor_server_argv(f"unix:{workdir / 'forwarder.sock'}", forward=f"{base_url}/chat/completions"),
            log_path=workdir / "forwarder.log",
        )
        stack.push_async_callback(forwarder.stop)
        await asyncio.sleep(1.0)  # let start-up allocations settle before reading RSS
        rows.append(
            absolute_row(
                "negotiator idle RSS after start-up",
                rss_mib(negotiator.pid),
                "MiB",
                80,
                baseline=f"echo {rss_mib(echo.pid):.1f} MiB",
            )
        )

        echo_channel = await open_channel(echo.target)
        stack.push_async_callback(echo_channel.close, None)
        channel = await open_channel(negotiator.target)
        stack.push_async_callback(channel.close, None)
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        floor_channel = await open_channel(floor.target)
        stack.push_async_callback(floor_channel.close, None)
        floor_stub = negotiator_pb2_grpc.NegotiatorServiceStub(floor_channel)
        forwarder_channel = await open_channel(forwarder.target)
        stack.push_async_callback(forwarder_channel.close, None)
        forwarder_stub = negotiator_pb2_grpc.NegotiatorServiceStub(forwarder_channel)

        invoke_request = scripted_invoke_request()
        negotiate_request = negotiator_pb2.NegotiateRequest(invoke=invoke_request)
        decision = (await stub.Negotiate(negotiate_request)).decision
        if not decision.accepted:
            raise RuntimeError(f"the bench call is refused by {SCRIPTED}: {decision}")
        reply = await stub.Invoke(invoke_request)
        if reply.text != PROMPT:
            raise RuntimeError(f"{SCRIPTED} did not echo the prompt: {reply.text!r}")

        async def negotiate() -> object:
            return await stub.Negotiate(negotiate_request)

        async def invoke() -> object:
            return await stub.Invoke(invoke_request)

        async def floor_invoke() -> object:
            return await floor_stub.Invoke(invoke_request)

        negotiation = await compare(
            window(echo_call(echo_channel, negotiate_request.SerializeToString()), settings),
            window(negotiate, settings),
            rounds=settings.rounds,
        )
        rows.append(compared_ratio("Negotiate p50 vs echo p50", negotiation, "p50_ms", 1.2))

        echo_invoke = echo_call(echo_channel, invoke_request.SerializeToString())
        single = await compare(
            window(echo_invoke, settings), window(invoke, settings), rounds=settings.rounds
        )
        rows.append(compared_ratio(f"Invoke ({SCRIPTED}) p50, 1 caller", single, "p50_ms", 1.3))
        rows.append(compared_ratio(f"Invoke ({SCRIPTED}) p99, 1 caller", single, "p99_ms", 1.5))
        floor_single = await compare(
            window(echo_invoke, settings), window(floor_invoke, settings), rounds=settings.rounds
        )
        rows.append(floor_row("Invoke p50, 1 caller", floor_single, "p50_ms"))
        # Issue 3's goal held directly: the negotiator's Invoke against the floor, same rounds.
        over_floor = await compare(
            window(floor_invoke, settings), window(invoke, settings), rounds=settings.rounds
        )
        rows.append(
            compared_ratio(
                f"Invoke ({SCRIPTED}) p50 vs the floor's Invoke p50 (no negotiation), 1 caller",
                over_floor,
                "p50_ms",
                1.1,
            )
        )

        loaded = await compare(
            window(echo_invoke, settings, concurrency=IN_FLIGHT),
            window(invoke, settings, concurrency=IN_FLIGHT),
            rounds=settings.rounds,
        )
        rows.append(
            compared_throughput(f"Invoke ({SCRIPTED}) throughput, {IN_FLIGHT} in flight", loaded, 0.8)
        )
        rows.append(
            info_row(
                f"Invoke ({SCRIPTED}) p50 / p99, {IN_FLIGHT} in flight",
                f"{loaded.subject.p50_ms:.2f} / {loaded.subject.p99_ms:.2f} ms",
                f"{loaded.baseline.p50_ms:.2f} / {loaded.baseline.p99_ms:.2f} ms",
            )
        )

        floor_loaded = await compare(
            window(echo_invoke, settings, concurrency=IN_FLIGHT),
            window(floor_invoke, settings, concurrency=IN_FLIGHT),
            rounds=settings.rounds,
        )
        rows.append(floor_row(f"Invoke throughput, {IN_FLIGHT} in flight", floor_loaded, "throughput_per_s"))
        rows += await cpu_rows(settings, (floor.pid, floor_invoke), (negotiator.pid, invoke))

        rows += await schema_rows(settings, stub, echo_channel)
        rows += await _before_tree_rows(settings, stack, workdir, config, stub)
        rows += await _openai_rows(settings, stub, forwarder_stub, base_url)
        rows += await _cold_openai_rows(settings, workdir, config, base_url)
        rows += await _openai_before_rows(settings, stack, workdir, config, stub, forwarder_stub, base_url)


async def cpu_rows(
    settings: Settings,
    floor: tuple[int, Callable[[], Awaitable[object]]],
    subject: tuple[int, Callable[[], Awaitable[object]]],
) -> list[Row]:
    """The server's CPU per Invoke, one caller, the negotiator against the floor in alternated
    rounds (median): the whole process and its main thread, the event loop where the servicer
    runs. What bounds the throughput with many calls in flight, and the figure a loop in one
    process understates (its caches stay warm between calls; a server's are not)."""
    calls = 300 if settings.quick else 2000
    measured: dict[int, list[tuple[float, float]]] = {floor[0]: [], subject[0]: []}
    for index in range(settings.rounds):
        for pid, call in (floor, subject) if index % 2 == 0 else (subject, floor):
            for _ in range(50):
                await call()
            before = cpu_seconds(pid), cpu_seconds(pid, pid)
            for _ in range(calls):
                await call()
            after = cpu_seconds(pid), cpu_seconds(pid, pid)
            measured[pid].append(((after[0] - before[0]) / calls * 1e6, (after[1] - before[1]) / calls * 1e6))
    rows = []
    for position, part in enumerate(("the whole process", "its main thread (the event loop)")):
        floor_us = statistics.median(pair[position] for pair in measured[floor[0]])
        subject_us = statistics.median(pair[position] for pair in measured[subject[0]])
        rounds = ", ".join(
            f"{s[position]:.0f}/{f[position]:.0f}"
            for s, f in zip(measured[subject[0]], measured[floor[0]], strict=True)
        )
        row = info_row(
            f"server CPU per Invoke ({SCRIPTED}), 1 caller, {part}: negotiator vs the floor's Invoke",
            f"{subject_us:.0f} µs",
            f"{floor_us:.0f} µs",
            f"{subject_us / floor_us:.2f}×, +{subject_us - floor_us:.0f} µs",
        )
        rows.append(dataclasses.replace(row, rounds=f"µs per call per round, negotiator/floor: {rounds}"))
    return rows


def floor_server_argv(listen: str, forward: str | None = None) -> list[str]:
    argv = [sys.executable, str(BENCH_DIR / "floor_server.py"), "--listen", listen, "--model", MODEL]
    return argv if forward is None else [*argv, "--forward", forward]


def floor_row(what: str, comparison: Comparison, field: str) -> Row:
    """A floor's figure against the echo (no goal: it says how much of a gap any Python service pays)."""
    subject: float = getattr(comparison.subject, field)
    baseline: float = getattr(comparison.baseline, field)
    unit = "/s" if field == "throughput_per_s" else " ms"
    return info_row(
        f"floor: {what}, Invoke with no negotiation (protobuf in and out) vs echo",
        f"{subject:.3f}{unit}",
        f"{baseline:.3f}{unit}",
        f"{subject / baseline:.2f}×",
    )


async def _openai_rows(
    settings: Settings,
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
    forwarder_stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
    base_url: str,
) -> list[Row]:
    """Invoke via the openai adapter minus a direct POST of the same body to the same mock.

    The direct POST is made twice, with httpx and with aiohttp, each as an
    application calls it (one client without timeouts, a URL parsed once),
    and the goal is held against the faster one: the least a Python caller
    pays for the same request. The bare forwarder and the negotiator's own
    share are measured against that same direct POST; the other client's
    rows are kept beside them.
    """
    request = negotiator_pb2.InvokeRequest(adapter=OPENAI, prompt=PROMPT)
    async with (
        httpx.AsyncClient(follow_redirects=False, timeout=None) as client,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout()) as session,
    ):
        directs = {
            "httpx": _direct_post(client, base_url),
            "aiohttp": _direct_aiohttp_post(session, base_url),
        }

        async def via_negotiator() -> object:
            return await stub.Invoke(request)

        async def via_forwarder() -> object:
            return await forwarder_stub.Invoke(request)

        reply = await stub.Invoke(request)
        if reply.text != "pong":
            raise RuntimeError(f"{OPENAI} returned {reply.text!r}, not the mock's reply")
        through: dict[str, Comparison] = {}
        floors: dict[str, Comparison] = {}
        for name, direct in directs.items():
            await direct()
            through[name] = await compare(
                window(direct, settings), window(via_negotiator, settings), rounds=settings.rounds
            )
            floors[name] = await compare(
                window(direct, settings), window(via_forwarder, settings), rounds=settings.rounds
            )
    strict = min(through, key=lambda name: through[name].baseline.p50_ms)
    rows = []
    for name in (strict, *(other for other in through if other != strict)):
        comparison, floor = through[name], floors[name]
        what = f"direct {name} POST"
        if name == strict:
            rows.append(
                compared_overhead(
                    f"openai path: Invoke ({OPENAI}) p50 minus {what} p50 (the faster direct client)",
                    comparison,
                    "p50_ms",
                    1.0,
                )
            )
        else:
            rows.append(
                with_rounds(
                    info_row(
                        f"openai path: Invoke ({OPENAI}) p50 minus {what} p50",
                        f"{comparison.subject.p50_ms:.3f} ms",
                        f"{comparison.baseline.p50_ms:.3f} ms",
                        f"{comparison.subject.p50_ms - comparison.baseline.p50_ms:+.3f} ms",
                    ),
                    comparison,
                    "p50_ms",
                )
            )
        floor_overhead = floor.subject.p50_ms - floor.baseline.p50_ms
        negotiator_overhead = comparison.subject.p50_ms - comparison.baseline.p50_ms
        rows += [
            info_row(
                f"openai path: Invoke ({OPENAI}) p99 vs {what} p99",
                f"{comparison.subject.p99_ms:.3f} ms",
                f"{comparison.baseline.p99_ms:.3f} ms",
                f"{comparison.subject.p99_ms - comparison.baseline.p99_ms:+.3f} ms",
            ),
            info_row(
                f"floor: openai path through a bare gRPC-to-HTTP forwarder (aiohttp), p50 minus {what} p50",
                f"{floor.subject.p50_ms:.3f} ms",
                f"{floor.baseline.p50_ms:.3f} ms",
                f"{floor_overhead:+.3f} ms",
            ),
            info_row(
                f"openai path: the negotiator's own share (its overhead minus the forwarder's), vs {what}",
                f"{negotiator_overhead:+.3f} ms",
                f"{floor_overhead:+.3f} ms",
                f"{negotiator_overhead - floor_overhead:+.3f} ms",
            ),
        ]
    return rows


async def _openai_before_rows(
    settings: Settings,
    stack: contextlib.AsyncExitStack,
    workdir: Path,
    config: Path,
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
    forwarder_stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
    base_url: str,
) -> list[Row]:
    """With BENCH_NEGOTIATOR_BEFORE: the openai path and its forwarder floor against that tree's, paired.

    That tree's negotiator and its `floor_server.py --forward` post to the
    same mock; each is paired with this tree's in alternated windows, and
    that tree's own share (its openai overhead minus its forwarder's, each
    against the direct aiohttp POST) is measured beside them.
    """
    before_tree = os.environ.get(BEFORE_ENV)
    if not before_tree:
        return []
    before = await start_server_process(
        negotiator_argv(f"unix:{workdir / 'before-openai.sock'}", config),
        log_path=workdir / "before-openai.log",
        env=negotiator_env(before_tree),
    )
    stack.push_async_callback(before.stop)
    before_floor_argv = floor_server_argv(
        f"unix:{workdir / 'before-forwarder.sock'}", forward=f"{base_url}/chat/completions"
    )
    before_floor_argv[1] = str(Path(before_tree) / "bench" / "floor_server.py")
    before_forwarder = await start_server_process(
        before_floor_argv, log_path=workdir / "before-forwarder.log", env=negotiator_env(before_tree)
    )
    stack.push_async_callback(before_forwarder.stop)
    channels = []
    for target in (before.target, before_forwarder.target):
        channel = await open_channel(target)
        stack.push_async_callback(channel.close, None)
        channels.append(negotiator_pb2_grpc.NegotiatorServiceStub(channel))
    before_stub, before_forwarder_stub = channels
    request = negotiator_pb2.InvokeRequest(adapter=OPENAI, prompt=PROMPT)

    def invoking(target: negotiator_pb2_grpc.NegotiatorServiceAsyncStub) -> Callable[[], Awaitable[object]]:
        async def call() -> object:
            return await target.Invoke(request)

        return call

    rows = []
    for name, now, then in (
        (f"Invoke ({OPENAI})", stub, before_stub),
        ("the bare forwarder (floor_server.py --forward)", forwarder_stub, before_forwarder_stub),
    ):
        await then.Invoke(request)
        comparison = await compare(
            window(invoking(then), settings), window(invoking(now), settings), rounds=settings.rounds
        )
        subject, baseline = comparison.subject.p50_ms, comparison.baseline.p50_ms
        rows.append(
            with_rounds(
                info_row(
                    f"this tree vs {BEFORE_ENV}: openai path, {name}, p50",
                    f"{subject:.3f} ms",
                    f"{baseline:.3f} ms",
                    f"{subject - baseline:+.3f} ms",
                ),
                comparison,
                "p50_ms",
            )
        )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout()) as session:
        direct = _direct_aiohttp_post(session, base_url)
        await direct()
        through = await compare(
            window(direct, settings), window(invoking(before_stub), settings), rounds=settings.rounds
        )
        floor = await compare(
            window(direct, settings),
            window(invoking(before_forwarder_stub), settings),
            rounds=settings.rounds,
        )
    negotiator_overhead = through.subject.p50_ms - through.baseline.p50_ms
    floor_overhead = floor.subject.p50_ms - floor.baseline.p50_ms
    rows.append(
        info_row(
            f"{BEFORE_ENV}: openai path, that tree's own share (its overhead minus its forwarder's)",
            f"{negotiator_overhead:+.3f} ms",
            f"{floor_overhead:+.3f} ms",
            f"{negotiator_overhead - floor_overhead:+.3f} ms",
        )
    )
    return rows


@contextlib.asynccontextmanager
async def fresh_negotiator(
    workdir: Path, config: Path, name: str
) -> AsyncIterator[negotiator_pb2_grpc.NegotiatorServiceAsyncStub]:
    """A stub of a `negotiator serve` started for it (socket and log named `name` in `workdir`),
    over a channel already connected: its first call is the server's first."""
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


# The direct clients every openai-path row measures (bench_stream.py's too).
DIRECT_CLIENTS = ("httpx", "aiohttp")

# The async stub type exists in the generated stubs (.pyi) only.
FirstCall = Callable[["negotiator_pb2_grpc.NegotiatorServiceAsyncStub"], Awaitable[float]]


async def cold_rows(
    settings: Settings,
    workdir: Path,
    config: Path,
    direct: tuple[str, str],
    first_call: FirstCall,
    label: Callable[[str, int], str],
) -> list[Row]:
    """A fresh negotiator's first call (`first_call` gives its seconds) vs a fresh Python process's
    first direct request with each client (`direct`: the module that makes it with
    `--cold-direct URL CLIENT`, and the URL; `harness.cold_direct_seconds`), alternated, median of
    the repeats: a row per client, named `label(client, repeats)`."""
    module, url = direct
    directs: dict[str, list[float]] = {name: [] for name in DIRECT_CLIENTS}
    through: list[float] = []
    for attempt in range(settings.startup_repeats):
        for name, attempts in directs.items():
            attempts.append(await cold_direct_seconds(module, url, name))
        async with fresh_negotiator(workdir, config, f"cold{attempt}") as stub:
            through.append(await first_call(stub))
    negotiator_ms = statistics.median(through) * 1000
    rows = []
    for name, attempts in directs.items():
        direct_ms = statistics.median(attempts) * 1000
        rows.append(
            info_row(
                label(name, len(attempts)),
                f"{negotiator_ms:.3f} ms",
                f"{direct_ms:.3f} ms",
                f"{negotiator_ms / direct_ms:.2f}x, {negotiator_ms - direct_ms:+.3f} ms",
            )
        )
    return rows


async def _cold_openai_rows(settings: Settings, workdir: Path, config: Path, base_url: str) -> list[Row]:
    """The openai path cold (`cold_rows`): a fresh negotiator's first Invoke to the openai adapter
    (its HTTP client connects to the mock on that call) vs a fresh process's first direct POST of
    the same body, its client made before."""
    request = negotiator_pb2.InvokeRequest(adapter=OPENAI, prompt=PROMPT)

    async def first_invoke(stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub) -> float:
        started = time.perf_counter()
        reply = await stub.Invoke(request)
        elapsed = time.perf_counter() - started
        if reply.text != "pong":
            raise RuntimeError(f"{OPENAI} returned {reply.text!r}, not the mock's reply")
        return elapsed

    return await cold_rows(
        settings,
        workdir,
        config,
        ("bench.bench_negotiator", base_url),
        first_invoke,
        lambda client, repeats: (
            f"openai path: Invoke ({OPENAI}), cold (first call of a fresh negotiator) vs a fresh "
            f"process's first direct {client} POST, median of {repeats}"
        ),
    )


async def _one_direct_post(base_url: str, client_name: str) -> None:
    """Print the seconds of this process's first POST, its client made just before (as the
    negotiator makes its own at start-up)."""
    if client_name == "aiohttp":
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout()) as session:
            post = _direct_aiohttp_post(session, base_url)
            started = time.perf_counter()
            await post()
    else:
        async with httpx.AsyncClient(follow_redirects=False, timeout=None) as client:
            post = _direct_post(client, base_url)
            started = time.perf_counter()
            await post()
    print(time.perf_counter() - started)


def _direct_post(client: httpx.AsyncClient, base_url: str) -> Callable[[], Awaitable[object]]:
    """An openai rows' baseline: the adapter's POST made straight from the bench with httpx."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"Authorization": "Bearer bench-not-a-secret"}
    url = httpx.URL(f"{base_url}/chat/completions")

    async def direct() -> object:
        response = await client.post(url, json=body, headers=headers)
        response.raise_for_status()
        return response.content

    return direct


def _direct_aiohttp_post(session: aiohttp.ClientSession, base_url: str) -> Callable[[], Awaitable[object]]:
    """An openai rows' baseline: the adapter's POST made straight from the bench with aiohttp."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"Authorization": "Bearer bench-not-a-secret"}
    url = URL(f"{base_url}/chat/completions")

    async def direct() -> object:
        async with session.post(url, json=body, headers=headers, allow_redirects=False) as response:
            response.raise_for_status()
            return await response.read()

    return direct


if __name__ == "__main__" and sys.argv[1:2] == ["--cold-direct"]:
    asyncio.run(_one_direct_post(sys.argv[2], sys.argv[3]))
elif __name__ == "__main__":
    import tempfile

    from bench.report import render_table

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        bench_settings = Settings.for_run(quick="--quick" in sys.argv, workdir=Path(tmp))
        collected: list[Row] = []
        # --calls: only the schema cold/warm rows and the paired tree's, not start-up or openai.
        asyncio.run((run_calls if "--calls" in sys.argv else run)(bench_settings, collected))
        print(render_table(collected))
