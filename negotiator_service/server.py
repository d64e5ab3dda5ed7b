"""The negotiator process: config → adapters → registry → broker → gRPC server.

Start-up is all or nothing: a config error (including a config that widens an
adapter's declaration) or an adapter that cannot be built stops start-up with
a ConfigError naming the adapter and the field, before anything listens.
Health turns SERVING only once every config adapter is built and the runtime
registrations kept in the state directory are re-established
(registrations.py: one whose remote is down is kept, NOT_SERVING; an
unreadable file is reported and set aside, never stopping start-up).
Every remote adapter then checks its remote every `adapter_refresh_seconds`.

Shutdown (SIGTERM/SIGINT): open WatchAdapters streams end with UNAVAILABLE,
health flips to NOT_SERVING, in-flight calls get `grace_seconds` to finish
while new ones are refused, socket files are removed, then every adapter is
closed.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc

from agentsidecar.negotiator.v1 import negotiator_pb2
from agentsidecar.negotiator_service.adapters import build_adapters
from agentsidecar.negotiator_service.audit import DEFAULT_WATCH_QUEUE_SIZE, AuditLog
from agentsidecar.negotiator_service.bootstrap import Bootstrapper, GrpcSeedSource
from agentsidecar.negotiator_service.broker import Broker
from agentsidecar.negotiator_service.call_caches import CallCaches
from agentsidecar.negotiator_service.config import (
    EMBEDDED_CONFIG_PATH,
    EMBEDDED_DEFAULT_CONFIG,
    NegotiatorConfig,
    load_negotiator_config,
)
from agentsidecar.negotiator_service.conversations import (
    ConversationManager,
    ConversationStore,
    default_state_dir,
)
from agentsidecar.negotiator_service.errors import AdapterRegistrationFailed, ConfigError
from agentsidecar.negotiator_service.model import Adapter, AdapterSpec
from agentsidecar.negotiator_service.prober import Prober
from agentsidecar.negotiator_service.registrations import (
    RegistrationStore,
    RuntimeRegistrations,
    StoredRegistration,
)
from agentsidecar.negotiator_service.registry import (
    DEFAULT_REFRESH_SECONDS,
    AdapterRegistry,
    RegisteredAdapter,
)
from agentsidecar.negotiator_service.servicer import (
    DEFAULT_DEADLINE_MARGIN_SECONDS,
    SERVICE_NAME,
    NegotiatorServicer,
    check_adapter_target,
    normal_host,
)
from agentsidecar.sidecar_runtime.addresses import parse_address
from agentsidecar.sidecar_runtime.lifecycle import announce
from agentsidecar.sidecar_runtime.observability import CallLog, open_call_log
from agentsidecar.sidecar_runtime.server import (
    RunningServer,
    ServerOptions,
    add_service,
    announce_metrics,
    settle_heap,
    start_server,
)

DEFAULT_GRACE_SECONDS = 10.0
# With a token configured (`--token-file`/`--token-env`) every method needs it;
# `--open-reads` leaves these open: they read declarations and run no adapter.
# Bootstrap is here for its candidates; with `run` set it executes a seed's
# command, and the servicer asks for the token itself. RegisterAdapter and
# DeregisterAdapter (writes), Produce, Invoke, their streams and ToolSession (run adapters)
# and WatchAudit (its records carry callers and conversation ids) always
# need it.
READ_METHODS = frozenset(
    f"/{SERVICE_NAME}/{method}"
    for method in ("ListAdapters", "GetAdapter", "WatchAdapters", "Negotiate", "Bootstrap")
)

# Brokered calls that stream their progress end by themselves: `--default-timeout` bounds them
# as it bounds Produce and Invoke.
BOUNDED_STREAMS = frozenset(f"/{SERVICE_NAME}/{method}" for method in ("ProduceStream", "InvokeStream"))


@dataclass(frozen=True, slots=True)
class Settings:
    listen: Sequence[str]
    config_path: Path | None = None  # None: the embedded default config
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    deadline_margin: float = DEFAULT_DEADLINE_MARGIN_SECONDS
    # Auth, limits and observability (agentsidecar.sidecar_runtime.serve_args); `listen`
    # and `grace_seconds` above take precedence over the same fields here.
    server_options: ServerOptions | None = None
    # The seedstore Bootstrap searches (unix:PATH or HOST:PORT); None: Bootstrap is refused.
    seedstore_target: str | None = None
    # The bearer token sent to that seedstore (a file holding it, as its --token-file); None: none.
    seedstore_token_file: Path | None = None
    # Where conversations and runtime registrations are kept; None: conversations.default_state_dir().
    state_dir: Path | None = None
    # The JSON-lines audit log (appended); None: audit records go to WatchAudit only.
    audit_log: Path | None = None
    # How many records a WatchAudit stream may fall behind before it is dropped.
    audit_watch_queue: int = DEFAULT_WATCH_QUEUE_SIZE
    # Decision records to stderr through a batched writer (`negotiator serve`),
    # rather than through the logging module (the default, for embedding).
    decisions_to_stderr: bool = False
    # TCP hosts RegisterAdapter may reach besides Unix sockets and loopback ("*": any).
    adapter_hosts: Sequence[str] = ()
    # How often each remote adapter's health and declaration are checked.
    adapter_refresh_seconds: float = DEFAULT_REFRESH_SECONDS


@dataclass(slots=True)
class RunningNegotiator:
    """A started negotiator: the gRPC server plus what it serves."""

    running: RunningServer
    registry: AdapterRegistry
    broker: Broker
    servicer: NegotiatorServicer
    bootstrapper: Bootstrapper | None = None
    decision_log: CallLog | None = None  # closed here when the server does not own it
    registrations: RuntimeRegistrations | None = None
    prober: Prober | None = None  # runs the config's `probe:` schedule, and ProbeAdapter
    # What restoring the runtime registrations met at start-up (each also logged).
    registration_problems: Sequence[str] = ()
    _stopped: bool = field(default=False)

    @property
    def bound(self) -> tuple[str, ...]:
        """Dialable targets, with real ports for ":0"."""
        return self.running.bound

    @property
    def grace_seconds(self) -> float:
        return self.running.grace_seconds

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.servicer.begin_shutdown()
        try:
            if self.prober is not None:
                await self.prober.close()
            await self.running.stop()
        finally:
            try:
                if self.registrations is not None:
                    await self.registrations.close()
                await self.registry.close()
            finally:
                try:
                    if self.bootstrapper is not None:
                        await self.bootstrapper.close()
                finally:
                    self.broker.audit.close()
                    if self.decision_log is not None:
                        await self.decision_log.close()


def read_config(config_path: Path | None) -> tuple[AdapterSpec, ...]:
    """The adapter specs of the config file, or of the embedded default."""
    return read_negotiator_config(config_path).adapters


def read_negotiator_config(config_path: Path | None) -> NegotiatorConfig:
    """The whole config file (adapters, profiles, limits), or the embedded default."""
    if config_path is None:
        return load_negotiator_config(EMBEDDED_DEFAULT_CONFIG, EMBEDDED_CONFIG_PATH)
    try:
        text = config_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {config_path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config {config_path}: not UTF-8 text ({exc.reason})") from exc
    return load_negotiator_config(text, str(config_path))


async def _connect_remote(target: str, expected_shortname: str) -> Adapter:
    """`adapters.remote.connect_remote`, its module imported at the first runtime registration."""
    from agentsidecar.negotiator_service.adapters.remote import connect_remote

    return await connect_remote(target, expected_shortname)


async def create_server(
    settings: Settings,
    *,
    connect: Callable[[str, str], Awaitable[Adapter]] = _connect_remote,
    conversation_store: ConversationStore | None = None,
) -> RunningNegotiator:
    """Load the config, build its adapters and start serving.

    Conversations are kept in `conversation_store` (default: a store on
    `settings.state_dir`, else `conversations.default_state_dir()`; the
    directory is created on the first conversation), and runtime
    registrations in the same directory, re-established here.

    The config's `profiles`, `limits.max_depth` and `mcp` go to the broker, and
    every decision to an AuditLog on `settings.audit_log` (closed on stop).

    Raises ConfigError for a bad config (nothing is left running),
    RuntimeError when an address cannot be bound, and ValueError for a
    malformed `seedstore_target` or an audit log that cannot be opened.
    """
    if settings.seedstore_target is not None:
        parse_address(settings.seedstore_target)  # before anything is built
    config = read_negotiator_config(settings.config_path)
    audit = AuditLog(settings.audit_log, queue_size=settings.audit_watch_queue)
    try:
        adapters = await build_adapters(config.adapters)
    except BaseException:
        audit.close()
        raise
    registry = AdapterRegistry(refresh_seconds=settings.adapter_refresh_seconds)
    for adapter in adapters:
        registry.add(RegisteredAdapter(adapter=adapter, source="config"))
    store = conversation_store or ConversationStore(settings.state_dir or default_state_dir())
    registrations = RuntimeRegistrations(registry, RegistrationStore(store.directory))
    allowed_hosts = frozenset(normal_host(host) for host in settings.adapter_hosts)

    async def restore(stored: StoredRegistration) -> RegisteredAdapter:
        try:
            address = parse_address(stored.target)
        except ValueError as exc:
            raise AdapterRegistrationFailed(stored.target, str(exc), stored.shortname) from exc
        check_adapter_target(address, allowed_hosts)  # the operator may have withdrawn the host
        from agentsidecar.negotiator_service.adapters.remote import restore_remote

        adapter = await restore_remote(address.target, stored.shortname, stored.declaration_response)
        return RegisteredAdapter(adapter=adapter, source="runtime", target=address.target)

    try:
        problems = await registrations.restore(restore)
    except BaseException:
        await registry.close()
        audit.close()
        raise
    options = replace(
        settings.server_options or ServerOptions(listen=()),
        listen=settings.listen,
        grace_seconds=settings.grace_seconds,
    )
    # With the call log on stderr too, both kinds of line share one writer,
    # so a call's decision line always comes before its call line.
    decision_log = open_call_log("-") if settings.decisions_to_stderr else None
    shared_log = decision_log if options.call_log == "-" else None
    try:
        broker = Broker(
            registry,
            caches=CallCaches(),
            profiles=config.profiles,
            max_depth=config.max_depth,
            mcp_policy=config.mcp,
            audit=audit,
            decision_sink=decision_log.write_line if decision_log is not None else None,
        )
        conversations = ConversationManager(store, broker.preview)
        seedstore = (
            GrpcSeedSource(settings.seedstore_target, token_file=settings.seedstore_token_file)
            if settings.seedstore_target is not None
            else None
        )
        bootstrapper = Bootstrapper(seedstore, audit=broker.audit)
        prober = Prober(registry, config.probe)
        servicer = NegotiatorServicer(
            broker,
            registry,
            connect,
            conversations,
            deadline_margin=settings.deadline_margin,
            bootstrapper=bootstrapper,
            client_certificates=options.tls is not None and options.tls.client_ca is not None,
            adapter_hosts=settings.adapter_hosts,
            max_reply_bytes=options.max_message_bytes,
            bind_conversations=options.tokens is not None,
            registrations=registrations,
            prober=prober,
        )
    except BaseException:
        # Nothing listens yet, but the adapters and the decision writer's thread are running.
        await registry.close()
        audit.close()
        if decision_log is not None:
            await decision_log.close()
        raise

    def register(server: grpc.aio.Server) -> None:
        add_service(server, servicer, negotiator_pb2.DESCRIPTOR.services_by_name["NegotiatorService"])

    try:
        running = await start_server(
            register,
            (SERVICE_NAME,),
            options,
            read_methods=READ_METHODS,
            call_log=shared_log,
            name="negotiator",
            bounded_streams=BOUNDED_STREAMS,
        )
    except BaseException:
        await registry.close()
        await bootstrapper.close()
        audit.close()
        if decision_log is not None and shared_log is None:
            await decision_log.close()
        raise
    prober.start()  # the config's probes, in the background: calls are judged without them until they end
    return RunningNegotiator(
        running=running,
        registry=registry,
        broker=broker,
        servicer=servicer,
        bootstrapper=bootstrapper,
        decision_log=decision_log if shared_log is None else None,
        registrations=registrations,
        prober=prober,
        registration_problems=tuple(problems),
    )


async def serve(settings: Settings) -> None:
    """Run until SIGTERM/SIGINT, then stop gracefully.

    Prints one `READY negotiator <target>...` line on stdout once serving, so
    launchers and tests learn the real ports.
    """
    negotiator = await create_server(settings)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    names = [entry.shortname for entry in negotiator.registry.list()]
    # Lifecycle lines share the stderr writer of the decision records and the call log.
    writers = (negotiator.decision_log, negotiator.running.call_log)
    settle_heap()
    print(f"READY negotiator {' '.join(negotiator.bound)}", flush=True)
    announce("serving", "negotiator", writers, addresses=list(negotiator.bound), adapters=names)
    announce_metrics(negotiator.running, "negotiator", writers)
    try:
        await stop.wait()
        announce("draining", "negotiator", writers, grace_seconds=negotiator.grace_seconds)
    finally:
        await negotiator.stop()
    announce("stopped", "negotiator")
