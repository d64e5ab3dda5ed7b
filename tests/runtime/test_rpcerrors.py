"""The error decorators of sidecar_runtime.rpcerrors, on a real server, and both servicers' use of them.

A raw-bytes service with one method per shape raises, after what it sends first, an error of
its taxonomy, a bug, or aborts itself; the client sees the table's status, INTERNAL with an
ErrorInfo (logged once), or the method's own status, and the method's cleanup ran first.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agentsidecar.negotiator.v1 import negotiator_pb2
from agentsidecar.negotiator_service.servicer import NegotiatorServicer
from agentsidecar.seedstore.v1 import seedstore_pb2
from agentsidecar.seedstore_service.servicer import SeedStoreServicer
from agentsidecar.sidecar_runtime.richstatus import RichError, abort_with, decode_error
from agentsidecar.sidecar_runtime.rpcerrors import ErrorTable, stream_stream, unary_stream, unary_unary
from agentsidecar.sidecar_runtime.server import ServerOptions, start_server

SERVICE = "runtime.test.v1.Failing"
DOMAIN = "failing.test"


class Refused(Exception):
    """The test service's whole taxonomy."""


def refused_status(error: Refused) -> RichError:
    return RichError(grpc.StatusCode.FAILED_PRECONDITION, str(error), reason="REFUSED", domain=DOMAIN)


def internal_status(error: BaseException, operation: str) -> RichError:
    return RichError(
        grpc.StatusCode.INTERNAL,
        f"internal error in {operation}: {error}",
        reason="INTERNAL",
        domain=DOMAIN,
        metadata={"operation": operation},
    )


TABLE = ErrorTable(Refused, refused_status, internal_status)


def late(servicer: Failing, error: Refused, context: Any) -> RichError | None:
    """A refinement: "late" errors get a status of their own, others keep the table's."""
    if str(error) != "late":
        return None
    return RichError(grpc.StatusCode.DEADLINE_EXCEEDED, "late", reason=f"LATE_{servicer.name}", domain=DOMAIN)


async def fail(how: bytes, context: Any) -> None:
    if how in (b"refused", b"late"):
        raise Refused(how.decode())
    if how == b"own":
        await abort_with(context, RichError(grpc.StatusCode.NOT_FOUND, "mine", reason="OWN", domain=DOMAIN))
    raise ZeroDivisionError("a bug")


class Failing:
    name = "FAILING"

    def __init__(self) -> None:
        self.cleaned: list[str] = []

    @unary_unary(TABLE, refine=late)
    async def Unary(self, request: bytes, context: Any) -> bytes:
        await fail(request, context)
        return b"never"

    @unary_stream(TABLE, refine=late)
    async def Stream(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        try:
            yield b"first"
            await fail(request, context)
        finally:
            self.cleaned.append("Stream")

    @unary_stream(TABLE, refine=late)
    async def Write(self, request: bytes, context: Any) -> None:
        await context.write(b"first")
        await fail(request, context)

    @stream_stream(TABLE, refine=late)
    async def Bidi(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        try:
            async for request in requests:
                yield b"first"
                await fail(request, context)
        finally:
            self.cleaned.append("Bidi")

    def register(self, server: grpc.aio.Server) -> None:
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(self.Unary),
            "Stream": grpc.unary_stream_rpc_method_handler(self.Stream),
            "Write": grpc.unary_stream_rpc_method_handler(self.Write),
            "Bidi": grpc.stream_stream_rpc_method_handler(self.Bidi),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


async def call(channel: grpc.aio.Channel, name: str, how: bytes) -> tuple[list[bytes], grpc.aio.AioRpcError]:
    path = f"/{SERVICE}/{name}"
    received: list[bytes] = []

    async def run() -> None:
        if name == "Unary":
            received.append(await channel.unary_unary(path, None, None)(how))
        elif name == "Bidi":
            async for message in channel.stream_stream(path, None, None)(iter([how])):
                received.append(message)
        else:
            async for message in channel.unary_stream(path, None, None)(how):
                received.append(message)

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await run()
    return received, raised.value


@pytest.fixture
async def channel(socket_dir: Path) -> AsyncIterator[tuple[grpc.aio.Channel, Failing]]:
    failing = Failing()
    options = ServerOptions(listen=(f"unix:{socket_dir / 'f.sock'}",), grace_seconds=0)
    running = await start_server(failing.register, (SERVICE,), options)
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as opened:
            yield opened, failing
    finally:
        await running.stop()


SHAPES = ("Unary", "Stream", "Write", "Bidi")


@pytest.mark.parametrize("name", SHAPES)
async def test_a_taxonomy_error_leaves_with_the_tables_status(
    channel: tuple[grpc.aio.Channel, Failing], name: str
) -> None:
    opened, failing = channel
    received, error = await call(opened, name, b"refused")
    decoded = decode_error(error)
    assert (decoded.code, decoded.reason, decoded.domain) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "REFUSED",
        DOMAIN,
    )
    assert received == ([] if name == "Unary" else [b"first"])
    if name in ("Stream", "Bidi"):
        assert failing.cleaned == [name]  # the method's own cleanup ran before the status went out


@pytest.mark.parametrize("name", SHAPES)
async def test_a_bug_is_internal_with_error_info_and_logged_once(
    channel: tuple[grpc.aio.Channel, Failing], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    opened, _ = channel
    with caplog.at_level(logging.ERROR, logger=__name__):
        _, error = await call(opened, name, b"bug")
    decoded = decode_error(error)
    assert (decoded.code, decoded.reason) == (grpc.StatusCode.INTERNAL, "INTERNAL")
    assert decoded.metadata == {"operation": name}
    assert "a bug" in decoded.message
    logged = [r for r in caplog.records if r.name == __name__]
    assert [r.getMessage() for r in logged] == [f"{name} failed unexpectedly"]
    assert logged[0].exc_info is not None
    assert logged[0].exc_info[0] is ZeroDivisionError


@pytest.mark.parametrize("name", SHAPES)
async def test_a_status_the_method_sent_itself_and_a_refined_one_pass_unchanged(
    channel: tuple[grpc.aio.Channel, Failing], name: str
) -> None:
    opened, _ = channel
    _, own = await call(opened, name, b"own")
    assert (decode_error(own).code, decode_error(own).reason) == (grpc.StatusCode.NOT_FOUND, "OWN")
    _, refined = await call(opened, name, b"late")
    assert (decode_error(refined).code, decode_error(refined).reason) == (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "LATE_FAILING",
    )


@pytest.mark.parametrize(
    ("servicer", "service"),
    [
        (NegotiatorServicer, negotiator_pb2.DESCRIPTOR.services_by_name["NegotiatorService"]),
        (SeedStoreServicer, seedstore_pb2.DESCRIPTOR.services_by_name["SeedStoreService"]),
    ],
    ids=("negotiator", "seedstore"),
)
def test_every_rpc_of_both_services_maps_errors_by_a_decorator_only(servicer: type, service: Any) -> None:
    for method in service.methods:
        handler = getattr(servicer, method.name)
        assert handler.__code__.co_filename.endswith("rpcerrors.py"), f"{method.name} is not decorated"
        body = inspect.getsource(inspect.unwrap(handler))
        for mapping in ("except Exception", "except NegotiatorError", "abort_with(", "to_rich_error("):
            assert mapping not in body, f"{method.name} maps errors itself ({mapping})"
