"""Running the seedstore service: settings, the in-memory index, watchers, shutdown.

The index is refreshed by a background task every `refresh_interval` seconds
(this is how edits made by other programs, SkillSpec included, reach searches
and watchers) and after every write made through the service. A refresh
stats every seed file, so for a large store the pause after one grows with
what it cost: the background walk uses at most `MAX_REFRESH_CPU_SHARE` of a
core (at 100,000 seeds a fixed 1 s interval kept half a core busy while
nothing changed).

With a persisted index the service starts from it alone (`SeedIndex.start_from_persisted`)
and runs the first refresh, the sweep that compares every file's signature, right
after READY; until it ends each entry an answer uses is checked against its file.
Without one it builds the index from the files (`SeedIndex.build`), saving the
persisted index as it goes, and holds it as the next start will.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TypeVar

import grpc

from agentsidecar.seedstore.v1 import seedstore_pb2
from agentsidecar.seedstore_service import convert
from agentsidecar.seedstore_service.index import ChangeEvent, SeedIndex
from agentsidecar.seedstore_service.operations import (
    DEFAULT_CHECK_TIMEOUT_SECONDS,
    DEFAULT_VERIFY_CONCURRENCY,
    DEFAULT_WATCH_BACKLOG_BYTES,
    MAX_CHECK_TIMEOUT_SECONDS,
    MAX_VERIFY_CONCURRENCY,
    ChangeFeed,
    SeedOperations,
    default_equivalents_file,
    load_equivalents,
)
from agentsidecar.seedstore_service.runner import DEFAULT_PATH
from agentsidecar.seedstore_service.servicer import SeedStoreServicer
from agentsidecar.seedstore_service.store import SeedStore, resolve_store_root
from agentsidecar.sidecar_runtime.memory import release_freed_memory
from agentsidecar.sidecar_runtime.serve_args import add_serve_arguments as add_runtime_serve_arguments
from agentsidecar.sidecar_runtime.serve_args import server_options_from_args
from agentsidecar.sidecar_runtime.server import (
    RunningServer,
    ServerOptions,
    add_service,
    serve_until_signalled,
    start_server,
)

SERVICE_NAME = seedstore_pb2.DESCRIPTOR.services_by_name["SeedStoreService"].full_name
# With a token configured (`--token-file`/`--token-env`) every method needs it;
# `--open-reads` leaves these open: they read the store and run nothing.
# AddSeed, UpdateSeed, PreferSeed, RemoveSeed (writes) and VerifySeeds (runs
# evidence commands) always need it.
READ_METHODS = frozenset(
    f"/{SERVICE_NAME}/{method}"
    for method in ("GetStore", "ListSeeds", "SearchSeeds", "InspectSeed", "ScanSeeds", "WatchSeeds")
)
DEFAULT_REFRESH_INTERVAL_SECONDS = 1.0
DEFAULT_GRACE_SECONDS = 10.0

_LOGGER = logging.getLogger(__name__)
_Number = TypeVar("_Number", int, float)


@dataclass(frozen=True)
class Settings:
    """Everything the service needs to start; built without touching the filesystem."""

    listen: tuple[str, ...]
    store_root: Path
    # None: built-in table only. When not `equivalents_required`, a missing file is fine.
    equivalents_file: Path | None
    equivalents_required: bool = False
    check_timeout: float = DEFAULT_CHECK_TIMEOUT_SECONDS
    verify_concurrency: int = DEFAULT_VERIFY_CONCURRENCY
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL_SECONDS
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    # PATH for the PATH lookup and the only PATH evidence commands see.
    check_path: str = DEFAULT_PATH
    # Bytes of changes one WatchSeeds stream may fall behind before it is ended (ABORTED).
    watch_backlog_bytes: int = DEFAULT_WATCH_BACKLOG_BYTES
    # Auth, limits and observability (agentsidecar.sidecar_runtime.serve_args); `listen`
    # and `grace_seconds` above take precedence over the same fields here.
    server_options: ServerOptions | None = None

    def __post_init__(self) -> None:
        if not 0 < self.check_timeout <= MAX_CHECK_TIMEOUT_SECONDS:
            raise ValueError(f"check timeout must be in (0, {MAX_CHECK_TIMEOUT_SECONDS:g}] seconds")
        if not 1 <= self.verify_concurrency <= MAX_VERIFY_CONCURRENCY:
            raise ValueError(f"verify concurrency must be between 1 and {MAX_VERIFY_CONCURRENCY}")
        if not self.refresh_interval > 0:
            raise ValueError("refresh interval must be positive")
        if self.grace_seconds < 0:
            raise ValueError("grace seconds must not be negative")
        if self.watch_backlog_bytes < 1:
            raise ValueError("the watch backlog must be at least one byte")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Settings from the environment.

        `SEEDSTORE_LISTEN` (comma-separated addresses), the store from
        `SKILLSPEC_HOME`/`HOME`, `SEEDSTORE_EQUIVALENTS` (else the default file
        beside the store), `SEEDSTORE_CHECK_TIMEOUT`, `SEEDSTORE_VERIFY_CONCURRENCY`,
        `SEEDSTORE_REFRESH_INTERVAL`, `SEEDSTORE_GRACE_SECONDS`, and
        `SEEDSTORE_CHECK_PATH` (else this process's PATH).
        """
        listen = tuple(part.strip() for part in env.get("SEEDSTORE_LISTEN", "").split(",") if part.strip())
        explicit_equivalents = env.get("SEEDSTORE_EQUIVALENTS")
        return cls(
            listen=listen,
            store_root=resolve_store_root(env),
            equivalents_file=Path(explicit_equivalents)
            if explicit_equivalents
            else default_equivalents_file(env),
            equivalents_required=bool(explicit_equivalents),
            check_timeout=_number(env, "SEEDSTORE_CHECK_TIMEOUT", float, DEFAULT_CHECK_TIMEOUT_SECONDS),
            verify_concurrency=_number(env, "SEEDSTORE_VERIFY_CONCURRENCY", int, DEFAULT_VERIFY_CONCURRENCY),
            refresh_interval=_number(
                env, "SEEDSTORE_REFRESH_INTERVAL", float, DEFAULT_REFRESH_INTERVAL_SECONDS
            ),
            grace_seconds=_number(env, "SEEDSTORE_GRACE_SECONDS", float, DEFAULT_GRACE_SECONDS),
            check_path=env.get("SEEDSTORE_CHECK_PATH") or env.get("PATH") or DEFAULT_PATH,
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
        """The environment's settings, overridden by the flags `add_serve_arguments` defines."""
        settings = cls.from_env(env)
        overrides: dict[str, object] = {}
        if args.listen:
            overrides["listen"] = tuple(args.listen)
        if args.equivalents is not None:
            overrides["equivalents_file"] = Path(args.equivalents)
            overrides["equivalents_required"] = True
        for name in (
            "check_timeout",
            "verify_concurrency",
            "refresh_interval",
            "grace_seconds",
            "watch_backlog_bytes",
        ):
            value = getattr(args, name)
            if value is not None:
                overrides[name] = value
        overrides["server_options"] = server_options_from_args(args)
        return replace(settings, **overrides)  # type: ignore[arg-type]


def _number(env: Mapping[str, str], name: str, kind: type[_Number], default: _Number) -> _Number:
    text = env.get(name)
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, not {text!r}") from None


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The runtime's shared `serve` flags (auth, limits, observability), plus the seedstore's own."""
    add_runtime_serve_arguments(parser, listen_help=" (default: $SEEDSTORE_LISTEN)")
    parser.add_argument("--equivalents", metavar="FILE", help="extra capability equivalents for --broaden")
    parser.add_argument(
        "--check-timeout", type=float, metavar="SECONDS", help="per-check timeout (default 10)"
    )
    parser.add_argument(
        "--verify-concurrency", type=int, metavar="N", help="seeds verified at once (default 4)"
    )
    parser.add_argument(
        "--watch-backlog-bytes",
        type=int,
        metavar="BYTES",
        help="changes one watcher may fall behind before its stream ends (default 8 MiB)",
    )
    parser.add_argument(
        "--refresh-interval",
        type=float,
        metavar="SECONDS",
        help="how often the store is rescanned (default 1)",
    )


@dataclass
class SeedStoreServer(RunningServer):
    """A running seedstore: the grpc server plus the index refresher and the watch feed."""

    operations: SeedOperations | None = None
    feed: ChangeFeed | None = None
    refresher: asyncio.Task[None] | None = field(default=None, repr=False)

    async def stop(self) -> None:
        """Health NOT_SERVING first, then end watch streams (they never end by themselves) and drain."""
        if not self._stopped:
            await self.health.enter_graceful_shutdown()
            if self.feed is not None:
                self.feed.close()
            if self.refresher is not None:
                self.refresher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.refresher
        await RunningServer.stop(self)


async def create_server(settings: Settings) -> SeedStoreServer:
    """Build the index, bind every listener and start serving (health SERVING)."""
    if not settings.listen:
        raise ValueError("no listen address: pass --listen ADDR or set SEEDSTORE_LISTEN")
    equivalents = await asyncio.to_thread(
        load_equivalents, settings.equivalents_file, required=settings.equivalents_required
    )
    store = SeedStore(settings.store_root.absolute(), record_writes=False)
    index = SeedIndex(store)
    feed = ChangeFeed(
        asyncio.get_running_loop(), backlog_bytes=settings.watch_backlog_bytes, size_of=_message_bytes
    )
    operations = SeedOperations(
        store, index, equivalents=equivalents, on_changes=feed.publish, runner_path=settings.check_path
    )
    # With a persisted index the service answers before it has walked the store: entries are
    # checked against their files as answers use them, and the first sweep starts at once.
    from_persisted = await asyncio.to_thread(index.start_from_persisted)
    if from_persisted:
        _log_refresh(index, "seed index loaded from the persisted index (the sweep of the files follows)")
    else:
        # No watcher exists yet, so the build tells no changes; it holds the index as the start
        # from the persisted index it saves would (SeedIndex.build).
        await asyncio.to_thread(index.build)
        _log_refresh(index, "seed index built")
        await asyncio.to_thread(release_freed_memory)
    options = replace(
        settings.server_options or ServerOptions(listen=()),
        listen=settings.listen,
        grace_seconds=settings.grace_seconds,
    )
    servicer = SeedStoreServicer(
        operations,
        feed,
        check_timeout=settings.check_timeout,
        verify_concurrency=settings.verify_concurrency,
        max_message_bytes=options.max_message_bytes,
    )

    def register(server: grpc.aio.Server) -> None:
        add_service(server, servicer, seedstore_pb2.DESCRIPTOR.services_by_name["SeedStoreService"])

    running = await start_server(
        register, (SERVICE_NAME,), options, read_methods=READ_METHODS, name="seedstore"
    )
    refresher = asyncio.create_task(
        _refresh_forever(operations, settings.refresh_interval, first_pause=0.0 if from_persisted else None)
    )
    # Every field of the runtime's RunningServer, whatever it grows, plus ours.
    inherited = {spec.name: getattr(running, spec.name) for spec in fields(RunningServer) if spec.init}
    return SeedStoreServer(**inherited, operations=operations, feed=feed, refresher=refresher)


def _message_bytes(event: ChangeEvent) -> int:
    return convert.change_to_proto(event).ByteSize()


# A refresh that read at least this many files freed far more memory than the index keeps of
# them: the allocator is asked to hand it back (`release_freed_memory`).
TRIM_AFTER_FILES_READ = 1000

# The share of one core the background walk may use; see refresh_pause.
MAX_REFRESH_CPU_SHARE = 0.05


def refresh_pause(
    interval: float, walk_cpu_seconds: float, max_share: float = MAX_REFRESH_CPU_SHARE
) -> float:
    """Seconds to wait before the next background refresh.

    `interval` while a walk is cheap; once the walk's CPU time times
    (1/max_share - 1) exceeds it, that: the walk then takes `max_share` of a
    core. Edits by other programs show up within that pause (writes made
    through the service show up at once either way).
    """
    return max(interval, walk_cpu_seconds * (1 / max_share - 1))


async def _refresh_forever(
    operations: SeedOperations, interval: float, *, first_pause: float | None = None
) -> None:
    pause = interval if first_pause is None else first_pause
    sweep = first_pause is not None
    while True:
        await asyncio.sleep(pause)
        try:
            walk_cpu_seconds = await asyncio.to_thread(_timed_refresh, operations)
            if sweep:
                sweep = False
                index = getattr(operations, "index", None)
                if index is not None:
                    _log_refresh(index, "seed index swept (every file's signature compared)")
        except Exception:
            # A failed rescan (a vanished store, an I/O error) must not end
            # watching for good; the next tick tries again.
            _LOGGER.exception("refreshing the seed index failed")
            continue
        pause = refresh_pause(interval, walk_cpu_seconds)


def _timed_refresh(operations: SeedOperations) -> float:
    """Refresh the index; return the CPU time this thread spent on it."""
    started = time.thread_time()
    events = operations.refresh_index()
    spent = time.thread_time() - started
    index = getattr(operations, "index", None)  # a test stand-in may have none
    if events and index is not None:
        _log_refresh(index, "seed index refreshed after edits")
    stats = index.last_refresh if index is not None else None
    if stats is not None and stats.read >= TRIM_AFTER_FILES_READ:
        release_freed_memory()
    return spent


def _log_refresh(index: SeedIndex, what: str) -> None:
    """How long a refresh took and how much of the store it had to read and parse."""
    stats = index.last_refresh
    if stats is None:
        return
    _LOGGER.info(
        "%s in %.3f s: %d seed files, %d from the persisted index, %d read",
        what,
        stats.seconds,
        stats.files,
        stats.from_persisted,
        stats.read,
    )


async def serve(settings: Settings) -> None:
    """Serve until SIGTERM/SIGINT, then stop gracefully."""
    running = await create_server(settings)
    await serve_until_signalled(running, "seedstore")


def settings_from_environment(argv: Sequence[str] | None = None) -> Settings:
    """For `python -m agentsidecar.seedstore_service.server [--listen ...]`."""
    parser = argparse.ArgumentParser(prog="seedstore-server")
    add_serve_arguments(parser)
    return Settings.from_args(parser.parse_args(argv), os.environ)


if __name__ == "__main__":
    asyncio.run(serve(settings_from_environment()))
