"""Verification as values: which checks a seed gets, and what each result means.

Pure: nothing here touches the filesystem, a clock or a process. The PATH
lookup takes a probe callable; command results come in as `CommandEnd`
values from `runner.py`. Check names and messages are SkillSpec's, so stored
outcomes read the same whichever tool wrote them. Where this module goes
beyond SkillSpec (shell quoting, the exec bit, timeouts) the new messages
follow the same style.
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePath

from agentsidecar.seedstore_service.model import Outcome, Seed, Verification, VerificationStatus

# The PATH checks search when neither the environment nor the service's settings give one.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

# --- the plan ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PathLookup:
    """Is the seed's `command` program on PATH? `program` is its first whitespace token."""

    program: str

    @property
    def name(self) -> str:
        return f"path_lookup:{self.program}"


@dataclass(frozen=True, slots=True)
class EvidenceCommand:
    """An evidence command to run without a shell; `argv` is `raw` split by POSIX quoting."""

    raw: str
    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"evidence_command:{self.raw}"


@dataclass(frozen=True, slots=True)
class UnrunnableEvidence:
    """An evidence command that fails before anything runs: empty, or not valid quoting."""

    raw: str
    name: str
    message: str

    def outcome(self) -> Outcome:
        return Outcome(check=self.name, ok=False, message=self.message)


@dataclass(frozen=True, slots=True)
class NoEvidence:
    """The seed declares nothing to check; it fails rather than verifying vacuously."""

    @property
    def name(self) -> str:
        return "evidence"

    def outcome(self) -> Outcome:
        return Outcome(check=self.name, ok=False, message="no verification evidence declared")


Check = PathLookup | EvidenceCommand | UnrunnableEvidence | NoEvidence


def plan_checks(seed: Seed) -> tuple[Check, ...]:
    """The checks for `seed`, in SkillSpec order: PATH lookup, then evidence in file order."""
    checks: list[Check] = []
    if seed.command is not None:
        checks.append(PathLookup(program=_first_token(seed.command)))
    for evidence in seed.evidence:
        if evidence.command is not None:
            checks.append(plan_evidence_command(evidence.command))
    if not checks:
        checks.append(NoEvidence())
    return tuple(checks)


def first_check(seed: Seed) -> Check:
    """`plan_checks(seed)[0]`, without planning (shell-splitting) the evidence commands after it.

    The event that opens a verify stream names only this check, so the stream's
    first message waits for nothing else.
    """
    if seed.command is not None:
        return PathLookup(program=_first_token(seed.command))
    for evidence in seed.evidence:
        if evidence.command is not None:
            return plan_evidence_command(evidence.command)
    return NoEvidence()


def plan_evidence_command(raw: str) -> EvidenceCommand | UnrunnableEvidence:
    if "\x00" in raw:
        # No program argument can hold a NUL (execve ends strings there): this check
        # fails on its own, the seed's other checks still run.
        return UnrunnableEvidence(
            raw=raw, name=f"evidence_command:{raw}", message="evidence command contains a NUL byte"
        )
    try:
        argv = shlex.split(raw, comments=False, posix=True)
    except ValueError as error:
        return UnrunnableEvidence(
            raw=raw,
            name=f"evidence_command:{raw}",
            message=f"evidence command is not valid shell quoting: {error}",
        )
    if not argv:
        return UnrunnableEvidence(raw=raw, name="evidence_command", message="empty evidence command")
    return EvidenceCommand(raw=raw, argv=tuple(argv))


def _first_token(command: str) -> str:
    # SkillSpec: `split_whitespace().next().unwrap_or(command)`, so a blank
    # command is looked up as itself (and is never found).
    tokens = command.split()
    return tokens[0] if tokens else command


# --- PATH lookup ------------------------------------------------------------


class FileState(enum.Enum):
    """What a filesystem probe saw at one candidate path (symlinks followed)."""

    MISSING = "missing"  # absent, or not a regular file
    NOT_EXECUTABLE = "not_executable"  # a regular file we may not execute
    EXECUTABLE = "executable"


@dataclass(frozen=True, slots=True)
class LookupResult:
    """The best candidate: the first executable one, else the first existing one."""

    state: FileState
    path: PurePath | None = None


