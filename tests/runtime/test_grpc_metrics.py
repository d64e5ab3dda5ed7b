"""The grpc-ecosystem call metrics, scraped from `/metrics` over HTTP after real calls.

Names, labels and label values are those go-grpc-prometheus writes, so
dashboards made for it apply: `grpc_type`, `grpc_server_started_total`,
`grpc_server_handled_total` with grpc-go's code names, the stream message
counters and the `grpc_server_handling_seconds` histogram. One server here
serves a method of each of the four shapes; a real `seedstore serve` process
shows VerifySeeds and its `seedstore_verification_duration_seconds`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentsidecar.seedstore.v1 import seedstore_pb2 as spb
from agentsidecar.seedstore.v1 import seedstore_pb2_grpc
from agentsidecar.sidecar_runtime.metrics import GO_CODE_NAMES
from agentsidecar.sidecar_runtime.richstatus import RichError, abort_with
from agentsidecar.sidecar_runtime.server import ServerOptions, start_server
from tests.procs import start_process, stop_process

SHAPES = "runtime.test.v1.Shapes"
SEEDSTORE = "agentsidecar.seedstore.v1.SeedStoreService"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(address: str) -> tuple[str, Samples]:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://{address}/metrics", timeout=5)
    assert response.status_code == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return response.text, samples


def labels(**values: str) -> frozenset[tuple[str, str]]:
    return frozenset(values.items())


async def unary(request: bytes, context: Any) -> bytes:
    if request == b"bad":
        await abort_with(
            context,
            RichError(grpc.StatusCode.INVALID_ARGUMENT, "bad", reason="BAD", domain="probe.test"),
        )
    return request


async def client_stream(requests: AsyncIterator[bytes], context: Any) -> bytes:
    return b"".join([request async for request in requests])


async def server_stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
    for number in range(int(request)):
        yield str(number).encode()


async def bidi_stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request + request


def register(server: grpc.aio.Server) -> None:
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "BidiStream": grpc.stream_stream_rpc_method_handler(bidi_stream),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SHAPES, handlers),))


async def messages(*items: bytes) -> AsyncIterator[bytes]:
    for item in items:
        yield item


@pytest.mark.slow
async def test_calls_of_every_shape_are_counted_as_go_grpc_prometheus_counts_them(socket_dir: Path) -> None:
    options = ServerOptions(listen=(f"unix:{socket_dir / 'shapes.sock'}",), metrics_listen="127.0.0.1:0")
    server = await start_server(register, (SHAPES,), options)
    try:
        assert server.metrics_bound is not None
        _, before = await scrape(server.metrics_bound)
        async with grpc.aio.insecure_channel(server.bound[0]) as channel:
            call_unary = channel.unary_unary(f"/{SHAPES}/Unary", None, None)
            assert await call_unary(b"x", timeout=5) == b"x"
            assert await call_unary(b"y", timeout=5) == b"y"
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await call_unary(b"bad", timeout=5)
            assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            joined = await channel.stream_unary(f"/{SHAPES}/ClientStream", None, None)(
                messages(b"a", b"b", b"c"), timeout=5
            )
            assert joined == b"abc"
            streamed = channel.unary_stream(f"/{SHAPES}/ServerStream", None, None)(b"4", timeout=5)
            assert [message async for message in streamed] == [b"0", b"1", b"2", b"3"]
            echoed = channel.stream_stream(f"/{SHAPES}/BidiStream", None, None)(
                messages(b"p", b"q"), timeout=5
            )
            assert [message async for message in echoed] == [b"pp", b"qq"]
            # A stream the client cancels after one message: counted as grpc-go names it.
            cancelled = channel.unary_stream(f"/{SHAPES}/ServerStream", None, None)(b"1000000", timeout=5)
            assert await cancelled.read() == b"0"
            cancelled.cancel()
        text, after = await scrape(server.metrics_bound)
    finally:
        await server.stop()

    def delta(name: str, **label_values: str) -> float:
        key = (name, labels(**label_values))
        return after.get(key, 0.0) - before.get(key, 0.0)

    def of(kind: str, method: str) -> dict[str, str]:
        return {"grpc_type": kind, "grpc_service": SHAPES, "grpc_method": method}

    unary_labels = of("unary", "Unary")
    assert delta("grpc_server_started_total", **unary_labels) == 3
    assert delta("grpc_server_handled_total", **unary_labels, grpc_code="OK") == 2
    assert delta("grpc_server_handled_total", **unary_labels, grpc_code="InvalidArgument") == 1
    assert delta("grpc_server_msg_received_total", **unary_labels) == 3  # one request per call
    assert delta("grpc_server_msg_sent_total", **unary_labels) == 2  # a response per call that ended OK
    assert delta("grpc_server_handling_seconds_count", **unary_labels) == 3
    assert delta("grpc_server_handling_seconds_bucket", **unary_labels, le="+Inf") == 3

    client_labels = of("client_stream", "ClientStream")
    assert delta("grpc_server_started_total", **client_labels) == 1
    assert delta("grpc_server_handled_total", **client_labels, grpc_code="OK") == 1
    assert delta("grpc_server_msg_received_total", **client_labels) == 3
    assert delta("grpc_server_msg_sent_total", **client_labels) == 1

    server_labels = of("server_stream", "ServerStream")
    assert delta("grpc_server_started_total", **server_labels) == 2
    assert delta("grpc_server_handled_total", **server_labels, grpc_code="OK") == 1
    assert delta("grpc_server_handled_total", **server_labels, grpc_code="Canceled") == 1
    assert delta("grpc_server_msg_received_total", **server_labels) == 2
    assert delta("grpc_server_msg_sent_total", **server_labels) >= 5  # 4, then at least 1 before the cancel

    bidi_labels = of("bidi_stream", "BidiStream")
    assert delta("grpc_server_started_total", **bidi_labels) == 1
    assert delta("grpc_server_handled_total", **bidi_labels, grpc_code="OK") == 1
    assert delta("grpc_server_msg_received_total", **bidi_labels) == 2
    assert delta("grpc_server_msg_sent_total", **bidi_labels) == 2
    assert delta("grpc_server_handling_seconds_count", **bidi_labels) == 1

    assert after[("grpc_server_calls_in_flight", labels())] == 0
    for name in ("started", "handled", "msg_received", "msg_sent"):
        assert f"# TYPE grpc_server_{name}_total counter" in text
    assert "# TYPE grpc_server_handling_seconds histogram" in text
    codes = {dict(key)["grpc_code"] for name, key in after if name == "grpc_server_handled_total"}
    assert codes <= set(GO_CODE_NAMES.values())  # never grpc-python's CANCELLED / INVALID_ARGUMENT
    kinds = {dict(key)["grpc_type"] for name, key in after if name == "grpc_server_started_total"}
    assert kinds <= {"unary", "client_stream", "server_stream", "bidi_stream", "unknown"}


def test_code_names_are_grpc_gos() -> None:
    assert set(GO_CODE_NAMES) == {code.name for code in grpc.StatusCode}
    assert GO_CODE_NAMES["CANCELLED"] == "Canceled"
    assert all(re.fullmatch(r"OK|[A-Z][a-z]+(?:[A-Z][a-z]+)*", name) for name in GO_CODE_NAMES.values())


# --- a real seedstore process: VerifySeeds ------------------------------------------------------


@pytest.fixture
def seedstore(socket_dir: Path, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`seedstore serve` with metrics on; its API target and its metrics address."""
    target = f"unix:{socket_dir / 'seedstore.sock'}"
    process, _ = start_process(
        [
            *(sys.executable, "-m", "agentsidecar.seedstore_service.cli", "serve", "--listen", target),
            *("--metrics-listen", "127.0.0.1:0", "--no-call-log"),
        ],
        env={"SKILLSPEC_HOME": str(tmp_path / "home")},
    )
    try:
        assert process.stderr is not None
        address = None
        while address is None:
            line = process.stderr.readline()
            assert line, "the seedstore exited before announcing its metrics"
            if '"event":"sidecar.metrics"' in line:
                address = json.loads(line)["url"].removeprefix("http://").removesuffix("/metrics")
        yield target, address
    finally:
        stop_process(process)


