"""The seedstore operations both front ends share: the local CLI and the gRPC service.

`SeedOperations` wraps a `SeedStore` (disk) and, in the service, a `SeedIndex`
(memory). Without an index every read and every write loads the scope from disk,
as SkillSpec does. With one, reads come from memory; a write finds its target
through the index (the store re-reads just the candidate files under its lock)
and is followed by a refresh of the file it wrote, so the next read sees it and
watchers hear about it. Edits by other programs reach the index through
`refresh_index()`, which the service runs periodically. Results are core values
that `render.py` turns into the CLI's JSON and `convert.py` into protos.

Everything but `verify` and `run_verify` is blocking (files, the store lock): the service runs
those methods in worker threads. The `*_from_memory` variants answer a read from
the index alone, without waiting and without touching disk, or return None when
they cannot (no index, a refresh applying its changes, a seed the index does not
hold yet); the service runs those on its event loop and saves the thread hop.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from agentsidecar.seedstore_service import errors, paging
from agentsidecar.seedstore_service.model import (
    ListedSeed,
    Outcome,
    Problem,
    Verification,
    VerificationStatus,
)
from agentsidecar.seedstore_service.names import canonical
from agentsidecar.seedstore_service.ranking import SearchQuery, SearchResult, search, validate_query
from agentsidecar.seedstore_service.seedtext import validate_identifier
from agentsidecar.seedstore_service.store import (
    LoadedScope,
    Locator,
    SeedStore,
    StoredSeed,
    locate_in_scope,
    os_error_text,
)

# The local CLI's read commands import this module: what only verify, broadening and the
# service need (asyncio, the check runner, YAML, metrics) is imported where it is used.
if TYPE_CHECKING:
    import asyncio

    from agentsidecar.seedstore_service.broadening import Broadening, EquivalenceTable
    from agentsidecar.seedstore_service.index import ChangeEvent, SeedIndex
    from agentsidecar.seedstore_service.patch import AddSpec, UpdatePatch
    from agentsidecar.seedstore_service.runner import CheckFinished, CheckStarted, RunnerSettings, SeedChecked

EQUIVALENTS_FILE_NAME = "equivalents.yml"
DEFAULT_CHECK_TIMEOUT_SECONDS = 10.0
MAX_CHECK_TIMEOUT_SECONDS = 600.0
DEFAULT_VERIFY_CONCURRENCY = 4
MAX_VERIFY_CONCURRENCY = 32

_Read = TypeVar("_Read")


class _NotInMemory(Exception):
    """A read from memory alone met a seed the index does not hold: only a refresh (disk) can tell."""


# --- results ----------------------------------------------------------------


@dataclass(frozen=True)
class SeedView:
    """A seed as written (add, update, prefer) or read (inspect)."""

    seed_store: str
    stored: StoredSeed
    problems: tuple[Problem, ...] = ()


@dataclass(frozen=True)
class SeedListing:
    seed_store: str
    domain: str | None
    entries: tuple[ListedSeed, ...]
    problems: tuple[Problem, ...]


@dataclass(frozen=True)
class SearchOutcome:
    seed_store: str
    result: SearchResult
    broadening: Broadening | None  # set when broadening was asked for
    problems: tuple[Problem, ...]


@dataclass(frozen=True)
class SeedRemoved:
    seed_store: str
    id: str
    path: str
    problems: tuple[Problem, ...]


@dataclass(frozen=True)
class SeedVerified:
    """A seed's verdict, after it was written to its file."""

    id: str
    domain: str
    path: str
    status: VerificationStatus
    outcomes: tuple[Outcome, ...]
    revision: str


if TYPE_CHECKING:
    VerifyProgress: TypeAlias = CheckStarted | CheckFinished | SeedVerified


def __getattr__(name: str) -> Any:
    # `VerifyProgress` at run time (an isinstance-able union) without importing the runner up front.
    if name == "VerifyProgress":
        from agentsidecar.seedstore_service.runner import CheckFinished, CheckStarted

        return CheckStarted | CheckFinished | SeedVerified
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class VerifyRequest:
    ids: tuple[str, ...]
    domain: str | None = None
    all_in_domain: bool = False
    check_timeout: float = DEFAULT_CHECK_TIMEOUT_SECONDS
    concurrency: int = DEFAULT_VERIFY_CONCURRENCY


