"""Running a seed's checks: the shell around `verification.py`.

Evidence commands come from user-writable YAML, so each one runs without a
shell, in a fresh scratch directory, with a minimal environment, under a
timeout, with its output capped, and contained by `agentsidecar.sidecar_runtime.proctree`:
whatever it starts, even in a session of its own, is killed when it exits.
Whatever ends a check early — the timeout, a consumer that stops iterating, a
cancelled task, the seedstore's own death — the whole process tree is killed
before control leaves, so no check outlives its caller. The scratch directory
is removed afterwards even when the command took its permissions away.

Results stream as events: for each check a `CheckStarted` and a
`CheckFinished`, then one `SeedChecked` with the verdict. Writing the verdict
to disk is the caller's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentsidecar.seedstore_service.model import Outcome, Seed, VerificationStatus
from agentsidecar.seedstore_service.verification import DEFAULT_PATH as DEFAULT_PATH
from agentsidecar.seedstore_service.verification import (
    Check,
    CommandEnd,
    EvidenceCommand,
    Exited,
    FileState,
    NoEvidence,
    PathLookup,
    SpawnFailed,
    TimedOut,
    UnrunnableEvidence,
    evidence_outcome,
    first_check,
    lookup_on_path,
    path_lookup_outcome,
    plan_checks,
    verdict,
)
from agentsidecar.sidecar_runtime import proctree

_READ_CHUNK = 65536
# The supervisor exits only once the whole tree is gone, so the pipe is at EOF by then;
# this bounds the read for a tree the supervisor could not hold (killed from outside).
_DRAIN_AFTER_EXIT_S = 1.0


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    check_timeout: float = 10.0
    """Seconds an evidence command may run before its process tree is killed."""
    output_cap_bytes: int = 65536
    """Output kept per command (stdout and stderr together); the rest is read and dropped."""
    path: str = DEFAULT_PATH
    """PATH for lookups and the only PATH evidence commands see."""

    def __post_init__(self) -> None:
        if not self.check_timeout > 0:
            raise ValueError(f"check_timeout must be positive, not {self.check_timeout}")
        if self.output_cap_bytes < 0:
            raise ValueError(f"output_cap_bytes must not be negative, not {self.output_cap_bytes}")


# --- events -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckStarted:
    seed_id: str
    domain: str
    check: str
    index: int


@dataclass(frozen=True, slots=True)
class CheckFinished:
    seed_id: str
    domain: str
    check: str
    index: int
    ok: bool
    exit_code: int | None  # None unless an evidence command ran and exited
    duration_s: float
    message: str
    output_truncated: bool
    timed_out: bool


@dataclass(frozen=True, slots=True)
class SeedChecked:
    seed_id: str
    domain: str
    path: str
    outcomes: tuple[Outcome, ...]
    status: VerificationStatus
    duration_s: float = 0.0  # from the first check's start to the last one's end


VerifyEvent = CheckStarted | CheckFinished | SeedChecked


# --- one command ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommandResult:
    end: CommandEnd
    output: bytes  # at most output_cap_bytes of stdout+stderr
    output_truncated: bool
    duration_s: float


def probe_file(candidate: str) -> FileState:
    """The real filesystem probe for `lookup_on_path`: a regular file, and X_OK for us."""
    if not os.path.isfile(candidate):
        return FileState.MISSING
    return FileState.EXECUTABLE if os.access(candidate, os.X_OK) else FileState.NOT_EXECUTABLE


async def run_command(argv: Sequence[str], settings: RunnerSettings, lookup_cwd: Path) -> CommandResult:
    """Run `argv` (no shell) under the runner's rules and report how it ended.

    A bare program name is resolved on `settings.path` (never the service's
    own PATH); a name with a slash is taken relative to `lookup_cwd`, as
    SkillSpec does relative to its working directory.
    """
    if not argv:
        raise ValueError("argv must not be empty")
    started = time.monotonic()
    program = _resolve_program(argv[0], settings.path, lookup_cwd)
    if isinstance(program, SpawnFailed):
        return CommandResult(program, b"", False, time.monotonic() - started)
    scratch = Path(tempfile.mkdtemp(prefix="seedstore-verify-"))
    try:
        try:
            run = await proctree.start(
                program,
                argv,
                env=_minimal_env(settings.path, scratch),
                cwd=scratch,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as error:
            return CommandResult(_spawn_failed(error), b"", False, time.monotonic() - started)
        return await _supervise(run, settings, started)
    finally:
        _remove_scratch(scratch)


def _remove_scratch(scratch: Path) -> None:
    try:
        os.rmdir(scratch)  # most commands leave it empty: one system call
        return
    except OSError:
        pass
    with contextlib.suppress(OSError):
        shutil.rmtree(scratch)
        return
    # The command took permissions away (a directory made read-only or mode 0, itself
    # included); it is the service's own, so give the owner them back and remove it again.
    _restore_directory_permissions(scratch)
    shutil.rmtree(scratch, ignore_errors=True)


def _restore_directory_permissions(scratch: Path) -> None:
    with contextlib.suppress(OSError):
        os.chmod(scratch, 0o700)
    # Top-down, so each directory is opened up before the walk lists it; a symlink is never
    # followed (os.walk does not descend into one, and it is not chmod'ed).
    for directory, subdirectories, _ in os.walk(scratch):
        for name in subdirectories:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                with contextlib.suppress(OSError):
                    os.chmod(path, 0o700)


def _resolve_program(name: str, path_env: str, cwd: Path) -> str | SpawnFailed:
    if "/" in name:
        # Let exec report what is wrong with an explicit path (ENOENT, EACCES, ...).
        return os.path.abspath(cwd / name)
    found = lookup_on_path(name, path_env, cwd, probe_file)
    if found.path is None:
        return _spawn_failed(FileNotFoundError(2, os.strerror(2)))
    # A non-executable hit is still exec'd, so the error is the OS's own EACCES.
    return os.path.abspath(found.path)


def _spawn_failed(error: OSError) -> SpawnFailed:
    errno = error.errno or 0
    return SpawnFailed(errno=errno, strerror=os.strerror(errno) if errno else str(error))


def _minimal_env(path: str, scratch: Path) -> dict[str, str]:
    return {"PATH": path, "HOME": str(scratch), "TMPDIR": str(scratch), "LANG": "C.UTF-8"}


class _CappedOutput:
    """Keeps the first `cap` bytes and keeps reading past them, so the child never blocks on a full pipe."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.truncated = False

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_READ_CHUNK):
            room = self.cap - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]
            if len(chunk) > room:
                self.truncated = True


