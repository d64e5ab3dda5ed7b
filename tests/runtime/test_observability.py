"""The call log and the Prometheus endpoint, on real servers (--otel: test_tracing.py)."""

from __future__ import annotations

import asyncio
import io
import json
import re
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agentsidecar.sidecar_runtime import observability
from agentsidecar.sidecar_runtime.auth import EnvToken
from agentsidecar.sidecar_runtime.observability import CallLog

from .runtime_support import PROBE_SERVICE, StartProbe, method, stream, unary

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


async def fails(call: Awaitable[object]) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code()


@pytest.mark.slow
async def test_one_json_line_per_call_with_its_final_status(start_probe: StartProbe, tmp_path: Path) -> None:
    log_file = tmp_path / "calls.jsonl"
    server = await start_probe(
        call_log=str(log_file), tokens=EnvToken("TOKEN", (b"secret",)), open_reads=True
    )
    async with grpc.aio.insecure_channel(server.bound[0]) as channel:
        assert await unary(channel, "Echo", b"hi", metadata=(("x-request-id", "req-1"),), timeout=5) == b"hi"
        assert await fails(unary(channel, "Echo", b"fail", timeout=5)) == grpc.StatusCode.NOT_FOUND
        assert await fails(unary(channel, "Mutate", timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
        assert await stream(channel, "Count", b"2", timeout=5) == [b"0", b"1"]
        assert await fails(unary(channel, "Sleep", b"5", timeout=0.2)) == grpc.StatusCode.DEADLINE_EXCEEDED
        ticks = channel.unary_stream(method("Tick"), None, None)(b"50", timeout=5)
        assert await ticks.read() == b"0"
        ticks.cancel()
        unknown = channel.unary_unary(f"/{PROBE_SERVICE}/Nope", None, None)(b"", timeout=5)
        assert await fails(unknown) == grpc.StatusCode.UNIMPLEMENTED
    async with grpc.aio.insecure_channel(server.bound[1]) as tcp_channel:
        assert await unary(tcp_channel, "Echo", b"tcp", timeout=5) == b"tcp"
    await asyncio.sleep(0.1)  # the cancelled Tick handler unwinds
    await server.stop()  # flushes the log

    lines = log_file.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    by_method: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_method.setdefault(record["method"], []).append(record)
    outcomes = sorted((r["method"], r["status"], r.get("error_reason", "-")) for r in records)
    assert outcomes == [
        ("Count", "OK", "-"),
        ("Echo", "NOT_FOUND", "THING_MISSING"),
        ("Echo", "OK", "-"),
        ("Echo", "OK", "-"),
        ("Mutate", "UNAUTHENTICATED", "TOKEN_MISSING"),
        ("Nope", "UNIMPLEMENTED", None),
        ("Sleep", "DEADLINE_EXCEEDED", None),
        ("Tick", "CANCELLED", None),
    ]
    for record in records:
        assert set(record) >= {"ts", "service", "method", "status", "duration_ms", "peer", "request_id"}
        assert record["service"] == PROBE_SERVICE
        assert TIMESTAMP.fullmatch(record["ts"])
        assert isinstance(record["duration_ms"], int | float)
        assert record["duration_ms"] >= 0
    first_echo, *_ = (r for r in by_method["Echo"] if r["request_id"] == "req-1")
    assert first_echo["peer"].startswith("unix:")
    generated = [r["request_id"] for r in records if r["request_id"] != "req-1"]
    assert all(re.fullmatch(r"[0-9a-f]{16}-\d+", rid) for rid in generated)
    assert len(set(generated)) == len(generated)
    tcp_echo = next(r for r in by_method["Echo"] if r["peer"].startswith("ipv4:127.0.0.1:"))
    assert tcp_echo["status"] == "OK"
    assert by_method["Sleep"][0]["duration_ms"] >= 150


async def test_reflection_streams_pass_through_and_are_logged(
    start_probe: StartProbe, tmp_path: Path
) -> None:
    log_file = tmp_path / "calls.jsonl"
    server = await start_probe(call_log=str(log_file), max_concurrent_calls=4, default_timeout=5.0)

    def list_services() -> list[str]:
        with grpc.insecure_channel(server.bound[0]) as channel:
            services: list[str] = ProtoReflectionDescriptorDatabase(channel).get_services()
            return services

    assert PROBE_SERVICE in await asyncio.to_thread(list_services)
    await server.stop()
    (record,) = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert (record["service"], record["method"]) == (
        "grpc.reflection.v1alpha.ServerReflection",
        "ServerReflectionInfo",
    )
    # The reflection client either half-closes its stream or has it cancelled when its channel closes.
    assert record["status"] in {"OK", "CANCELLED"}


def scrape(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


async def get_metrics(address: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://{address}/metrics", timeout=5)
    assert response.status_code == 200
    return scrape(response.text)


def labels(**values: str) -> frozenset[tuple[str, str]]:
    return frozenset(values.items())


@pytest.mark.slow
async def test_metrics_endpoint_counts_calls_and_latency(start_probe: StartProbe) -> None:
    server = await start_probe(metrics_listen="127.0.0.1:0")
    assert server.metrics_bound is not None
    assert re.fullmatch(r"127\.0\.0\.1:\d+", server.metrics_bound)
    before = await get_metrics(server.metrics_bound)
    async with grpc.aio.insecure_channel(server.bound[0]) as channel:
        for _ in range(3):
            await unary(channel, "Echo", b"x", timeout=5)
        await fails(unary(channel, "Echo", b"fail", timeout=5))
    observability.record_refusal("persona")
    observability.record_refusals(["mcp", "mcp", "hooks"])  # one refused call lacking two capabilities
    after = await get_metrics(server.metrics_bound)

    def delta(name: str, label_set: frozenset[tuple[str, str]]) -> float:
        return after.get((name, label_set), 0.0) - before.get((name, label_set), 0.0)

    echo = {"grpc_type": "unary", "grpc_service": PROBE_SERVICE, "grpc_method": "Echo"}
    assert delta("grpc_server_started_total", labels(**echo)) == 4
    assert delta("grpc_server_handled_total", labels(**echo, grpc_code="OK")) == 3
    assert delta("grpc_server_handled_total", labels(**echo, grpc_code="NotFound")) == 1
    assert delta("grpc_server_handling_seconds_count", labels(**echo)) == 4
    assert delta("grpc_server_handling_seconds_bucket", labels(**echo, le="+Inf")) == 4
    assert delta("grpc_server_handling_seconds_bucket", labels(**echo, le="0.0005")) >= 0
    assert after[("grpc_server_handling_seconds_sum", labels(**echo))] > 0
    assert after[("grpc_server_calls_in_flight", labels())] == 0
    assert delta("negotiator_refusals_total", labels(capability="persona")) == 1
    assert delta("negotiator_refusals_total", labels(capability="mcp")) == 1
    assert delta("negotiator_refusals_total", labels(capability="hooks")) == 1
    assert ("process_resident_memory_bytes", labels()) in after

    await server.stop()
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://{server.metrics_bound}/metrics", timeout=2)


async def test_metrics_listen_takes_host_and_port(start_probe: StartProbe, socket_dir: Path) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        await start_probe(metrics_listen=f"unix:{socket_dir / 'metrics.sock'}")


class _BlockingStream(io.StringIO):
    """Blocks the first write until released, as a full pipe would."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.unblock = threading.Event()

    def write(self, text: str) -> int:
        self.writing.set()
        self.unblock.wait(timeout=10)
        return super().write(text)


async def test_a_blocked_log_drops_lines_instead_of_blocking_calls() -> None:
    drops: list[None] = []
    sink = _BlockingStream()
    log = CallLog(sink, close_stream=False, on_drop=lambda: drops.append(None))
    log.write({"n": 0})
    assert await asyncio.to_thread(sink.writing.wait, 5)
    for n in range(1, observability.MAX_PENDING_LINES + 11):
        log.write({"n": n})  # returns at once although the writer is stuck
    assert len(drops) == 10
    sink.unblock.set()
    await log.close()
    written = [json.loads(line)["n"] for line in sink.getvalue().splitlines()]
    assert written == list(range(observability.MAX_PENDING_LINES + 1))


async def test_a_failing_log_stream_counts_drops() -> None:
    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("disk full")

    drops: list[None] = []
    log = CallLog(Broken(), close_stream=False, on_drop=lambda: drops.append(None))
    for n in range(3):
        log.write({"n": n})
    await log.close()
    assert len(drops) == 3


def test_call_lines_are_what_json_dumps_makes_of_the_record() -> None:
    fields = observability.method_fields("pkg.Sérvice", 'Odd"Name')
    cases = [
        (grpc.StatusCode.OK, 0.000123456, "unix:", (("x-request-id", 'réq-"1\\'),), None),
        (
            grpc.StatusCode.NOT_FOUND,
            1.5,
            "ipv4:127.0.0.1:5",
            (("x-request-id", b"bytes-id"),),
            "THING_MISSING",
        ),
        (grpc.StatusCode.CANCELLED, 0.0, None, (("x-request-id", "x" * 300),), None),
    ]
    for code, duration, peer, metadata, reason in cases:
        line = observability._call_line(
            (1_796_000_000.123456, fields, code, duration, peer, metadata, reason)
        )
        expected: dict[str, Any] = {
            "ts": "2026-11-30T00:53:20.123Z",
            "service": "pkg.Sérvice",
            "method": 'Odd"Name',
            "status": code.name,
            "duration_ms": round(duration * 1000, 3),
            "peer": peer,
            "request_id": observability._request_id(metadata),
        }
        if code is not grpc.StatusCode.OK:
            expected["error_reason"] = reason
        assert line == json.dumps(expected, ensure_ascii=False, separators=(",", ":"))


@given(
    st.one_of(
        st.floats(min_value=0.0, max_value=1e6),  # up to eleven days
        st.integers(min_value=0, max_value=10**9).map(lambda n: n / 10**6),  # whole microseconds
        st.integers(min_value=0, max_value=10**7).map(lambda n: n / 10**4 + 5e-7),  # on a rounding edge
    )
)
def test_durations_are_written_as_json_dumps_writes_them_rounded(seconds: float) -> None:
    assert observability._milliseconds_text(seconds) == json.dumps(round(seconds * 1000, 3))


def test_timestamps_are_rfc3339_utc_milliseconds_like_datetime() -> None:
    from datetime import UTC, datetime

    for epoch in (
        0.0,
        1_796_000_000.0,
        1_796_000_000.9994,
        1_796_000_000.9999996,
        1_796_000_059.5005,
        1e9 + 0.001,
    ):
        expected = (
            datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        )
        assert observability._timestamp(epoch) == expected


async def test_request_ids_are_generated_per_line_when_the_caller_sends_none() -> None:
    sink = io.StringIO()
    log = CallLog(sink, close_stream=False)
    fields = observability.method_fields("s", "m")
    for _ in range(3):
        log.write_call(fields, grpc.StatusCode.OK, 0.001, "unix:", (), None)
    await log.close()
    ids = [json.loads(line)["request_id"] for line in sink.getvalue().splitlines()]
    assert len(ids) == 3 == len(set(ids))
    assert all(re.fullmatch(r"[0-9a-f]{16}-\d+", request_id) for request_id in ids)


async def test_ready_lines_keep_their_place_among_records_and_calls() -> None:
    stream = io.StringIO()
    log = CallLog(stream, close_stream=False)
    fields = observability.method_fields("pkg.Service", "Call")
    log.write_line('{"event":"before"}')
    log.write_call(fields, grpc.StatusCode.OK, 0.001, "unix:", (("x-request-id", "r1"),), None)
    log.write({"event": "after"})
    await log.close()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line.get("event", line.get("request_id")) for line in lines] == ["before", "r1", "after"]


@pytest.mark.slow
async def test_an_idle_writer_never_wakes_and_a_queued_line_still_goes_out_within_the_interval() -> None:
    sink = io.StringIO()
    log = CallLog(sink, close_stream=False, flush_interval=0.01)
    flushes: list[None] = []
    drain = log._flush

    def counted_flush() -> None:
        flushes.append(None)
        drain()

    log._flush = counted_flush  # type: ignore[method-assign]
    try:
        await asyncio.sleep(0.3)  # thirty flush intervals
        assert flushes == []
        log.write_line('{"line":1}')
        for _ in range(200):
            if sink.getvalue():
                break
            await asyncio.sleep(0.01)
        assert sink.getvalue() == '{"line":1}\n'
        await asyncio.sleep(0.3)
        assert len(flushes) == 1  # one wake for the line, none while idle again
    finally:
        await log.close()


def test_call_lines_write_any_peer_as_text_and_a_fresh_id_without_metadata() -> None:
    fields = observability.method_fields("pkg.Service", "Method")
    # A peer that is not text, as a server other than grpc.aio's could hand over.
    cases: list[tuple[Any, Any]] = [(b"ipv6:[::1]:5", None), (7, ()), ("unix:", [("user-agent", "x")])]
    for peer, metadata in cases:
        line = json.loads(
            observability._call_line((0.0, fields, grpc.StatusCode.OK, 0.001, peer, metadata, None))
        )
        assert line["peer"] == str(peer)
        prefix, _, number = line["request_id"].rpartition("-")
        assert prefix == observability._REQUEST_ID_PREFIX
        assert number.isdigit()
