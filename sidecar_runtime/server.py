"""Serving a sidecar: listeners, health, reflection and graceful shutdown.

Shutdown order (SIGTERM or SIGINT): health flips every service to
NOT_SERVING so probes and balancers stop sending, in-flight calls get
`grace_seconds` to finish while new calls are refused, then Unix socket files
are removed so a restarted sidecar binds a clean path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import _async as health_aio  # the public alias `health.aio` is invisible to mypy
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sidecar_runtime.addresses import Address, parse_address

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class DrainingHealthServicer(health_aio.HealthServicer):  # type: ignore[misc]
    """grpc.health.v1 whose Watch streams end once shutdown has begun.

    The stock servicer keeps every Watch open after NOT_SERVING, and an open
    stream counts as an in-flight call, so one watching probe would hold the
    whole drain for its full grace period. Here a watcher receives
    NOT_SERVING and then the stream ends normally (clients re-dial, as the
    health protocol tells them to).
    """

    async def Watch(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse],
    ) -> None:
        # Same bookkeeping as the parent's Watch (private attributes of
        # grpcio-health-checking 1.85), plus the early return.
        condition = self._server_watchers[request.service]
        self._watcher_count_by_service[request.service] += 1
        last_status = None
        try:
            async with condition:
                while True:
                    status = self._server_status.get(
                        request.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
                    )
                    if status != last_status:
                        await context.write(health_pb2.HealthCheckResponse(status=status))
                    last_status = status
                    if self._gracefully_shutting_down:
                        return
                    await condition.wait()
        finally:
            self._watcher_count_by_service[request.service] -= 1
            if self._watcher_count_by_service[request.service] == 0:
                del self._server_watchers[request.service]
                del self._watcher_count_by_service[request.service]


@dataclass(frozen=True, slots=True)
class ServerOptions:
    listen: Sequence[str]
    # Extra listeners serving only grpc.health.v1: Kubernetes' native gRPC
    # probes dial the pod IP, so the API can stay on a Unix socket while a
    # TCP port answers health only.
    health_listen: Sequence[str] = ()
    grace_seconds: float = 10.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_concurrent_rpcs: int | None = None
    unix_socket_mode: int = 0o660  # owner and group only: the socket is the access boundary


@dataclass(slots=True)
class RunningServer:
    server: grpc.aio.Server
    health: health_aio.HealthServicer
    health_only_server: grpc.aio.Server | None
    service_names: tuple[str, ...]
    addresses: tuple[Address, ...]
    bound: tuple[str, ...]  # dialable targets, with real ports for ":0"
    grace_seconds: float
    _stopped: bool = field(default=False)

    async def stop(self) -> None:
        """Flip health to NOT_SERVING, drain in-flight calls, remove sockets."""
        if self._stopped:
            return
        self._stopped = True
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.grace_seconds)
        if self.health_only_server is not None:
            await self.health_only_server.stop(0)
        for address in self.addresses:
            if address.unix_path is not None:
                with contextlib.suppress(FileNotFoundError):
                    address.unix_path.unlink()


async def start_server(
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    options: ServerOptions,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),  # type: ignore[type-arg]
) -> RunningServer:
    """Create, bind and start a grpc.aio server with health and reflection.

    `register` adds the application servicers. Raises OSError-like
    RuntimeError when an address cannot be bound (a TCP port clash fails
    fast: SO_REUSEPORT is off).
    """
    if not options.listen:
        raise ValueError("at least one listen address is required")
    addresses = tuple(parse_address(a) for a in options.listen)
    server = grpc.aio.server(
        interceptors=list(interceptors),
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", options.max_message_bytes),
            ("grpc.max_send_message_length", options.max_message_bytes),
        ],
        maximum_concurrent_rpcs=options.max_concurrent_rpcs,
    )
    register(server)
    health_servicer = DrainingHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    bound: list[str] = []
    for address in addresses:
        if address.unix_path is not None:
            address.unix_path.parent.mkdir(parents=True, exist_ok=True)
            if address.unix_path.is_socket():
                # A socket file left by a killed sidecar: nobody can be
                # listening on it if we are about to own this path.
                address.unix_path.unlink()
        try:
            port = server.add_insecure_port(address.target)
        except RuntimeError as err:
            raise RuntimeError(f"cannot listen on {address.target}: {err}") from err
        if address.unix_path is not None:
            bound.append(address.target)
        else:
            host = address.target.rpartition(":")[0]
            bound.append(f"{host}:{port}")
    health_only_server = None
    if options.health_listen:
        health_only_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_only_server)
        for text in options.health_listen:
            address = parse_address(text)
            health_only_server.add_insecure_port(address.target)
            addresses = (*addresses, address)
    await server.start()
    if health_only_server is not None:
        await health_only_server.start()
    for address in addresses:
        if address.unix_path is not None:
            os.chmod(address.unix_path, options.unix_socket_mode)
    for name in ("", *service_names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(
        server=server,
        health=health_servicer,
        health_only_server=health_only_server,
        service_names=tuple(service_names),
        addresses=addresses,
        bound=tuple(bound),
        grace_seconds=options.grace_seconds,
    )


async def serve_until_signalled(running: RunningServer, name: str) -> None:
    """Announce readiness, then run until SIGTERM/SIGINT and stop gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # One machine-readable line so launchers and tests learn the real ports.
    print(f"READY {name} {' '.join(running.bound)}", flush=True)
    print(f"{name}: serving on {', '.join(running.bound)}", file=sys.stderr, flush=True)
    await stop.wait()
    print(f"{name}: stopping (grace {running.grace_seconds:g}s)", file=sys.stderr, flush=True)
    await running.stop()