async def _supervise(run: proctree.Run, settings: RunnerSettings, started: float) -> CommandResult:
    stdout = run.process.stdout
    assert stdout is not None  # stdout=PIPE
    output = _CappedOutput(settings.output_cap_bytes)
    reader = asyncio.create_task(output.drain(stdout))
    end: CommandEnd
    try:
        try:
            async with asyncio.timeout(settings.check_timeout):
                await run.exited.wait()
        except TimeoutError:
            end = TimedOut(settings.check_timeout)
        else:
            returncode = run.returncode
            assert returncode is not None  # set before the exit is reported
            end = Exited(returncode)
    finally:
        # Also reached on cancellation: the tree must not outlive the check. Once it is
        # gone the pipe is at EOF; the rest of the output is read, briefly.
        await proctree.to_the_end(run.finish())
        _, late = await asyncio.wait({reader}, timeout=_DRAIN_AFTER_EXIT_S)
        for task in late:
            task.cancel()
    return CommandResult(end, bytes(output.kept), output.truncated, time.monotonic() - started)


# --- one seed ---------------------------------------------------------------


def first_check_started(seed: Seed) -> CheckStarted:
    """The event that opens `seed`'s checks. It needs no work, so it can go out before any starts."""
    return CheckStarted(seed_id=seed.id, domain=seed.domain, check=first_check(seed).name, index=0)


