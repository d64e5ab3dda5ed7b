"""Undecodable request bytes end in INVALID_ARGUMENT (MALFORMED_REQUEST), never UNKNOWN, on every method.

grpc.aio parses a request before any handler code runs; the runtime's
deserializers turn a parse failure into a marker its innermost layer answers.
The methods here parse real protobuf messages: health (unary and server
stream), reflection (bidirectional stream) and a typed test service.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from agentsidecar.sidecar_runtime import handlers
from agentsidecar.sidecar_runtime.auth import EnvToken
from agentsidecar.sidecar_runtime.handlers import RuntimeInterceptor
from agentsidecar.sidecar_runtime.richstatus import DecodedError, decode_error
from agentsidecar.sidecar_runtime.server import RunningServer, ServerOptions, start_server

UNDECODABLE = b"\xff\xff\xff\xff\x0f"  # a field tag whose number overflows: no message parses it
TYPED_SERVICE = "runtime.test.v1.Typed"
TYPED_CHECK = f"/{TYPED_SERVICE}/Check"
TYPED_WRITE = f"/{TYPED_SERVICE}/Write"
TYPED_COLLECT = f"/{TYPED_SERVICE}/Collect"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
HEALTH_REQUEST = "grpc.health.v1.HealthCheckRequest"


class Typed:
    """A service whose requests are HealthCheckRequest messages; it records what reached it."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def check(
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> health_pb2.HealthCheckResponse:
        self.seen.append(request.service)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def collect(
        self, requests: AsyncIterator[health_pb2.HealthCheckRequest], context: Any
    ) -> health_pb2.HealthCheckResponse:
        async for request in requests:
            self.seen.append(request.service)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    def register(self, server: grpc.aio.Server) -> None:
        def unary(behavior: Any) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.unary_unary_rpc_method_handler(
                behavior,
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
            )

        collect = grpc.stream_unary_rpc_method_handler(
            self.collect,
            request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
        )
        methods = {"Check": unary(self.check), "Write": unary(self.check), "Collect": collect}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(TYPED_SERVICE, methods),))


async def start_typed(socket_dir: Path, typed: Typed, **overrides: Any) -> RunningServer:
    options = ServerOptions(listen=(f"unix:{socket_dir / 'typed.sock'}",), grace_seconds=0.5, **overrides)
    return await start_server(
        typed.register, (TYPED_SERVICE,), options, read_methods={TYPED_CHECK, f"/{TYPED_SERVICE}/Collect"}
    )


async def refused(call: Any) -> DecodedError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return decode_error(caught.value)


def assert_malformed(error: DecodedError, method: str, message_type: str) -> None:
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT, error
    assert (error.domain, error.reason) == ("runtime.agentsidecar", "MALFORMED_REQUEST")
    assert error.metadata == {"method": method, "messageType": message_type}
    ((field, description),) = error.field_violations
    assert field == "request"
    assert message_type in description
    assert message_type in error.message


async def test_every_kind_of_method_answers_invalid_argument(socket_dir: Path) -> None:
    typed = Typed()
    server = await start_typed(socket_dir, typed)  # no options at all: the check is always there
    try:
        async with grpc.aio.insecure_channel(server.bound[0]) as channel:
            error = await refused(channel.unary_unary(TYPED_CHECK, None, None)(UNDECODABLE, timeout=5))
            assert_malformed(error, TYPED_CHECK, HEALTH_REQUEST)

            error = await refused(channel.unary_unary(HEALTH_CHECK, None, None)(UNDECODABLE, timeout=5))
            assert_malformed(error, HEALTH_CHECK, HEALTH_REQUEST)

            watch = channel.unary_stream(HEALTH_WATCH, None, None)(UNDECODABLE, timeout=5)
            error = await refused(watch.read())
            assert_malformed(error, HEALTH_WATCH, HEALTH_REQUEST)

            async def garbage() -> AsyncIterator[bytes]:
                yield UNDECODABLE

            reflection = channel.stream_stream(REFLECTION, None, None)(garbage(), timeout=5)
            error = await refused(reflection.read())
            assert_malformed(error, REFLECTION, "grpc.reflection.v1alpha.ServerReflectionRequest")

            # Well-formed requests still go through, and only they reached the servicer.
            valid = health_pb2.HealthCheckRequest(service="valid").SerializeToString()
            reply = await channel.unary_unary(TYPED_CHECK, None, None)(valid, timeout=5)
            assert (
                health_pb2.HealthCheckResponse.FromString(reply).status
                == health_pb2.HealthCheckResponse.SERVING
            )
        assert typed.seen == ["valid"]
    finally:
        await server.stop()


