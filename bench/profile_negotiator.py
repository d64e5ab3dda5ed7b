"""Where a Negotiate / Invoke call spends its time inside the negotiator (a profiling aid, not a benchmark).

    python -m bench.profile_negotiator [--calls N] [--cprofile] [--top K]

Starts the negotiator in this process (`agentsidecar.negotiator_service.server.create_server`
on a Unix socket, the bench config of bench_negotiator.py, decision lines
through the runtime's batched writer as `negotiator serve` writes them, here
to a file), then:

* times the server-side per-call work piece by piece, without gRPC
  (convert, validate_request, profile expansion, derive/judge, the decision
  log, the audit record, the adapter's own check judged afresh and read off
  the broker's judgement, response conversion with and without the
  server's caches, the reply's size bound, the brokered call with and
  without a time budget), each as µs per call;
* times the warm Invoke's pieces (request conversion, the brokered call, the
  response) one call at a time, each call after touching a buffer of four
  times the CPU's L2 cache, beside the same without: in a server, gRPC's core
  and the event loop run between two calls and push the call path's objects
  out of the cache, and that, not the instructions, is most of what the call
  path costs there (compare bench/server_cpu_stages.py);
* times the cold pieces as the first ones, each call with an input no call
  before it had (bench_negotiator's 20-property schema with a new tag, a
  new `seed` setting): the schema's parse, metaschema check, compile and
  formats walk, its whole check, a new decision's log line, proto and
  sharing, and the dry run and brokered call of a cold Produce and of an
  Invoke with new options; then a run of cold Produces, each timed alone
  (p50, p99, p99.9, max), long enough to make every cache drop entries;
* with --cprofile, profiles this process (the server) while a client
  process makes N Negotiate and then N Invoke calls, and prints the
  functions with the most own time, then the negotiator's and the runtime's
  functions by cumulative time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import jsonschema_rs

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from agentsidecar.negotiator_service import convert, model, negotiation
from agentsidecar.negotiator_service.adapters._calls import ALL_CAPABILITIES, check_call
from agentsidecar.negotiator_service.broker import Broker, _AuditDraft, decision_line
from agentsidecar.negotiator_service.call_caches import MAX_ENTRIES, CallCaches
from agentsidecar.negotiator_service.model import AdapterCall, AdapterReply, AuditOutcome, CallKind
from agentsidecar.negotiator_service.server import Settings, create_server
from bench.bench_negotiator import bench_config, output_schema, produce_request, scripted_invoke_request
from bench.profile_openai import best_us, best_us_async
from bench.report import percentile

REPEATS = 7  # the machine is noisy: the fastest of several batches is the work itself


def per_call_us(label: str, work: Callable[[], object], calls: int) -> None:
    print(f"  {label:<46} {best_us(work, calls):8.1f} µs")


async def breakdown(running: object, calls: int) -> None:
    from agentsidecar.negotiator_service.server import RunningNegotiator

    assert isinstance(running, RunningNegotiator)
    broker = running.broker
    invoke_message = scripted_invoke_request()
    negotiate_message = negotiator_pb2.NegotiateRequest(invoke=invoke_message)
    request = convert.invoke_request(invoke_message)
    decision, schema, expanded = broker._judge(request)
    adapter = running.registry.get("bench-scripted").adapter
    declaration = adapter.declaration
    adapter_call = AdapterCall(prompt=expanded.prompt, options=expanded.options, output_schema=schema)
    # What the broker hands the adapter: the same call with its judgement (AdapterCall.judgement).
    judged_call = replace(
        adapter_call, judgement=(decision, declaration, CallKind.INVOKE, expanded.options, schema, None)
    )
    reply = AdapterReply(text=expanded.prompt)
    requirements = negotiation.derive_requirements(expanded, schema)

    def audit_emit() -> None:
        draft = _AuditDraft(broker, "invoke", "unix:", request, delegation_depth=0)
        draft.decision = decision
        draft.emit(AuditOutcome.SUCCEEDED)

    print(f"server-side pieces, {calls} calls each (no gRPC):")
    per_call_us("convert.negotiate_request", lambda: convert.negotiate_request(negotiate_message), calls)
    per_call_us("convert.invoke_request", lambda: convert.invoke_request(invoke_message), calls)
    per_call_us(
        "negotiation.validate_request", lambda: negotiation.validate_request(request, broker.profiles), calls
    )
    per_call_us(
        "negotiation.expand_profile", lambda: negotiation.expand_profile(request, broker.profiles), calls
    )
    per_call_us(
        "registry.declaration + select",
        lambda: negotiation.select(expanded, broker.registry.declaration),
        calls,
    )
    per_call_us(
        "negotiation.derive_requirements", lambda: negotiation.derive_requirements(expanded, schema), calls
    )
    per_call_us("negotiation.judge", lambda: negotiation.judge(declaration, requirements, frozenset()), calls)
    per_call_us("declaration.version", lambda: declaration.version, calls)
    per_call_us("broker._judge (all of the above)", lambda: broker._judge(request), calls)
    per_call_us("broker._log_decision", lambda: broker._log_decision("invoke", decision, request), calls)
    per_call_us("audit draft + emit (no watchers, no file)", audit_emit, calls)
    per_call_us("broker.negotiate (judge + log + audit)", lambda: broker.negotiate(request), calls)
    per_call_us(
        "adapters._calls.check_call (judged afresh)",
        lambda: check_call(declaration, adapter_call, CallKind.INVOKE, implemented=ALL_CAPABILITIES),
        calls,
    )
    per_call_us(
        "adapters._calls.check_call (broker's judgement)",
        lambda: check_call(declaration, judged_call, CallKind.INVOKE, implemented=ALL_CAPABILITIES),
        calls,
    )
    per_call_us("convert.decision_to_proto", lambda: convert.decision_to_proto(decision), calls)
    per_call_us("convert.invoke_response", lambda: convert.invoke_response(reply, decision), calls)
    caches = broker.caches
    per_call_us("caches.invoke_request (options kept)", lambda: caches.invoke_request(invoke_message), calls)
    per_call_us(
        "caches.invoke_response (decision kept)", lambda: caches.invoke_response(reply, decision), calls
    )
    per_call_us("caches.reply_size_bound", lambda: caches.reply_size_bound(reply, decision, None), calls)

    async def brokered() -> None:
        await broker.call(request, time_budget=None, caller="unix:")

    async def brokered_with_budget() -> None:
        await broker.call(request, time_budget=60.0, caller="unix:")

    for label, work in (
        ("broker.call (await, scripted adapter)", brokered),
        ("broker.call (await, with a time budget)", brokered_with_budget),
    ):
        started = time.perf_counter()
        for _ in range(calls):
            await work()
        per_call = (time.perf_counter() - started) / calls
        print(f"  {label:<46} {per_call * 1e6:8.1f} µs")


def l2_bytes() -> int:
    """The CPU's L2 cache per core (sysfs), or 2 MiB when the system does not say."""
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index2/size").read_text().strip()
    except OSError:
        return 2 << 20
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