@dataclass(frozen=True)
class VerifyPlan:
    """A verify request found valid, with its seeds located: nothing has run yet."""

    targets: tuple[StoredSeed, ...]
    settings: RunnerSettings
    concurrency: int

    @property
    def first_event(self) -> CheckStarted | None:
        """The event that opens the stream (None when there is no seed to check).

        It describes the first check of the first seed, which `run_verify` starts
        without doing anything before it, so it can be sent before any work.
        """
        from agentsidecar.seedstore_service.runner import first_check_started

        return first_check_started(self.targets[0].seed) if self.targets else None


def now_unix() -> int:
    return max(0, int(time.time()))


# --- the equivalence table ---------------------------------------------------


def default_equivalents_file(env: Mapping[str, str]) -> Path | None:
    """`$SKILLSPEC_HOME/equivalents.yml`, else `$HOME/.skillspec/equivalents.yml`.

    Beside `capabilities/`, not inside it: SkillSpec would try to load any YAML
    file under its store as a seed.
    """
    skillspec_home = env.get("SKILLSPEC_HOME")
    if skillspec_home is not None:
        return Path(skillspec_home) / EQUIVALENTS_FILE_NAME
    home = env.get("HOME")
    if home is not None:
        return Path(home) / ".skillspec" / EQUIVALENTS_FILE_NAME
    return None


def load_equivalents(path: Path | None, *, required: bool) -> EquivalenceTable:
    """The built-in table merged with the user's file; a missing default file is no error.

    Raises:
        InvalidArgument: the file cannot be parsed (file, field and line named).
        StoreUnavailable: a required file (given explicitly) cannot be read.
    """
    from agentsidecar.seedstore_service.broadening import builtin_table, merge_tables, parse_user_table

    if path is None:
        return builtin_table()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        if not required:
            return builtin_table()
        raise errors.StoreUnavailable(f"failed to read {path}: {os_error_text(err)}") from err
    except (OSError, UnicodeDecodeError) as err:
        detail = os_error_text(err) if isinstance(err, OSError) else "stream did not contain valid UTF-8"
        raise errors.StoreUnavailable(f"failed to read {path}: {detail}") from err
    return merge_tables(builtin_table(), parse_user_table(text, str(path)))


# --- operations ----------------------------------------------------------------


