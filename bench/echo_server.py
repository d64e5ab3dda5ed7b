"""The baseline: one trivial unary gRPC method, served exactly like the sidecars.

`python bench/echo_server.py --listen ADDR` prints `READY echo <target>` once
serving. `/bench.Echo/Echo` returns the request bytes untouched: no protobuf
parsing, no application work, so its latency is the floor for one grpc.aio
round trip in Python on this machine. It is hosted by the sidecars' own
`start_server` (same options, health and reflection) so that the only
difference between baseline and subject is the subject's work.
"""

from __future__ import annotations

import argparse
import asyncio

import grpc

from agentsidecar.sidecar_runtime.server import ServerOptions, serve_until_signalled, start_server

ECHO_SERVICE = "bench.Echo"
ECHO_METHOD = f"/{ECHO_SERVICE}/Echo"


async def _echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


def _register(server: grpc.aio.Server) -> None:
    handler = grpc.method_handlers_generic_handler(
        ECHO_SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
    )
    server.add_generic_rpc_handlers((handler,))


async def _serve(listen: list[str]) -> None:
    running = await start_server(_register, (ECHO_SERVICE,), ServerOptions(listen=listen, grace_seconds=1.0))
    await serve_until_signalled(running, "echo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--listen", action="append", required=True, help="unix:PATH or HOST:PORT")
    args = parser.parse_args()
    asyncio.run(_serve(args.listen))


if __name__ == "__main__":
    main()