@pytest.mark.slow
async def test_verify_seeds_records_calls_messages_and_each_seeds_verification(
    seedstore: tuple[str, str],
) -> None:
    target, metrics = seedstore
    async with grpc.aio.insecure_channel(target) as channel:
        stub = seedstore_pb2_grpc.SeedStoreServiceStub(channel)
        # Any passing check verifies a seed (SkillSpec's rule): "fails" has none.
        for seed_id, command in (("passes", "true"), ("fails", "agentsidecar-no-such-program")):
            await stub.AddSeed(
                spb.AddSeedRequest(
                    id=seed_id,
                    domain="misc",
                    kind="cli",
                    command=command,
                    provides=["x"],
                    evidence_commands=[command],
                ),
                timeout=10,
            )
        events = [
            event
            async for event in stub.VerifySeeds(spb.VerifySeedsRequest(ids=["passes", "fails"]), timeout=30)
        ]
    _, samples = await scrape(metrics)

    verify = {"grpc_type": "server_stream", "grpc_service": SEEDSTORE, "grpc_method": "VerifySeeds"}
    assert samples[("grpc_server_started_total", labels(**verify))] == 1
    assert samples[("grpc_server_handled_total", labels(**verify, grpc_code="OK"))] == 1
    assert samples[("grpc_server_msg_received_total", labels(**verify))] == 1
    assert samples[("grpc_server_msg_sent_total", labels(**verify))] == len(events)
    add = {"grpc_type": "unary", "grpc_service": SEEDSTORE, "grpc_method": "AddSeed"}
    assert samples[("grpc_server_handled_total", labels(**add, grpc_code="OK"))] == 2
    for status in ("verified", "failed"):
        assert samples[("seedstore_verification_duration_seconds_count", labels(status=status))] == 1
        assert samples[("seedstore_verification_duration_seconds_sum", labels(status=status))] > 0
    assert ("seedstore_verification_duration_seconds_count", labels(status="unverified")) not in samples