class SeedOperations:
    """Every seedstore operation over one store, with an optional in-memory index."""

    def __init__(
        self,
        store: SeedStore,
        index: SeedIndex | None = None,
        *,
        equivalents: EquivalenceTable | None = None,
        on_changes: Callable[[Sequence[ChangeEvent]], None] | None = None,
        clock: Callable[[], int] = now_unix,
        runner_path: str | None = None,
    ) -> None:
        self.store = store
        self.index = index
        self._equivalents = equivalents
        self._on_changes = on_changes
        self._clock = clock
        self._runner_path = runner_path  # None: verification.DEFAULT_PATH
        # A refresh and the publication of its events happen as one step, so
        # watchers receive the changes of successive refreshes in order.
        self._refresh_lock = threading.Lock()

    @property
    def equivalents(self) -> EquivalenceTable:
        """The table `search(broaden_empty=True)` uses: the one given, else the built-in one."""
        if self._equivalents is None:
            from agentsidecar.seedstore_service.broadening import builtin_table

            self._equivalents = builtin_table()
        return self._equivalents

    @property
    def seed_store(self) -> str:
        return str(self.store.root)

    # -- the index -------------------------------------------------------

    def refresh_index(
        self,
        paths: Collection[str] | None = None,
        written: Collection[StoredSeed] = (),
        *,
        domain: str | None = None,
    ) -> list[ChangeEvent]:
        """Bring the index up to date and hand the changes to the listener; no-op without an index.

        With `paths`, only those files are looked at (after a write through this object);
        `written` are the seeds that write left in them (see `SeedIndex.refresh_paths`).
        With `domain`, only that domain's files are walked.
        """
        if self.index is None:
            return []
        with self._refresh_lock:
            index = self.index
            events = index.refresh(domain) if paths is None else index.refresh_paths(paths, written)
            if events and self._on_changes is not None:
                self._on_changes(events)
        return events

    def _scope(self, domain: str | None) -> LoadedScope:
        if self.index is not None:
            return self.index.scope(domain)
        return self.store.load(domain)

    def _locate(
        self, seed_id: str, domain: str | None, *, may_refresh: bool = True
    ) -> tuple[StoredSeed, tuple[Problem, ...]]:
        """The seed and its scope's problems; without `may_refresh`, `_NotInMemory` instead of disk."""
        index = self.index
        if index is None:
            return self.store.locate(seed_id, domain)
        return self._find(seed_id, domain, may_refresh=may_refresh), index.problems(domain)

    def _find(self, seed_id: str, domain: str | None, *, may_refresh: bool = True) -> StoredSeed:
        """`_locate` without the scope's problems (which need not be gathered then)."""
        validate_identifier(seed_id, "capability id")
        index = self.index
        if index is None:
            return self.store.locate(seed_id, domain)[0]
        # The candidate files decide a lookup exactly as the whole scope would, without building it.
        try:
            return locate_in_scope(index.lookup(seed_id, domain), seed_id)
        except errors.SeedNotFound:
            if not may_refresh:
                raise _NotInMemory from None
        # Another program may have added it since the last background refresh.
        self.refresh_index()
        return locate_in_scope(index.lookup(seed_id, domain), seed_id)

    def _write_locator(self) -> Locator | None:
        """How the store finds a write's target: through the index when there is one."""
        return self._candidate_paths if self.index is not None else None

    def _candidate_paths(self, seed_id: str, domain: str | None) -> tuple[str, ...]:
        # Called by the store under its lock. The scope is walked again first, so a
        # file another program put anywhere in it (another name, a nested directory)
        # counts now, not after the next background refresh: ambiguity never depends
        # on timing. The walk stats every file of the scope; it reads only the new,
        # changed and recently modified ones.
        assert self.index is not None
        self.refresh_index(domain=domain)
        return self.index.candidate_paths(seed_id, domain)

    def _after_write(
        self, path: str, domain: str | None, problems: tuple[Problem, ...]
    ) -> tuple[Problem, ...]:
        """Refresh the written file in the index; the scope's problems, from the index when there is one.

        (With a locator the store saw only the candidate files' problems.)
        """
        if self.index is None:
            return problems
        self.refresh_index((path,))
        return self.index.problems(domain)

    # -- writes ----------------------------------------------------------

    def add(self, spec: AddSpec) -> SeedView:
        stored = self.store.add(spec)
        self.refresh_index((stored.path,))
        return SeedView(self.seed_store, stored)

    def update(
        self, seed_id: str, domain: str | None, patch: UpdatePatch, *, expected_revision: str | None = None
    ) -> SeedView:
        stored, problems = self.store.update(
            seed_id,
            domain,
            patch,
            expected_revision=expected_revision,
            now_unix=self._clock(),
            locate=self._write_locator(),
        )
        problems = self._after_write(stored.path, domain, problems)
        return SeedView(self.seed_store, stored, problems)

    def prefer(self, seed_id: str, domain: str | None, for_capability: str, priority: int | None) -> SeedView:
        stored, problems = self.store.prefer(
            seed_id, domain, for_capability, priority, locate=self._write_locator()
        )
        problems = self._after_write(stored.path, domain, problems)
        return SeedView(self.seed_store, stored, problems)

    def remove(self, seed_id: str, domain: str | None) -> SeedRemoved:
        path, problems = self.store.remove(seed_id, domain, locate=self._write_locator())
        problems = self._after_write(path, domain, problems)
        return SeedRemoved(self.seed_store, seed_id, path, problems)

    # -- reads -----------------------------------------------------------

    def _from_memory(self, read: Callable[[], _Read]) -> _Read | None:
        """`read()` while the index is held still, or None if that needs a wait or disk.

        `read` must reach the store only through `_locate(..., may_refresh=False)`
        and the index; with an index, every read below does.
        """
        index = self.index
        if index is None:
            return None
        with index.held_if_free() as held:
            if not held:
                return None
            try:
                return read()
            except _NotInMemory:
                return None

    def inspect_from_memory(self, seed_id: str, domain: str | None) -> SeedView | None:
        """`inspect` from the index alone, or None (see the module docstring)."""

        def read() -> SeedView:
            stored, problems = self._locate(seed_id, domain, may_refresh=False)
            return SeedView(self.seed_store, stored, problems)

        return self._from_memory(read)

    def search_from_memory(self, query: SearchQuery, *, broaden_empty: bool = False) -> SearchOutcome | None:
        """`search` from the index alone, or None (see the module docstring)."""
        return self._from_memory(lambda: self.search(query, broaden_empty=broaden_empty))

    def verify_targets_from_memory(self, request: VerifyRequest) -> tuple[StoredSeed, ...] | None:
        """`verify_targets` from the index alone, or None (see the module docstring)."""
        return self._from_memory(lambda: self.verify_targets(request, may_refresh=False))

    def plan_verify_from_memory(self, request: VerifyRequest) -> VerifyPlan | None:
        """`plan_verify` from the index alone, or None (see the module docstring)."""
        return self._from_memory(lambda: self.plan_verify(request, may_refresh=False))

    def list_seeds(self, domain: str | None) -> SeedListing:
        """The scope's `list` rows sorted by (domain, id, path) and its problems by (path, line,
        reason): the order `paging` cuts pages in."""
        if self.index is not None:
            entries, problems = self.index.listing(domain)
            return SeedListing(self.seed_store, domain, entries, problems)
        rows, found = self.store.listing(domain)
        return SeedListing(
            self.seed_store,
            domain,
            tuple(sorted(rows, key=paging.seed_key)),
            tuple(sorted(found, key=paging.problem_key)),
        )

    def inspect(self, seed_id: str, domain: str | None) -> SeedView:
        stored, problems = self._locate(seed_id, domain)
        return SeedView(self.seed_store, stored, problems)

    def search(self, query: SearchQuery, *, broaden_empty: bool = False) -> SearchOutcome:
        result, problems = self._search_once(query)
        if not broaden_empty:
            return SearchOutcome(self.seed_store, result, None, problems)
        seen = {(problem.path, problem.line, problem.reason) for problem in problems}
        extra: list[Problem] = []

        def run_related(related: SearchQuery) -> SearchResult:
            related_result, related_problems = self._search_once(related)
            for problem in related_problems:
                key = (problem.path, problem.line, problem.reason)
                if key not in seen:
                    seen.add(key)
                    extra.append(problem)
            return related_result

        from agentsidecar.seedstore_service.broadening import broaden

        merged, broadening = broaden(result, query, self.equivalents, run_related)
        all_problems = tuple(sorted((*problems, *extra), key=lambda problem: problem.path))
        return SearchOutcome(self.seed_store, merged, broadening, all_problems)

    def _search_once(self, query: SearchQuery) -> tuple[SearchResult, tuple[Problem, ...]]:
        if self.index is not None:
            return self.index.search(query)
        validate_query(query)
        scope = self.store.load_for_search(query.domain, canonical(query.capability))
        return search(((stored.seed, stored.path) for stored in scope.seeds), query), scope.problems

    def scan(self) -> str:
        """No scan providers are configured (as in SkillSpec): only the store is reported."""
        return self.seed_store

    # -- verify ----------------------------------------------------------

    def verify_targets(self, request: VerifyRequest, *, may_refresh: bool = True) -> tuple[StoredSeed, ...]:
        """The seeds a verify request names, each once, or the error for the first that cannot be found."""
        _validate_verify_limits(request)
        if request.all_in_domain:
            if request.domain is None:
                raise errors.InvalidArgument("verifying every seed of a domain needs a domain", "domain")
            if request.ids:
                raise errors.InvalidArgument(
                    "pass seed ids or ask for every seed of a domain, not both", "ids"
                )
            scope = self._scope(request.domain)
            return tuple(sorted(scope.seeds, key=lambda stored: (stored.seed.domain, stored.seed.id)))
        if not request.ids:
            raise errors.InvalidArgument("at least one seed id is required", "ids")
        for seed_id in request.ids:
            validate_identifier(seed_id, "capability id")
        targets: dict[str, StoredSeed] = {}
        for seed_id in request.ids:
            stored = self._find(seed_id, request.domain, may_refresh=may_refresh)
            targets.setdefault(stored.path, stored)
        return tuple(targets.values())

    def plan_verify(self, request: VerifyRequest, *, may_refresh: bool = True) -> VerifyPlan:
        """The request checked and its seeds located (`verify_targets`), ready for `run_verify`."""
        targets = self.verify_targets(request, may_refresh=may_refresh)
        from agentsidecar.seedstore_service.runner import RunnerSettings
        from agentsidecar.seedstore_service.verification import DEFAULT_PATH

        settings = RunnerSettings(check_timeout=request.check_timeout, path=self._runner_path or DEFAULT_PATH)
        return VerifyPlan(targets, settings, request.concurrency)

    async def verify(self, request: VerifyRequest) -> AsyncGenerator[VerifyProgress, None]:
        """Check the requested seeds, `concurrency` at a time, yielding every event.

        After each seed's last check its verdict is written to its file (only its
        verification block; edits made meanwhile are kept), then its SeedVerified is
        yielded. Closing this generator early cancels the running checks.
        """
        import asyncio

        # Planned from memory when it can be, so the first CheckStarted waits for no thread.
        plan = self.plan_verify_from_memory(request)
        if plan is None:
            plan = await asyncio.to_thread(self.plan_verify, request)
        async with contextlib.aclosing(self.run_verify(plan)) as events:
            async for event in events:
                yield event

    async def run_verify(
        self, plan: VerifyPlan, *, first_event_sent: bool = False
    ) -> AsyncGenerator[VerifyProgress, None]:
        """`verify` for a plan already made; with `first_event_sent`, `plan.first_event` is not yielded.

        A caller that has sent `plan.first_event` itself starts the checks by
        iterating: they wait for nothing else. A seed's verdict is written as
        soon as its checks have all finished, while the events before its
        SeedVerified are still being sent; SeedVerified follows once it is written.
        """
        import asyncio

        from agentsidecar.seedstore_service.runner import SeedChecked, check_seeds
        from agentsidecar.sidecar_runtime.metrics import record_verification

        items = [(stored.seed, stored.path) for stored in plan.targets]
        by_path = {stored.path: stored for stored in plan.targets}
        recording: dict[str, asyncio.Task[SeedVerified]] = {}

        def start_recording(checked: SeedChecked) -> None:
            record_verification(checked.duration_s, checked.status.value)
            recording[checked.path] = asyncio.create_task(
                self._record_verdict(checked, by_path.get(checked.path))
            )

        checking = check_seeds(
            items,
            plan.settings,
            plan.concurrency,
            first_started_sent=first_event_sent,
            on_checked=start_recording,
        )
        try:
            async with contextlib.aclosing(checking) as events:
                async for event in events:
                    if isinstance(event, SeedChecked):
                        verified = await recording[event.path]
                        del recording[event.path]
                        yield verified
                    else:
                        yield event
        finally:
            # Stopped early: a verdict still being written finishes in its worker
            # thread; nothing waits for it, and it is never streamed.
            for task in recording.values():
                task.cancel()
            await asyncio.gather(*recording.values(), return_exceptions=True)

    async def _record_verdict(self, checked: SeedChecked, checked_seed: StoredSeed | None) -> SeedVerified:
        import asyncio

        from agentsidecar.seedstore_service.verification import build_verification

        verification = build_verification(checked.outcomes, self._clock())
        stored = await asyncio.to_thread(self._write_verdict, checked, verification, checked_seed)
        return SeedVerified(
            id=stored.seed.id,
            domain=stored.seed.domain,
            path=stored.path,
            status=verification.status,
            outcomes=verification.outcomes,
            revision=stored.revision,
        )

    def _write_verdict(
        self, checked: SeedChecked, verification: Verification, checked_seed: StoredSeed | None
    ) -> StoredSeed:
        # Write and index refresh in one worker-thread trip: each trip costs two
        # thread wake-ups, and the stream's last event waits for both steps.
        # Neither parses the file again while it holds the bytes already parsed.
        stored = self.store.write_verification(
            checked.path, checked.seed_id, verification, known=checked_seed
        )
        self.refresh_index((stored.path,), written=(stored,))
        return stored


