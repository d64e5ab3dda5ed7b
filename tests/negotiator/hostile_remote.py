"""A remote adapter process that misbehaves in one chosen way, for the negotiator's registration tests.

    python hostile_remote.py --listen unix:PATH --mode MODE

Modes:
    huge-declaration   a valid declaration of about 4 MiB (accepted_settings of 4,000 1 KiB names)
    garbage            GetDeclaration answers bytes that are no GetDeclarationResponse
    long-refusal       a valid declaration; Invoke fails FAILED_PRECONDITION with 64 KiB of details
    throttled          a valid declaration; Invoke fails RESOURCE_EXHAUSTED (real throttling)

Prints `READY <address>` once serving; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

import grpc

from agentsidecar.adapter.v1 import adapter_pb2
from agentsidecar.common.v1 import common_pb2

SERVICE = "agentsidecar.adapter.v1.AdapterService"


def _declaration(mode: str) -> bytes:
    declaration = common_pb2.Declaration(shortname="hostile", kind=common_pb2.ADAPTER_KIND_AGENT_FRAMEWORK)
    if mode == "huge-declaration":
        declaration.accepted_settings.extend(f"s{i:04d}" + "x" * 1019 for i in range(4000))
    response = adapter_pb2.GetDeclarationResponse(declaration=declaration, contract_revision=1)
    return response.SerializeToString()


def _handler(mode: str) -> grpc.GenericRpcHandler[Any, Any]:
    declaration = b"\xff\xff\xff\xff garbage" if mode == "garbage" else _declaration(mode)

    async def get_declaration(request: bytes, context: Any) -> bytes:
        return declaration

    async def invoke(request: bytes, context: Any) -> bytes:
        if mode == "throttled":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota spent; slow down")
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "refused: " + "r" * 65536)
        return b""

    def raw(behaviour: Any) -> grpc.RpcMethodHandler[Any, Any]:
        return grpc.unary_unary_rpc_method_handler(behaviour)  # bytes in, bytes out

    return grpc.method_handlers_generic_handler(
        SERVICE, {"GetDeclaration": raw(get_declaration), "Invoke": raw(invoke), "Produce": raw(invoke)}
    )


async def serve(listen: str, mode: str) -> None:
    server = grpc.aio.server(
        handlers=[_handler(mode)], options=[("grpc.max_send_message_length", 16 * 1024 * 1024)]
    )
    port = server.add_insecure_port(listen)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"READY {listen if listen.startswith('unix:') else f'127.0.0.1:{port}'}", flush=True)
    await stop.wait()
    await server.stop(0.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument(
        "--mode", required=True, choices=("huge-declaration", "garbage", "long-refusal", "throttled")
    )
    args = parser.parse_args()
    asyncio.run(serve(args.listen, args.mode))


if __name__ == "__main__":
    main()
