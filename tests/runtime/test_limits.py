"""Limits on real servers: message size both ways, concurrent calls, default deadlines, port clashes."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentsidecar.sidecar_runtime.limits import DOMAIN
from agentsidecar.sidecar_runtime.richstatus import decode_error
from agentsidecar.sidecar_runtime.server import ServerOptions, start_server

from .runtime_support import PROBE_SERVICE, Probe, StartProbe, stream, unary

SERVING = health_pb2.HealthCheckResponse.SERVING


async def failure(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def test_an_oversized_request_is_resource_exhausted(start_probe: StartProbe) -> None:
    server = await start_probe(max_message_bytes=1024)
    async with grpc.aio.insecure_channel(server.bound[0]) as channel:
        assert await unary(channel, "Echo", b"y" * 1000, timeout=5) == b"y" * 1000
        error = await failure(unary(channel, "Echo", b"y" * 2048, timeout=5))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in (error.details() or "")


async def test_an_oversized_request_is_grpcs_own_refusal_before_any_layer(
    start_probe: StartProbe, tmp_path: Path
) -> None:
    # C-core refuses the message before any Python code of the call runs: no
    # ErrorInfo, no call log line, no layer. protos/README.md documents it as such.
    log_file = tmp_path / "calls.jsonl"
    server = await start_probe(max_message_bytes=1024, call_log=str(log_file))
    async with grpc.aio.insecure_channel(server.bound[0]) as channel:
        error = await failure(unary(channel, "Echo", b"y" * 2048, timeout=5))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert re.fullmatch(
            r"SERVER: Received message larger than max \(2048 vs\. 1024\)", error.details() or ""
        )
        decoded = decode_error(error)
        assert (decoded.reason, decoded.domain, decoded.metadata) == ("", "", {})
        # The server goes on serving, the same channel included.
        assert await unary(channel, "Echo", b"after", timeout=5) == b"after"
    await server.stop()
    assert [json.loads(line)["status"] for line in log_file.read_text().splitlines()] == ["OK"]


async def test_an_oversized_response_is_resource_exhausted(start_probe: StartProbe) -> None:
    server = await start_probe(max_message_bytes=1024)
    async with grpc.aio.insecure_channel(
        server.bound[1], options=[("grpc.max_receive_message_length", 1 << 20)]
    ) as channel:
        assert len(await unary(channel, "Echo", b"big:1000", timeout=5)) == 1000
        error = await failure(unary(channel, "Echo", b"big:4096", timeout=5))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_calls_beyond_the_limit_fail_with_error_info_while_health_answers(
    start_probe: StartProbe, probe: Probe
) -> None:
    server = await start_probe(max_concurrent_calls=2)
    async with grpc.aio.insecure_channel(server.bound[0]) as channel:
        held = [asyncio.ensure_future(unary(channel, "Hold", timeout=10)) for _ in range(2)]
        await probe.wait_holding(2)

        error = await failure(unary(channel, "Echo", b"one more", timeout=5))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        decoded = decode_error(error)
        assert (decoded.domain, decoded.reason) == (DOMAIN, "TOO_MANY_CALLS")
        assert decoded.metadata == {"maxConcurrentCalls": "2"}
        assert decoded.retry_after_seconds == pytest.approx(0.1)
        # An open stream is a call too.
        stream_error = await failure(stream(channel, "Count", b"1", timeout=5))
        assert decode_error(stream_error).reason == "TOO_MANY_CALLS"

        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", PROBE_SERVICE):
            response = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert response.status == SERVING

        probe.release()
        assert await asyncio.gather(*held) == [b"released", b"released"]
        # The slots are free again.
        assert await unary(channel, "Echo", b"again", timeout=5) == b"again"
        assert await stream(channel, "Count", b"2", timeout=5) == [b"0", b"1"]


@pytest.mark.slow
async def test_a_call_without_deadline_gets_the_default(start_probe: StartProbe, probe: Probe) -> None:
    server = await start_probe(default_timeout=0.4)
    async with grpc.aio.insecure_channel(server.bound[0]) as channel:
        # The servicer sees the default through context.time_remaining().
        remaining = float(await unary(channel, "Echo", b"remaining"))
        assert 0.2 < remaining <= 0.4

        error = await failure(unary(channel, "Sleep", b"5"))
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        decoded = decode_error(error)
        assert (decoded.domain, decoded.reason) == (DOMAIN, "DEFAULT_TIMEOUT_EXCEEDED")
        assert decoded.metadata == {"defaultTimeoutSeconds": "0.4"}
        assert "Sleep" not in probe.finished  # the handler was cancelled, not left running

        # A caller's own deadline governs, longer or shorter than the default.
        assert await unary(channel, "Sleep", b"0.6", timeout=5) == b"slept"
        assert float(await unary(channel, "Echo", b"remaining", timeout=3)) > 2.0
        short = await failure(unary(channel, "Sleep", b"5", timeout=0.2))
        assert short.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert decode_error(short).reason == ""  # grpc's own deadline, no ErrorInfo

        # Streams are exempt: both styles run past the default.
        assert await stream(channel, "Count", b"4") == [b"0", b"1", b"2", b"3"]
        assert await stream(channel, "Tick", b"4") == [b"0", b"1", b"2", b"3"]


async def test_a_second_server_on_the_same_tcp_port_fails() -> None:
    options = ServerOptions(listen=("127.0.0.1:0",), grace_seconds=0)
    first = await start_server(lambda server: None, (), options)
    try:
        port = first.bound[0].rpartition(":")[2]
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}"):
            await start_server(
                lambda server: None, (), ServerOptions(listen=(f"127.0.0.1:{port}",), grace_seconds=0)
            )
    finally:
        await first.stop()


@pytest.mark.parametrize(("option", "value"), [("max_concurrent_calls", 0), ("default_timeout", 0.0)])
async def test_limits_must_be_positive(start_probe: StartProbe, option: str, value: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        await start_probe(**{option: value})


@pytest.mark.slow
async def test_default_deadlines_count_from_each_call_s_own_start(
    start_probe: StartProbe, probe: Probe
) -> None:
    server = await start_probe(default_timeout=0.4)
    loop = asyncio.get_running_loop()

    async def timed_sleep(channel: grpc.aio.Channel, seconds: str) -> tuple[float, str]:
        """How long the call took, and OK or the ErrorInfo reason it failed with."""
        started = loop.time()
        try:
            await unary(channel, "Sleep", seconds.encode())
        except grpc.aio.AioRpcError as error:
            return loop.time() - started, decode_error(error).reason
        return loop.time() - started, "OK"

    async with grpc.aio.insecure_channel(server.bound[0]) as channel:
        first = asyncio.ensure_future(timed_sleep(channel, "5"))
        await asyncio.sleep(0.2)
        later = asyncio.ensure_future(timed_sleep(channel, "5"))
        short = asyncio.ensure_future(timed_sleep(channel, "0.1"))
        (first_took, first_end), (later_took, later_end), (_, short_end) = await asyncio.gather(
            first, later, short
        )
        assert (first_end, later_end, short_end) == (
            "DEFAULT_TIMEOUT_EXCEEDED",
            "DEFAULT_TIMEOUT_EXCEEDED",
            "OK",
        )
        # Each expired 0.4 s after it started: the later call was not cut at the first one's deadline.
        assert 0.35 < first_took < 1.5
        assert 0.35 < later_took < 1.5
        # Once the queue has drained, a new call still gets (and keeps to) the default.
        took, end = await timed_sleep(channel, "5")
        assert end == "DEFAULT_TIMEOUT_EXCEEDED"
        assert 0.35 < took < 1.5
        assert await unary(channel, "Sleep", b"0.05") == b"slept"
    assert probe.finished.count("Sleep") == 2  # the short sleeps; the long ones were cancelled