def _validate_verify_limits(request: VerifyRequest) -> None:
    if not 0 < request.check_timeout <= MAX_CHECK_TIMEOUT_SECONDS:
        raise errors.InvalidArgument(
            f"check timeout must be more than 0 and at most {MAX_CHECK_TIMEOUT_SECONDS:g} seconds",
            "check_timeout",
        )
    if not 1 <= request.concurrency <= MAX_VERIFY_CONCURRENCY:
        raise errors.InvalidArgument(
            f"verify concurrency must be between 1 and {MAX_VERIFY_CONCURRENCY}", "concurrency"
        )


# --- change fan-out (service only) ------------------------------------------------


# What one watcher may have queued and not yet taken, in bytes of the messages it
# would be sent: a watcher that stops reading pins at most this much.
DEFAULT_WATCH_BACKLOG_BYTES = 8 * 1024 * 1024


def estimated_event_bytes(event: ChangeEvent) -> int:
    """About what `event` costs as a message: the length of every string it carries."""
    total = 32 + len(event.path) + len(event.id) + len(event.domain) + len(event.revision)
    if event.problem is not None:
        total += len(event.problem.path) + len(event.problem.reason)
    seed = event.seed
    if seed is not None:
        texts = [
            seed.id,
            seed.domain,
            seed.kind,
            seed.command or "",
            seed.adapter or "",
            seed.script or "",
            *seed.provides,
            *seed.aliases,
            *seed.rank.preferred_for,
            *seed.rank.avoid_for,
            *seed.rank.tie_breakers.keys(),
            *seed.rank.tie_breakers.values(),
            *seed.auth_env,
        ]
        for evidence in seed.evidence:
            texts.extend((evidence.source, evidence.command or "", evidence.detail or ""))
        if seed.verification is not None:
            for outcome in seed.verification.outcomes:
                texts.extend((outcome.check, outcome.message))
        total += sum(len(text) + 2 for text in texts)
    return total


