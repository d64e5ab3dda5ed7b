"""Serving a sidecar: listeners, health, reflection and graceful shutdown.

Shutdown order (SIGTERM or SIGINT): health flips every service to
NOT_SERVING so probes and balancers stop sending, in-flight calls get
`grace_seconds` to finish while new calls are refused, then Unix socket files
are removed so a restarted sidecar binds a clean path.

Interceptors, outermost first: OpenTelemetry (`otel`, see `tracing`), the runtime's own
(`handlers.RuntimeInterceptor`), then any the caller passes. The runtime's
interceptor wraps each method once in its layers, outermost first: the call
log and metrics (they see every refusal below them), bearer tokens, the
concurrent call limit, the default timeout, and the check that answers
undecodable request bytes with INVALID_ARGUMENT. Each layer is there only
when its option is set; the decode check always is.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import _async as health_aio  # the public alias `health.aio` is invisible to mypy
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from agentsidecar.sidecar_runtime.addresses import Address, parse_address
from agentsidecar.sidecar_runtime.auth import (
    TlsFiles,
    TokenCheck,
    TokenSource,
    check_token_transport,
    listener_credentials,
)
from agentsidecar.sidecar_runtime.handlers import Layer, RuntimeInterceptor
from agentsidecar.sidecar_runtime.lifecycle import announce
from agentsidecar.sidecar_runtime.limits import CallLimit, DefaultTimeout
from agentsidecar.sidecar_runtime.metrics import METRICS, MetricsEndpoint, start_metrics_endpoint
from agentsidecar.sidecar_runtime.observability import CallLog, CallObserver, open_call_log
from agentsidecar.sidecar_runtime.tracing import Tracing, start_tracing

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# A listening socket accepts a connect at once (the kernel queues it); the
# timeout only bounds a backlog that is full.
_SOCKET_PROBE_SECONDS = 1.0


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
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # both directions
    max_concurrent_calls: int | None = None  # None: unlimited
    default_timeout: float | None = None  # seconds, for unary-response calls sent without a deadline
    unix_socket_mode: int = 0o660  # owner and group only: the socket is the access boundary
    tokens: TokenSource | None = None  # required on every method but health, reflection and open reads
    open_reads: bool = False  # with tokens: the read methods start_server is given need none
    tls: TlsFiles | None = None  # TCP listeners only; health-only listeners stay plaintext
    call_log: str | None = None  # "-" for stderr, a file path, or None for no call log
    metrics_listen: str | None = None  # HOST:PORT of the Prometheus endpoint
    otel: bool = False


@dataclass(slots=True)
class RunningServer:
    server: grpc.aio.Server
    health: health_aio.HealthServicer
    health_only_server: grpc.aio.Server | None
    service_names: tuple[str, ...]
    addresses: tuple[Address, ...]
    bound: tuple[str, ...]  # dialable targets, with real ports for ":0"
    grace_seconds: float
    metrics_bound: str | None = None  # HOST:PORT of the metrics endpoint, with its real port
    call_log: CallLog | None = None
    metrics_endpoint: MetricsEndpoint | None = None
    tracing: Tracing | None = None
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
        if self.metrics_endpoint is not None:
            await self.metrics_endpoint.close()
        if self.call_log is not None:
            await self.call_log.close()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.flush)  # exports the spans still queued


def build_layers(
    options: ServerOptions,
    read_methods: Collection[str],
    call_log: CallLog | None,
    bounded_streams: Collection[str] = (),
) -> tuple[CallObserver | None, TokenCheck | None, list[Layer]]:
    """The runtime's layers for `options`, outermost first, with the two the interceptor also needs.

    `bounded_streams` (full method names) are server streams that end by themselves, which the
    default deadline bounds as it does unary calls.
    """
    layers: list[Layer] = []
    observer = None
    if call_log is not None or options.metrics_listen is not None:
        observer = CallObserver(call_log, METRICS if options.metrics_listen is not None else None)
        layers.append(observer)
    token_check = None
    if options.tokens is not None:
        token_check = TokenCheck(options.tokens, read_methods if options.open_reads else ())
        layers.append(token_check)
    if options.max_concurrent_calls is not None:
        layers.append(CallLimit(options.max_concurrent_calls))
    if options.default_timeout is not None:
        layers.append(DefaultTimeout(options.default_timeout, bounded_streams))
    return observer, token_check, layers


def build_interceptors(
    options: ServerOptions,
    read_methods: Collection[str],
    call_log: CallLog | None,
    tracing: Tracing | None = None,
    bounded_streams: Collection[str] = (),
) -> list[grpc.aio.ServerInterceptor]:  # type: ignore[type-arg]
    """The runtime's interceptors for `options`, outermost first: OpenTelemetry, then the runtime's own."""
    chain: list[grpc.aio.ServerInterceptor] = []  # type: ignore[type-arg]
    if tracing is not None:
        chain.append(tracing.interceptor)
    observer, token_check, layers = build_layers(options, read_methods, call_log, bounded_streams)
    chain.append(
        RuntimeInterceptor(
            layers,
            on_unknown=observer.unknown if observer is not None else None,
            sync_refusal=token_check,
            message_counts=observer.message_counts if observer is not None else None,
        )
    )
    return chain


_HANDLER_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_service(server: grpc.aio.Server, servicer: object, service: ServiceDescriptor) -> None:
    """Serve every method of `service` from the like-named method of `servicer`, as a generic handler.

    What the generated `add_*Servicer_to_server` does, minus its second
    registration of each method with `add_registered_method_handlers`,
    which adds work to every unary call grpc.aio's server runs behind an
    interceptor (`bench/count_instructions.py` measures it). The handlers
    are the same: the
    generated message classes' FromString and SerializeToString. A
    servicer lacking a method raises TypeError (subclass the generated
    `*Servicer` base to answer UNIMPLEMENTED for the methods you leave out).
    """
    missing = [
        method.name for method in service.methods if not callable(getattr(servicer, method.name, None))
    ]
    if missing:
        raise TypeError(
            f"{type(servicer).__name__} does not implement {service.full_name}: {', '.join(missing)}"
        )
    handlers = {}
    for method in service.methods:
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        make_handler = _HANDLER_FACTORIES[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = make_handler(
            getattr(servicer, method.name),
            request_deserializer=request_class.FromString,
            response_serializer=response_class.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


@contextlib.contextmanager
def _socket_mode(mode: int) -> Iterator[None]:
    """Create socket files with `mode` from the start, not only after the chmod that follows start()."""
    previous = os.umask(0o777 & ~mode)
    try:
        yield
    finally:
        os.umask(previous)


def _bind(server: grpc.aio.Server, address: Address, credentials: grpc.ServerCredentials | None) -> int:
    try:
        if credentials is None:
            return server.add_insecure_port(address.target)
        return server.add_secure_port(address.target, credentials)
    except RuntimeError as err:
        raise RuntimeError(f"cannot listen on {address.target}: {err}") from err


async def start_server(
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    options: ServerOptions,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),  # type: ignore[type-arg]
    read_methods: Collection[str] = (),
    call_log: CallLog | None = None,
    name: str | None = None,
    bounded_streams: Collection[str] = (),
) -> RunningServer:
    """Create, bind and start a grpc.aio server with health and reflection.

    `register` adds the application servicers. When `options.tokens` is
    set, every method needs a bearer token but health, reflection and, with
    `options.open_reads`, `read_methods` (full names, `/pkg.Service/Method`:
    methods that read state and run nothing). `call_log`, when given, is the already open writer for
    `options.call_log` (a service that writes its own lines to the same
    stream shares it, so lines keep their order); the server owns it from
    then on and closes it when it stops or fails to start. `name` (say
    "negotiator") is the OpenTelemetry service name `otel` defaults to; else
    the first of `service_names`, else "sidecar". `bounded_streams` are server streams
    (full names) that `options.default_timeout` bounds like unary calls: brokered calls
    that stream their progress, unlike watches, end by themselves.

    Raises RuntimeError when an address cannot be bound (a TCP port
    clash fails fast: SO_REUSEPORT is off; SocketInUseError for a Unix
    socket another process serves on), TracingConfigError (a
    RuntimeError) when `otel` cannot work as configured, and ValueError (AuthConfigError) for auth
    options that cannot work, such as tokens on a plaintext non-loopback
    TCP listener.
    """
    try:
        if not options.listen:
            raise ValueError("at least one listen address is required")
        addresses = tuple(parse_address(a) for a in options.listen)
        health_addresses = tuple(parse_address(a) for a in options.health_listen)
        tls = options.tls.server_credentials() if options.tls is not None else None
        if options.tokens is not None:
            check_token_transport(addresses, tls=tls is not None)
    except BaseException:
        if call_log is not None:
            await call_log.close()
        raise
    if call_log is None and options.call_log is not None:
        call_log = open_call_log(options.call_log)
    metrics_endpoint: MetricsEndpoint | None = None
    tracing: Tracing | None = None
    try:
        if options.otel:
            tracing = start_tracing(name or next(iter(service_names), "sidecar"))
        chain = build_interceptors(options, read_methods, call_log, tracing, bounded_streams)
        server = grpc.aio.server(
            interceptors=[*chain, *interceptors],
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", options.max_message_bytes),
                ("grpc.max_send_message_length", options.max_message_bytes),
            ],
        )
        register(server)
        health_servicer = DrainingHealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (
                *service_names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        bound: list[str] = []
        for address in addresses:
            credentials = listener_credentials(address, tls=tls, tokens=options.tokens is not None)
            if address.unix_path is not None:
                _prepare_socket_path(address.unix_path)
                with _socket_mode(options.unix_socket_mode):
                    _bind(server, address, credentials)
                bound.append(address.target)
            else:
                port = _bind(server, address, credentials)
                host = address.target.rpartition(":")[0]
                bound.append(f"{host}:{port}")
        health_only_server = None
        if health_addresses:
            # Plaintext and uninstrumented (kubelet gRPC probes speak neither TLS nor tokens),
            # with only the check that answers undecodable requests INVALID_ARGUMENT.
            health_only_server = grpc.aio.server(
                interceptors=[RuntimeInterceptor()], options=[("grpc.so_reuseport", 0)]
            )
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_only_server)
            for address in health_addresses:
                if address.unix_path is not None:
                    _prepare_socket_path(address.unix_path)
                    with _socket_mode(options.unix_socket_mode):
                        _bind(health_only_server, address, None)
                else:
                    _bind(health_only_server, address, None)
        if options.metrics_listen is not None:
            metrics_endpoint = start_metrics_endpoint(options.metrics_listen)
        await server.start()
        if health_only_server is not None:
            await health_only_server.start()
    except BaseException:
        if metrics_endpoint is not None:
            await metrics_endpoint.close()
        if call_log is not None:
            await call_log.close()
        if tracing is not None:
            tracing.flush()
        raise
    all_addresses = (*addresses, *health_addresses)
    for address in all_addresses:
        if address.unix_path is not None:
            os.chmod(address.unix_path, options.unix_socket_mode)
    for name in ("", *service_names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(
        server=server,
        health=health_servicer,
        health_only_server=health_only_server,
        service_names=tuple(service_names),
        addresses=all_addresses,
        bound=tuple(bound),
        grace_seconds=options.grace_seconds,
        metrics_bound=metrics_endpoint.bound if metrics_endpoint is not None else None,
        call_log=call_log,
        metrics_endpoint=metrics_endpoint,
        tracing=tracing,
    )


class SocketInUseError(RuntimeError):
    """A Unix socket path another live process is serving on."""


def _prepare_socket_path(path: Path) -> None:
    """Make way for a socket at `path`: replace a stale socket file, never a live one.

    A socket file whose connect is refused is left by a process that is gone
    (a killed sidecar), and is removed. One that accepts a connection, or
    whose backlog is full, belongs to a running server: grpc's bind unlinks
    an existing socket file itself, which would leave that server running
    but unreachable, so start-up fails instead. So it does when the probe
    cannot tell (permission denied): only a refused connect proves the path
    stale.

    Raises:
        SocketInUseError: something serves on `path`, or the probe cannot tell.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_socket():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(_SOCKET_PROBE_SECONDS)
        probe.connect(os.fspath(path))
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    except TimeoutError:
        pass  # a full backlog: a live server
    except OSError as exc:
        raise SocketInUseError(
            f"cannot listen on unix:{path}: cannot tell whether another process serves on it "
            f"({exc.strerror or exc}); remove the file if it is stale, or choose another --listen path"
        ) from exc
    finally:
        probe.close()
    raise SocketInUseError(
        f"cannot listen on unix:{path}: another process is serving on it; stop it first, or "
        "choose another --listen path"
    )