def lookup_on_path(
    program: str, path_env: str | None, cwd: PurePath, probe: Callable[[str], FileState]
) -> LookupResult:
    """Find `program` as SkillSpec does, but noticing the exec bit.

    A name with more than one path component (`./x`, `/usr/bin/x`) is probed
    relative to `cwd`; any other name is probed in each PATH directory. Empty
    PATH entries are skipped rather than meaning "the current directory": a
    service should not run whatever happens to sit in its working directory.
    Relative PATH entries are taken relative to `cwd`. `probe` gets each
    candidate as `str(cwd / entry / program)` spells it, and is not called
    after the first executable one.
    """
    if _component_count(program) > 1:
        candidates: Iterable[str] = [str(cwd / program)]
    elif not path_env:
        candidates = []
    else:
        candidates = (_joined(directory, program) for directory in _search_directories(path_env, cwd))
    first_existing: str | None = None
    for candidate in candidates:
        state = probe(candidate)
        if state is FileState.EXECUTABLE:
            return LookupResult(FileState.EXECUTABLE, PurePath(candidate))
        if state is FileState.NOT_EXECUTABLE and first_existing is None:
            first_existing = candidate
    if first_existing is not None:
        return LookupResult(FileState.NOT_EXECUTABLE, PurePath(first_existing))
    return LookupResult(FileState.MISSING)


def _search_directories(path_env: str, cwd: PurePath) -> tuple[str, ...]:
    """PATH's non-empty entries as `str(cwd / entry)` spells them."""
    return tuple(str(cwd / entry) for entry in path_env.split(":") if entry)


def _joined(directory: str, program: str) -> str:
    """`str(PurePath(directory) / program)`; plain file names (the usual case) without building a PurePath."""
    if not program or program == "." or "/" in program:
        return str(PurePath(directory) / program)
    # Only a root ("/", or POSIX's special "//") ends with a slash once PurePath has normalised it.
    return directory + program if directory.endswith("/") else f"{directory}/{program}"


def _component_count(name: str) -> int:
    """Rust's `PurePath::components().count()`: a leading `/` or `./` counts, inner `.` do not."""
    count = 0
    rest = name
    if rest.startswith("/"):
        count += 1
        rest = rest.lstrip("/")
    elif rest == "." or rest.startswith("./"):
        count += 1
        rest = rest[1:]
    return count + sum(1 for part in rest.split("/") if part not in ("", "."))


def path_lookup_outcome(check: PathLookup, result: LookupResult) -> Outcome:
    program = check.program
    if result.state is FileState.EXECUTABLE:
        message = f"{program} found on PATH"
    elif result.state is FileState.NOT_EXECUTABLE:
        message = f"{program} found on PATH but is not executable"
    else:
        message = f"{program} not found on PATH"
    return Outcome(check=check.name, ok=result.state is FileState.EXECUTABLE, message=message)


# --- evidence command results -----------------------------------------------


@dataclass(frozen=True, slots=True)
class Exited:
    """The process ended; a negative `returncode` means killed by that signal (Python's rule)."""

    returncode: int

    @property
    def exit_code(self) -> int:
        # SkillSpec records a signal death as -1 (`code().unwrap_or(-1)`).
        return self.returncode if self.returncode >= 0 else -1


@dataclass(frozen=True, slots=True)
class SpawnFailed:
    """The program could not be started; the OS error, as Rust's `io::Error` prints it."""

    errno: int
    strerror: str


@dataclass(frozen=True, slots=True)
class TimedOut:
    after_s: float


CommandEnd = Exited | SpawnFailed | TimedOut


def evidence_outcome(check: EvidenceCommand, end: CommandEnd) -> Outcome:
    if isinstance(end, Exited):
        ok = end.exit_code == 0
        message = (
            "evidence command exited successfully" if ok else f"evidence command exited with {end.exit_code}"
        )
        return Outcome(check=check.name, ok=ok, message=message)
    if isinstance(end, SpawnFailed):
        return Outcome(check=check.name, ok=False, message=f"{end.strerror} (os error {end.errno})")
    return Outcome(
        check=check.name,
        ok=False,
        message=f"evidence command timed out after {format_seconds(end.after_s)}s",
    )


def format_seconds(seconds: float) -> str:
    """`10.0` → `10`, `0.5` → `0.5`: the shortest text that reads back as the same float."""
    text = repr(float(seconds))
    return text.removesuffix(".0")


# --- the verdict -------------------------------------------------------------


def verdict(outcomes: Iterable[Outcome]) -> VerificationStatus:
    """SkillSpec's rule: any passing outcome verifies the seed (a PATH hit alone suffices)."""
    return VerificationStatus.VERIFIED if any(o.ok for o in outcomes) else VerificationStatus.FAILED


def build_verification(outcomes: Iterable[Outcome], now_unix: int) -> Verification:
    """The block written over the seed's previous one; SkillSpec keeps no history."""
    kept = tuple(outcomes)
    return Verification(status=verdict(kept), verified_at_unix=now_unix, outcomes=kept)