async def test_a_bad_message_in_a_request_stream_ends_the_call_where_it_is_read(socket_dir: Path) -> None:
    typed = Typed()
    server = await start_typed(socket_dir, typed)
    try:
        async with grpc.aio.insecure_channel(server.bound[0]) as channel:

            async def first_good_then_bad() -> AsyncIterator[bytes]:
                yield health_pb2.HealthCheckRequest(service="first").SerializeToString()
                yield UNDECODABLE
                yield health_pb2.HealthCheckRequest(service="never read").SerializeToString()

            call = channel.stream_unary(TYPED_COLLECT, None, None)(first_good_then_bad(), timeout=5)
            assert_malformed(await refused(call), TYPED_COLLECT, HEALTH_REQUEST)

            # Reflection answers the good request before it reaches the bad one.
            async def list_then_bad() -> AsyncIterator[bytes]:
                yield reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
                await asyncio.sleep(0.05)
                yield UNDECODABLE

            reflection = channel.stream_stream(REFLECTION, None, None)(list_then_bad(), timeout=5)
            answer = reflection_pb2.ServerReflectionResponse.FromString(await reflection.read())
            assert TYPED_SERVICE in {service.name for service in answer.list_services_response.service}
            error = await refused(reflection.read())
            assert_malformed(error, REFLECTION, "grpc.reflection.v1alpha.ServerReflectionRequest")
        assert typed.seen == ["first"]
    finally:
        await server.stop()


async def test_malformed_calls_are_logged_and_tokens_are_checked_first(
    socket_dir: Path, tmp_path: Path
) -> None:
    log_file = tmp_path / "calls.jsonl"
    typed = Typed()
    server = await start_typed(
        socket_dir,
        typed,
        call_log=str(log_file),
        tokens=EnvToken("TOKEN", (b"secret",)),
        open_reads=True,
        max_concurrent_calls=4,
        default_timeout=5.0,
    )
    try:
        async with grpc.aio.insecure_channel(server.bound[0]) as channel:
            write = channel.unary_unary(TYPED_WRITE, None, None)
            # A caller without the token learns nothing about what the method parses.
            error = await refused(write(UNDECODABLE, timeout=5))
            assert (error.code, error.reason) == (grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING")
            token = (("authorization", "Bearer secret"),)
            assert_malformed(
                await refused(write(UNDECODABLE, metadata=token, timeout=5)), TYPED_WRITE, HEALTH_REQUEST
            )
            assert_malformed(
                await refused(channel.unary_unary(TYPED_CHECK, None, None)(UNDECODABLE, timeout=5)),
                TYPED_CHECK,
                HEALTH_REQUEST,
            )
    finally:
        await server.stop()
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert sorted((r["method"], r["status"], r["error_reason"]) for r in records) == [
        ("Check", "INVALID_ARGUMENT", "MALFORMED_REQUEST"),
        ("Write", "INVALID_ARGUMENT", "MALFORMED_REQUEST"),
        ("Write", "UNAUTHENTICATED", "TOKEN_MISSING"),
    ]
    assert typed.seen == []


def test_message_type_is_read_from_the_deserializer() -> None:
    assert handlers.message_type(health_pb2.HealthCheckRequest.FromString) == HEALTH_REQUEST
    assert handlers.message_type(bytes) is None
    error = handlers.malformed_request("/a.B/C", None, ValueError("bad"))
    assert error.metadata == {"method": "/a.B/C"}
    assert "request message" in error.message


async def test_each_method_is_wrapped_once_not_per_call() -> None:
    async def echo(request: Any, context: Any) -> Any:
        return request

    registered = grpc.unary_unary_rpc_method_handler(
        echo, request_deserializer=health_pb2.HealthCheckRequest.FromString
    )
    other = grpc.unary_unary_rpc_method_handler(
        echo, request_deserializer=health_pb2.HealthCheckRequest.FromString
    )
    found: list[Any] = [registered]

    async def continuation(details: Any) -> Any:
        return found[0]

    class Details(grpc.HandlerCallDetails):
        method = TYPED_CHECK
        invocation_metadata = ()

    interceptor = RuntimeInterceptor()
    first = await interceptor.intercept_service(continuation, Details())
    again = await interceptor.intercept_service(continuation, Details())
    assert first is again
    assert first is not registered  # wrapped: its deserializer no longer raises
    assert first.request_deserializer is not None
    assert type(first.request_deserializer(UNDECODABLE)) is handlers.Undecodable
    found[0] = other  # a different inner handler (say, a refusal made per call) is wrapped anew
    assert await interceptor.intercept_service(continuation, Details()) is not first

    raw = grpc.unary_unary_rpc_method_handler(echo)  # bytes in, bytes out, no layers: nothing to add
    found[0] = raw
    assert await interceptor.intercept_service(continuation, Details()) is raw


async def test_the_health_only_listener_answers_invalid_argument_too(socket_dir: Path) -> None:
    typed = Typed()
    server = await start_typed(socket_dir, typed, health_listen=(f"unix:{socket_dir / 'health.sock'}",))
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket_dir / 'health.sock'}") as channel:
            error = await refused(channel.unary_unary(HEALTH_CHECK, None, None)(UNDECODABLE, timeout=5))
            assert_malformed(error, HEALTH_CHECK, HEALTH_REQUEST)
            valid = health_pb2.HealthCheckRequest(service="").SerializeToString()
            reply = await channel.unary_unary(HEALTH_CHECK, None, None)(valid, timeout=5)
            assert (
                health_pb2.HealthCheckResponse.FromString(reply).status
                == health_pb2.HealthCheckResponse.SERVING
            )
    finally:
        await server.stop()