def settle_heap() -> None:
    """Exempt everything start-up built from the cyclic garbage collector's later passes.

    A sidecar's start-up heap (modules, config, adapters, caches: tens of
    thousands of objects) lives as long as the process, yet every full
    collection walks all of it again, stalling every call in flight.
    `gc.freeze()` moves those objects to the permanent generation, which
    collections skip. No collection runs first: start-up leaves next to no
    cyclic garbage, and a cycle frozen by mistake costs memory once, never
    time per call.
    Reference counting still frees frozen objects that are dropped.
    """
    gc.freeze()


def announce_metrics(running: RunningServer, name: str, writers: Sequence[CallLog | None] = ()) -> None:
    """Tell the operator (and tests, for port 0) where the metrics are served."""
    if running.metrics_bound is not None:
        url = f"http://{running.metrics_bound}/metrics"
        announce("metrics", name, (*writers, running.call_log), url=url)


async def serve_until_signalled(running: RunningServer, name: str) -> None:
    """Announce readiness, then run until SIGTERM/SIGINT and stop gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    settle_heap()
    # One machine-readable line so launchers and tests learn the real ports.
    print(f"READY {name} {' '.join(running.bound)}", flush=True)
    announce("serving", name, (running.call_log,), addresses=list(running.bound))
    announce_metrics(running, name)
    await stop.wait()
    announce("draining", name, (running.call_log,), grace_seconds=running.grace_seconds)
    await running.stop()
    announce("stopped", name)