_CLOSED = object()  # the feed closed: the stream ends normally
_OVERFLOWED = object()  # the watcher fell too far behind: its stream ends with an error


class _Watcher:
    """One subscriber's queue, and the bytes of the events in it."""

    __slots__ = ("domain", "pending_bytes", "queue")

    def __init__(self, domain: str | None) -> None:
        import asyncio

        self.domain = domain
        self.queue: asyncio.Queue[tuple[ChangeEvent, int] | object] = asyncio.Queue()
        self.pending_bytes = 0


class ChangeFeed:
    """Fans index change events out to every watcher.

    `publish` may be called from any thread (index refreshes run in worker
    threads); delivery happens on the event loop that created the feed. Each
    watcher gets only its domain's events. A watcher that falls behind by more
    than `backlog` events or `backlog_bytes` bytes (`size_of` each event) is
    dropped rather than buffered: its queue is emptied and its stream raises
    WatchBacklogExceeded once it reaches that point; it should list and watch again.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        backlog: int = 10_000,
        backlog_bytes: int = DEFAULT_WATCH_BACKLOG_BYTES,
        size_of: Callable[[ChangeEvent], int] = estimated_event_bytes,
    ) -> None:
        self._loop = loop
        self._backlog = backlog
        self._backlog_bytes = backlog_bytes
        self._size_of = size_of
        self._watchers: set[_Watcher] = set()
        self._closed = False

    def publish(self, events: Sequence[ChangeEvent]) -> None:
        if self._closed or not self._watchers:
            return
        # Sized here, in the publishing thread, once for every watcher.
        batch = tuple((event, self._size_of(event)) for event in events)
        # RuntimeError: the loop has closed, so nobody is watching any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._deliver, batch)

    def _deliver(self, events: tuple[tuple[ChangeEvent, int], ...]) -> None:
        for watcher in list(self._watchers):
            wanted = [item for item in events if watcher.domain in (None, item[0].domain)]
            if not wanted:
                continue
            added = sum(size for _, size in wanted)
            if (
                watcher.queue.qsize() + len(wanted) > self._backlog
                or watcher.pending_bytes + added > self._backlog_bytes
            ):
                self._drop(watcher, watcher.pending_bytes + added)
                continue
            watcher.pending_bytes += added
            for item in wanted:
                watcher.queue.put_nowait(item)

    def _drop(self, watcher: _Watcher, wanted_bytes: int) -> None:
        self._watchers.discard(watcher)
        # What it has not taken is released now; the stream learns why at its next read.
        while not watcher.queue.empty():
            watcher.queue.get_nowait()
        watcher.pending_bytes = wanted_bytes
        watcher.queue.put_nowait(_OVERFLOWED)

    def close(self) -> None:
        """End every watcher's stream (shutdown); later publishes are dropped."""
        self._closed = True
        for watcher in self._watchers:
            watcher.queue.put_nowait(_CLOSED)
        self._watchers.clear()

    @contextlib.asynccontextmanager
    async def subscribe(self, domain: str | None = None) -> AsyncIterator[AsyncIterator[ChangeEvent]]:
        """`async with feed.subscribe(domain) as changes: async for event in changes: ...`

        The iteration raises WatchBacklogExceeded when the watcher was dropped for falling behind.
        """
        watcher = _Watcher(domain)
        if self._closed:
            watcher.queue.put_nowait(_CLOSED)
        else:
            self._watchers.add(watcher)

        async def changes() -> AsyncIterator[ChangeEvent]:
            while True:
                item = await watcher.queue.get()
                if item is _CLOSED:
                    return
                if item is _OVERFLOWED:
                    raise errors.WatchBacklogExceeded(watcher.pending_bytes, self._backlog_bytes)
                assert isinstance(item, tuple)
                event, size = item
                watcher.pending_bytes -= size
                yield event

        try:
            yield changes()
        finally:
            self._watchers.discard(watcher)
