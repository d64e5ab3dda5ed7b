"""`call_metadata(context)`: each call's own invocation metadata, read once by the runtime's interceptor."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from agentsidecar.sidecar_runtime.handlers import RuntimeInterceptor, call_metadata

KEY = "x-caller-mark"


async def _marks(request: bytes, context: Any) -> bytes:
    seen_first = [value for key, value in call_metadata(context) or () if key == KEY]
    await asyncio.sleep(0.01)  # other calls run meanwhile; what this one reads must stay its own
    seen_later = [value for key, value in call_metadata(context) or () if key == KEY]
    asked = [value for key, value in context.invocation_metadata() or () if key == KEY]
    # grpc builds a new tuple per context.invocation_metadata(); the interceptor's is one per call.
    kept = "kept" if call_metadata(context) is call_metadata(context) else "rebuilt"
    return "|".join([",".join(seen_first), ",".join(seen_later), ",".join(asked), kept]).encode()


async def _serve(interceptors: list[grpc.aio.ServerInterceptor]) -> tuple[grpc.aio.Server, str]:  # type: ignore[type-arg]
    server = grpc.aio.server(interceptors=interceptors)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Marks", {"Read": grpc.unary_unary_rpc_method_handler(_marks)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _read_concurrently(target: str, calls: int) -> list[str]:
    async with grpc.aio.insecure_channel(target) as channel:
        read = channel.unary_unary("/test.Marks/Read", None, None)
        answers = await asyncio.gather(
            *(read(b"", metadata=((KEY, f"call-{i}"),), timeout=5) for i in range(calls))
        )
    return [answer.decode() for answer in answers]


async def test_each_call_reads_its_own_metadata_while_calls_interleave() -> None:
    server, target = await _serve([RuntimeInterceptor()])
    try:
        answers = await _read_concurrently(target, 20)
        # No metadata at all is not "the previous call's metadata" either.
        async with grpc.aio.insecure_channel(target) as channel:
            bare = (await channel.unary_unary("/test.Marks/Read", None, None)(b"", timeout=5)).decode()
    finally:
        await server.stop(0)
    assert answers == [f"call-{i}|call-{i}|call-{i}|kept" for i in range(20)]
    assert bare == "|||kept"


async def test_without_the_runtime_interceptor_the_context_is_asked() -> None:
    server, target = await _serve([])
    try:
        answers = await _read_concurrently(target, 3)
    finally:
        await server.stop(0)
    assert answers == [f"call-{i}|call-{i}|call-{i}|rebuilt" for i in range(3)]
