"""`add_service` serves a servicer from its service descriptor, as the generated registration would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentsidecar.sidecar_runtime.server import add_service

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class ScriptedHealth(health_pb2_grpc.HealthServicer):  # type: ignore[misc]  # an untyped generated base
    """grpc.health.v1's unary and response-streaming methods; the base answers the rest UNIMPLEMENTED."""

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=SERVING if request.service == "known" else UNKNOWN)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        for status in (SERVING, NOT_SERVING):
            yield health_pb2.HealthCheckResponse(status=status)


async def test_each_method_of_the_descriptor_is_served_with_its_messages() -> None:
    server = grpc.aio.server()
    add_service(server, ScriptedHealth(), health_pb2.DESCRIPTOR.services_by_name["Health"])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            known = await stub.Check(health_pb2.HealthCheckRequest(service="known"), timeout=5)
            other = await stub.Check(health_pb2.HealthCheckRequest(service="other"), timeout=5)
            assert (known.status, other.status) == (SERVING, UNKNOWN)
            watched = [
                response.status
                async for response in stub.Watch(health_pb2.HealthCheckRequest(service="known"), timeout=5)
            ]
            assert watched == [SERVING, NOT_SERVING]
            with pytest.raises(grpc.aio.AioRpcError) as not_written:
                await stub.List(health_pb2.HealthListRequest(), timeout=5)
            assert not_written.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(0)


async def test_a_servicer_missing_methods_is_refused_by_name() -> None:
    class OnlyCheck:
        async def Check(self, request: Any, context: Any) -> Any:
            return None

    with pytest.raises(
        TypeError, match=r"^OnlyCheck does not implement grpc\.health\.v1\.Health: List, Watch$"
    ):
        add_service(grpc.aio.server(), OnlyCheck(), health_pb2.DESCRIPTOR.services_by_name["Health"])