async def evicted_breakdown(running: object, calls: int) -> None:
    """The warm Invoke's pieces with the CPU's L2 cache evicted before each call: what they cost in
    a server, where gRPC's core and the event loop run between two calls. Each call is timed
    alone (the eviction is not in its time); medians. A piece's distance from its warm-loop
    figure is the memory it touches that is not in the cache."""
    from agentsidecar.negotiator_service.server import RunningNegotiator

    assert isinstance(running, RunningNegotiator)
    broker, caches = running.broker, running.broker.caches
    invoke_message = scripted_invoke_request()
    request = caches.invoke_request(invoke_message)
    reply, decision = await broker.call(request, time_budget=None)
    evicted = bytearray(4 * l2_bytes())
    touch = b"\1" * (len(evicted) // 64)

    async def converted() -> object:
        return caches.invoke_request(invoke_message)

    async def brokered() -> object:
        return await broker.call(request, time_budget=None, caller="unix:")

    async def responded() -> object:
        return caches.invoke_response(reply, decision)

    async def whole() -> object:
        answer, judged = await broker.call(caches.invoke_request(invoke_message), time_budget=None)
        return caches.invoke_response(answer, judged)

    print(f"the warm Invoke's pieces, {calls} calls each, {len(evicted) >> 20} MiB touched before each call:")
    for label, work in (
        ("caches.invoke_request", converted),
        ("broker.call (scripted adapter)", brokered),
        ("caches.invoke_response", responded),
        ("all three", whole),
    ):
        figures = []
        for evict in (False, True):
            times = []
            for _ in range(calls):
                if evict:
                    evicted[::64] = touch  # one byte in every cache line
                started = time.perf_counter_ns()
                await work()
                times.append(time.perf_counter_ns() - started)
            figures.append(statistics.median(times) / 1000)
        print(f"  {label:<46} {figures[1]:8.1f} µs  (warm loop {figures[0]:.1f})")


def _checking(texts: list[str], compile_it: bool) -> Callable[[int], object]:
    return lambda index: negotiation.check_schema_text(texts[index], compile=compile_it)


def _on_new_inputs(piece: Callable[[int], object], inputs: int) -> Callable[[], object]:
    """`piece` on input 0, then 1, and so on: each call's input is one no call before it had."""
    numbers = iter(range(inputs))
    return lambda: piece(next(numbers))


async def cold_breakdown(running: object, calls: int) -> None:
    """The pieces of a cold call, each timed on inputs no call before it had."""
    from agentsidecar.negotiator_service.server import RunningNegotiator

    assert isinstance(running, RunningNegotiator)
    broker = running.broker
    caches = broker.caches
    inputs = calls + 500  # best_us makes at most this many calls
    prefix = os.urandom(4).hex()

    def schema_texts(tag: str) -> list[str]:
        return [output_schema(f"{prefix}{tag}{index}") for index in range(inputs)]

    texts = schema_texts("a")
    parsed = [json.loads(text) for text in texts]
    produce_calls = [convert.produce_request(produce_request(f"{prefix}d{i}")) for i in range(inputs)]
    decisions = [broker._judge_checked(call)[0] for call in produce_calls]
    pieces: list[tuple[str, Callable[[int], object]]] = [
        ("model.strict_json (the schema text)", lambda i: model.strict_json(texts[i])),
        ("metaschema check (jsonschema_rs.meta.is_valid)", lambda i: jsonschema_rs.meta.is_valid(parsed[i])),
        ("negotiation.schema_validator (compile)", lambda i: negotiation.schema_validator(parsed[i])),
        ("negotiation._text_formats", lambda i: negotiation._text_formats(parsed[i], texts[i])),
        (
            "broker.decision_line (a new decision)",
            lambda i: decision_line("produce", decisions[i], frozenset()),
        ),
        ("convert.decision_to_proto (a new decision)", lambda i: convert.decision_to_proto(decisions[i])),
        ("CallCaches.shared_decision (a new decision)", lambda i: CallCaches().shared_decision(decisions[i])),
    ]
    for compile_it, tag in ((False, "b"), (True, "c")):
        label = f"check_schema_text ({'dispatch' if compile_it else 'a dry run'})"
        pieces.append((label, _checking(schema_texts(tag), compile_it)))
    print(f"cold pieces, {calls} calls each, every call's input new (no gRPC):")
    for label, piece in pieces:
        per_call_us(label, _on_new_inputs(piece, inputs), calls)

    negotiate_cold = iter(
        [negotiator_pb2.NegotiateRequest(produce=produce_request(f"{prefix}n{i}")) for i in range(inputs)]
    )
    negotiate_options = iter(
        [negotiator_pb2.NegotiateRequest(invoke=scripted_invoke_request(10_000 + i)) for i in range(inputs)]
    )
    produce_cold = iter([produce_request(f"{prefix}p{i}") for i in range(inputs)])
    invoke_options = iter([scripted_invoke_request(20_000 + i) for i in range(inputs)])

    def negotiate(messages: Iterator[negotiator_pb2.NegotiateRequest]) -> object:
        return caches.negotiate_response(broker.negotiate(caches.negotiate_request(next(messages))))

    per_call_us("Negotiate, a new schema (convert, judge, respond)", lambda: negotiate(negotiate_cold), calls)
    per_call_us(
        "Negotiate, new options (convert, judge, respond)", lambda: negotiate(negotiate_options), calls
    )

    async def produce() -> None:
        reply, decision = await broker.call(caches.produce_request(next(produce_cold)), time_budget=None)
        caches.produce_response(reply, decision)

    async def invoke() -> None:
        reply, decision = await broker.call(caches.invoke_request(next(invoke_options)), time_budget=None)
        caches.invoke_response(reply, decision)

    for label, work in (
        ("Produce, a new schema (convert, call, respond)", produce),
        ("Invoke, new options (convert, call, respond)", invoke),
    ):
        print(f"  {label:<46} {await best_us_async(work, calls):8.1f} µs")
    await cold_tail(broker, prefix)


async def cold_tail(broker: Broker, prefix: str) -> None:
    """Each call of a run of cold Produces timed alone: enough new schemas to fill every cache
    several times over, so the tail shows what dropping their entries costs the calls that do it."""
    caches = broker.caches
    count = 4 * MAX_ENTRIES
    messages = [produce_request(f"{prefix}t{i}") for i in range(count)]
    latencies = []
    for message in messages:
        started = time.perf_counter()
        reply, decision = await broker.call(caches.produce_request(message), time_budget=None)
        caches.produce_response(reply, decision)
        latencies.append(time.perf_counter() - started)
    latencies.sort()
    figures = "  ".join(
        f"{name} {percentile(latencies, fraction) * 1e6:.0f}"
        for name, fraction in (("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999), ("max", 1.0))
    )
    print(f"  {f'Produce, a new schema, {count} calls one by one':<46} {figures} µs")


async def client(target: str, calls: int, method: str) -> None:
    """The load for --cprofile, run in its own process so the profile shows the server alone."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        invoke_message = scripted_invoke_request()
        negotiate_message = negotiator_pb2.NegotiateRequest(invoke=invoke_message)
        for _ in range(calls):
            if method == "Negotiate":
                await stub.Negotiate(negotiate_message)
            else:
                await stub.Invoke(invoke_message)


async def through_grpc(target: str, calls: int, top: int) -> None:
    """Profile the server (this process) while a client process makes `calls` calls of each method."""

    async def load(count: int, method: str) -> float:
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.profile_negotiator",
            "--client",
            target,
            "--calls",
            str(count),
            "--method",
            method,
        )
        if await process.wait() != 0:
            raise RuntimeError(f"the {method} client failed")
        return time.perf_counter() - started

    for method in ("Negotiate", "Invoke"):
        await load(200, method)  # warm-up (includes the client's start-up)
        profile = cProfile.Profile()
        profile.enable()
        elapsed = await load(calls, method)
        profile.disable()
        print(f"\n== {method}: {calls} calls from a client process in {elapsed:.2f} s (profiled server) ==")
        stats = pstats.Stats(profile, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats("agentsidecar", top)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="profile-negotiator-") as tmp:
        workdir = Path(tmp)
        config = workdir / "negotiator.yaml"
        config.write_text(bench_config("http://127.0.0.1:9/v1"))
        # As `negotiator serve`: decision lines through the runtime's batched stderr writer, which
        # takes the stderr of the moment it is made: here a file rather than the terminal.
        with (workdir / "decisions.log").open("w", encoding="utf-8") as decisions:
            with contextlib.redirect_stderr(decisions):
                running = await create_server(
                    Settings(
                        listen=(f"unix:{workdir / 'n.sock'}",),
                        config_path=config,
                        state_dir=workdir / "state",
                        decisions_to_stderr=True,
                    )
                )
            try:
                await breakdown(running, args.calls)
                await evicted_breakdown(running, args.calls)
                await cold_breakdown(running, args.calls)
                if args.cprofile:
                    await through_grpc(running.bound[0], args.calls, args.top)
            finally:
                await running.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--client", metavar="TARGET", help=argparse.SUPPRESS)
    parser.add_argument("--method", default="Invoke", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.client:
        asyncio.run(client(arguments.client, arguments.calls, arguments.method))
    else:
        asyncio.run(main(arguments))