async def check_seed(
    seed: Seed, path: str, settings: RunnerSettings, *, first_started_sent: bool = False
) -> AsyncGenerator[VerifyEvent, None]:
    """Run `seed`'s checks one after another, yielding events as they happen.

    With `first_started_sent` the caller has already yielded `first_check_started(seed)`,
    so it is not yielded again. The PATH lookup (and a relative program in an
    evidence command) is resolved against the service's current directory, as
    SkillSpec does.
    """
    lookup_cwd = Path.cwd()
    outcomes: list[Outcome] = []
    started = time.monotonic()
    for index, check in enumerate(plan_checks(seed)):
        if index > 0 or not first_started_sent:
            yield CheckStarted(seed_id=seed.id, domain=seed.domain, check=check.name, index=index)
        finished = await _run_check(seed, check, index, settings, lookup_cwd)
        outcomes.append(Outcome(check=finished.check, ok=finished.ok, message=finished.message))
        yield finished
    yield SeedChecked(
        seed_id=seed.id,
        domain=seed.domain,
        path=path,
        outcomes=tuple(outcomes),
        status=verdict(outcomes),
        duration_s=time.monotonic() - started,
    )


async def _run_check(
    seed: Seed, check: Check, index: int, settings: RunnerSettings, lookup_cwd: Path
) -> CheckFinished:
    started = time.monotonic()
    exit_code: int | None = None
    output_truncated = False
    timed_out = False
    if isinstance(check, PathLookup):
        outcome = path_lookup_outcome(
            check, lookup_on_path(check.program, settings.path, lookup_cwd, probe_file)
        )
        duration_s = time.monotonic() - started
    elif isinstance(check, EvidenceCommand):
        result = await run_command(check.argv, settings, lookup_cwd)
        outcome = evidence_outcome(check, result.end)
        duration_s = result.duration_s
        output_truncated = result.output_truncated
        timed_out = isinstance(result.end, TimedOut)
        if isinstance(result.end, Exited):
            exit_code = result.end.exit_code
    else:
        assert isinstance(check, UnrunnableEvidence | NoEvidence)
        outcome = check.outcome()
        duration_s = time.monotonic() - started
    return CheckFinished(
        seed_id=seed.id,
        domain=seed.domain,
        check=outcome.check,
        index=index,
        ok=outcome.ok,
        exit_code=exit_code,
        duration_s=duration_s,
        message=outcome.message,
        output_truncated=output_truncated,
        timed_out=timed_out,
    )


# --- several seeds ----------------------------------------------------------


async def check_seeds(
    items: Sequence[tuple[Seed, str]],
    settings: RunnerSettings,
    concurrency: int,
    *,
    first_started_sent: bool = False,
    on_checked: Callable[[SeedChecked], None] | None = None,
) -> AsyncGenerator[VerifyEvent, None]:
    """Check each `(seed, path)`, at most `concurrency` seeds at a time, yielding all events.

    Events of one seed keep their order; events of different seeds
    interleave as they happen. The first seed's first `CheckStarted` needs
    no work, so it is yielded at once, before the checks' tasks take their
    first step (they run as soon as the consumer yields to the event loop):
    a stream's first message waits for no scratch directory or process spawn.
    With `first_started_sent` the caller has already sent that event
    (`first_check_started(items[0][0])`) without calling this generator, so
    it is not yielded again and the checks start at the first iteration.
    `on_checked` hears of each `SeedChecked` as soon as it exists, before the
    consumer takes it, so work on the verdict need not wait for the consumer.
    Stopping early (aclose, break, cancellation) cancels every running check,
    which kills its process tree, before this generator finishes. An
    unexpected error in one seed's checks stops the rest and is raised here.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    if not items:
        return
    queue: asyncio.Queue[VerifyEvent | asyncio.Task[None]] = asyncio.Queue()
    pending = enumerate(items)

    async def worker(work: Iterator[tuple[int, tuple[Seed, str]]]) -> None:
        # Workers share one iterator, so each takes the next seed when free.
        for position, (seed, path) in work:
            checking = check_seed(seed, path, settings, first_started_sent=position == 0)
            async with contextlib.aclosing(checking) as events:
                async for event in events:
                    if on_checked is not None and isinstance(event, SeedChecked):
                        on_checked(event)
                    queue.put_nowait(event)

    workers = [asyncio.create_task(worker(pending)) for _ in range(min(concurrency, len(items)))]
    for task in workers:
        task.add_done_callback(queue.put_nowait)
    try:
        if not first_started_sent:
            yield first_check_started(items[0][0])
        running = len(workers)
        while running:
            item = await queue.get()
            if isinstance(item, asyncio.Task):
                running -= 1
                if not item.cancelled() and (error := item.exception()) is not None:
                    raise error
                continue
            yield item
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
