"""The disk shell: the only module that reads and writes seed files.

Layout and loading follow SkillSpec (docs/skillspec-compatibility.md, "Store layout",
"Loading a scope"), with the durability SkillSpec lacks ("What this project adds or changes"):

* Every write goes to a temporary file in the target directory, is fsynced and
  renamed over the target, and the directory is fsynced. A reader (ours or the
  SkillSpec CLI) sees the old file or the new one, never a torn one. The
  temporary name `.<file name>.tmp-<random>` ends in neither `.yml` nor `.yaml`,
  so no loader ever picks it up.
* Every read-modify-write holds an inter-process lock on `<root>/.seedstore.lock`,
  so the CLI, the service and the tests can share one store without lost updates.
  Readers take no lock: a rename is atomic.
* A file that cannot be read or parsed never stops a load: it becomes a
  `Problem`, and it is never overwritten.
* Every id and domain argument is checked with the identifier rule (at most
  200 characters) before a path is built from it.
* Reads follow links anywhere, as SkillSpec does; writes never leave the store.
  Every write (temporary file, rename, unlink, fsync) goes through a descriptor
  of its directory, opened component by component below the resolved root with
  O_NOFOLLOW (`open_store_directory`); a directory that resolves outside the
  root is OutsideStore. A seed file that is a link is replaced, never written through.
* A file over MAX_SEED_FILE_BYTES, or that is not a regular file, is a Problem and is never read whole.

Finding the seed a write targets follows SkillSpec: load the whole scope, then
apply the ambiguity and malformed-file rules. A caller that keeps an index (the
service) passes a `Locator` instead; then only the candidate files it names (plus
the files named after the id where SkillSpec would put them) are read again under
the lock, and any sign that the index is out of date sends the write back to the
whole-scope load. The service's locator walks the scope under the lock first, so
the files it names are those on disk at write time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NamedTuple, TypeVar

from agentsidecar.seedstore_service import errors, location
from agentsidecar.seedstore_service.model import ListedSeed, Problem, Seed, Verification
from agentsidecar.seedstore_service.names import MAX_IDENTIFIER_LENGTH, canonical
from agentsidecar.seedstore_service.persisted import (
    ENTRY_ERRORS,
    IndexedFile,
    PersistedIndex,
    assemble_problems,
    mismatch_problem,
    stored_from_entry,
)
from agentsidecar.seedstore_service.ranking import seed_risks
from agentsidecar.seedstore_service.seedtext import (
    MAX_SEED_FILE_BYTES,
    revision_of,
    validate_identifier,
)
from agentsidecar.seedstore_service.walk import SEED_SUFFIXES as SEED_SUFFIXES
from agentsidecar.seedstore_service.walk import file_stem as file_stem
from agentsidecar.seedstore_service.walk import join_path as join_path
from agentsidecar.seedstore_service.walk import os_error_text as os_error_text
from agentsidecar.seedstore_service.walk import walk

# Reads import neither the patch rules, the lock library nor YAML: they are imported by the
# functions that write or parse.
if TYPE_CHECKING:
    import filelock

    from agentsidecar.seedstore_service.patch import AddSpec, UpdatePatch

LOCK_FILE_NAME = ".seedstore.lock"
_TEMP_MARKER = ".tmp-"
_T = TypeVar("_T")
# flock contention is polled; the default 50 ms makes a busy store crawl.
_LOCK_POLL_SECONDS = 0.002
_DEFAULT_LOCK_TIMEOUT_SECONDS = 30.0
_DOMAIN_KEY_LINE = re.compile(r"""^["']?domain["']?\s*:""")

Locator = Callable[[str, str | None], Sequence[str]]
"""(seed id, domain or None) -> the seed files of that scope that hold the id or are named after it.

As far as the caller knows: the store reads each one again under its lock, and
falls back to loading the whole scope when one has vanished or no longer fits.
"""


def resolve_store_root(env: Mapping[str, str]) -> Path:
    """`$SKILLSPEC_HOME/capabilities`, else `$HOME/.skillspec/capabilities`, as given (not absolutized)."""
    skillspec_home = env.get("SKILLSPEC_HOME")
    if skillspec_home is not None:
        # An empty value yields the relative path "capabilities", as in SkillSpec.
        return Path(skillspec_home) / "capabilities"
    home = env.get("HOME")
    if home is not None:
        return Path(home) / ".skillspec" / "capabilities"
    raise errors.StoreUnavailable("HOME is not set; set SKILLSPEC_HOME or HOME")


def spelled_store_root(env: Mapping[str, str]) -> str:
    """The store root as SkillSpec prints it: `resolve_store_root` without pathlib's normalising.

    pathlib drops `.` components and repeated separators (`a/./b//c` is `a/b/c`); Rust's
    PathBuf keeps the text as given, so SkillSpec prints `a/./b//c/capabilities`.
    """
    spelled = location.spelled_store_root(env)
    if spelled is None:
        raise errors.StoreUnavailable("HOME is not set; set SKILLSPEC_HOME or HOME")
    return spelled


@dataclass(frozen=True)
class StoredSeed:
    seed: Seed
    path: str
    revision: str
    # What the file holds that is read but inert (an alias with no letters or digits), as
    # problems of this file; they are reported with the scope's problems.
    notes: tuple[Problem, ...] = ()


@dataclass(frozen=True)
class LoadedScope:
    seeds: tuple[StoredSeed, ...]
    problems: tuple[Problem, ...]


# ---------------------------------------------------------------------------
# Reading: shared by SeedStore.load and SeedIndex.refresh so both see the same
# files and report the same problems.


@dataclass(frozen=True)
class SeedFileRef:
    """A candidate seed file found by the walk."""

    path: str
    # The first directory under the store root (the domain directory); None for
    # files lying directly in the root.
    domain_dir: str | None


@dataclass(frozen=True)
class ParsedFile:
    """What one read of a seed file gave: exactly one of `stored` / `problem` is set."""

    path: str
    stored: StoredSeed | None
    problem: Problem | None
    # Hash of the bytes read ("" when they could not be read).
    revision: str
    # True when the file could not be read at all (as opposed to read but not parsed).
    unreadable: bool
    # os.fstat of the descriptor the bytes were read from; None when unreadable.
    stat_result: os.stat_result | None
    # 1-based line of the `domain:` key, for the "stored under domain" problem.
    domain_line: int


def is_seed_file_name(name: str) -> bool:
    return name.endswith(SEED_SUFFIXES)


def domain_dir_of(root: Path, path: str) -> str | None:
    """The domain directory a walk reports for `path`, spelled as the walk spells paths; None in the root.

    Raises:
        ValueError: `path` is not a file below `root` in that spelling.
    """
    root_text = str(root)
    prefix = "" if root_text == "." else root_text.rstrip(os.sep) + os.sep
    if not path.startswith(prefix):
        raise ValueError(f"{path} is not in {root_text}")
    parts = path[len(prefix) :].split(os.sep)
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"{path} is not in {root_text}")
    return parts[0] if len(parts) > 1 else None


def _identity(stat_result: os.stat_result) -> tuple[int, int]:
    return (stat_result.st_dev, stat_result.st_ino)


def walk_seed_files(
    root: Path,
    domain: str | None,
    directories: dict[str, tuple[str | None, os.stat_result]] | None = None,
) -> tuple[list[SeedFileRef], list[Problem]]:
    """`walk.walk` of the store (its rules), as `SeedFileRef`s and `Problem`s."""
    refs, problems = walk(str(root), domain, directories)
    return (
        [SeedFileRef(path, domain_dir) for path, domain_dir in refs],
        [Problem(path, line, reason) for path, line, reason in problems],
    )


def _domain_key_line(text: str) -> int:
    for number, line in enumerate(text.splitlines(), start=1):
        if _DOMAIN_KEY_LINE.match(line):
            return number
    return 0


def _read_bounded(handle: BinaryIO, size: int) -> bytes:
    """What `handle.read(MAX_SEED_FILE_BYTES + 1)` gives (the bytes up to the end of the file or
    one past the limit), asking first for one byte past `size`, what fstat said the file holds:
    a read asked for the limit allocates a buffer of the limit, for every file.

    A file that holds more than `size` bytes by now (it grew, or its size is not told, as in
    /proc) is read on to the limit.
    """
    data = handle.read(size + 1)
    if len(data) == size + 1:
        data += handle.read(MAX_SEED_FILE_BYTES + 1 - len(data))
    return data


def read_seed_file(path: str, domain_dir: str | None = None, known: StoredSeed | None = None) -> ParsedFile:
    """Read and parse one seed file; never raises for a bad file.

    `domain_dir` only decides whether the line of the `domain:` key is worth
    finding (it is when the declared domain differs from it). `known` is an
    earlier parse of the file (the index's, or of bytes just written): when
    the bytes read now have its revision they are the bytes it was parsed
    from, so it is reused rather than parsed again. Any other bytes are
    parsed, so an edit by another program is never missed.
    """
    read = read_seed_bytes(path)
    if isinstance(read, ParsedFile):
        return read
    return parse_seed_bytes(read, domain_dir, known)


class SeedBytes(NamedTuple):
    """A seed file's bytes as read, with the stat result of the open file and their revision."""

    path: str
    stat_result: os.stat_result
    data: bytes
    revision: str


def read_seed_bytes(path: str) -> SeedBytes | ParsedFile:
    """The bytes of one seed file (`parse_seed_bytes` parses them), or the ParsedFile of a file
    that cannot be read (or is not a regular file, or holds too many bytes); never raises."""
    try:
        # O_NONBLOCK: a FIFO named like a seed must not hang the reader; it is refused below.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        with open(fd, "rb") as handle:
            stat_result = os.fstat(fd)
            if not stat.S_ISREG(stat_result.st_mode):
                reason = f"failed to read {path}: not a regular file"
                return ParsedFile(path, None, Problem(path, 0, reason), "", True, None, 0)
            # The size is checked before reading, and the read is bounded: the file may grow meanwhile.
            data = (
                b""
                if stat_result.st_size > MAX_SEED_FILE_BYTES
                else _read_bounded(handle, stat_result.st_size)
            )
    except OSError as err:
        reason = f"failed to read {path}: {os_error_text(err)}"
        return ParsedFile(path, None, Problem(path, 0, reason), "", True, None, 0)
    if stat_result.st_size > MAX_SEED_FILE_BYTES or len(data) > MAX_SEED_FILE_BYTES:
        size = max(stat_result.st_size, len(data))
        reason = (
            f"failed to read {path}: the file holds {size} bytes, "
            f"more than the {MAX_SEED_FILE_BYTES} a seed file may hold"
        )
        return ParsedFile(path, None, Problem(path, 0, reason), "", False, stat_result, 0)
    return SeedBytes(path, stat_result, data, revision_of(data))


def parse_seed_bytes(
    read: SeedBytes, domain_dir: str | None = None, known: StoredSeed | None = None
) -> ParsedFile:
    """What a seed file's bytes parse to (`domain_dir` and `known`: see `read_seed_file`)."""
    path, stat_result, data, revision = read
    if known is not None and known.revision == revision and known.path == path:
        mismatched = domain_dir is not None and known.seed.domain != domain_dir
        domain_line = _domain_key_line(data.decode("utf-8")) if mismatched else 0
        return ParsedFile(path, known, None, revision, False, stat_result, domain_line)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        reason = f"failed to read {path}: stream did not contain valid UTF-8"
        return ParsedFile(path, None, Problem(path, 0, reason), revision, False, stat_result, 0)
    from agentsidecar.seedstore_service.seedfile import parse_seed_with_notes

    try:
        seed, notes = parse_seed_with_notes(text, path)
    except errors.SeedMalformed as err:
        return ParsedFile(path, None, Problem(path, err.line, err.message), revision, False, stat_result, 0)
    except errors.SeedStoreError as err:
        # validate_seed failures: SkillSpec prints them without the path; the Problem carries it.
        return ParsedFile(path, None, Problem(path, 0, err.message), revision, False, stat_result, 0)
    domain_line = _domain_key_line(text) if domain_dir is not None and seed.domain != domain_dir else 0
    stored = StoredSeed(seed, path, revision, tuple(Problem(path, line, reason) for line, reason in notes))
    return ParsedFile(path, stored, None, revision, False, stat_result, domain_line)


def stored_seed(seed: Seed, path: str, data: bytes) -> StoredSeed:
    """The StoredSeed of `data`, the bytes just written for `seed`, with the notes a read would give."""
    notes: tuple[Problem, ...] = ()
    if not all(canonical(alias) for alias in seed.aliases):
        # Rare (only a file written so by another tool has such an alias): read the lines back.
        from agentsidecar.seedstore_service.seedfile import parse_seed_with_notes

        _, found = parse_seed_with_notes(data.decode("utf-8"), path)
        notes = tuple(Problem(path, line, reason) for line, reason in found)
    return StoredSeed(seed, path, revision_of(data), notes)


def domain_mismatch_problem(stored: StoredSeed, domain: str, line: int) -> Problem:
    return mismatch_problem(stored.path, domain, stored.seed.domain, line)


def malformed_error(problem: Problem) -> errors.SeedMalformed:
    """The error for an operation that targets a file we cannot use; its message is the problem's."""
    prefix = f"failed to parse YAML from {problem.path}: "
    detail = problem.reason.removeprefix(prefix)
    error = errors.SeedMalformed(problem.path, problem.line, detail)
    # Keep SkillSpec's exact message for read errors and domain mismatches too.
    error.message = problem.reason
    error.args = (problem.reason,)
    return error


def _loaded(
    files: list[IndexedFile], domain: str | None, walk_problems: list[Problem], requested: str | None = None
) -> LoadedScope:
    """The scope of the persisted index's entries; with `requested`, without the seeds a search
    of it excludes."""
    seeds = [
        stored_from_entry(indexed.path, indexed.entry)
        for indexed in files
        if indexed.in_scope(domain) and (requested is None or indexed.could_match(requested))
    ]
    return LoadedScope(tuple(seeds), tuple(assemble_problems(files, domain, walk_problems)))


def scope_from_files(
    parsed_files: Iterable[ParsedFile], domain: str | None, walk_problems: Iterable[Problem] = ()
) -> LoadedScope:
    """The LoadedScope of already parsed files, with the --domain rule applied when `domain` is set."""
    seeds: list[StoredSeed] = []
    problems: list[Problem] = list(walk_problems)
    for parsed in parsed_files:
        if parsed.problem is not None:
            problems.append(parsed.problem)
        elif parsed.stored is not None:
            if domain is not None and parsed.stored.seed.domain != domain:
                problems.append(domain_mismatch_problem(parsed.stored, domain, parsed.domain_line))
            else:
                seeds.append(parsed.stored)
                problems.extend(parsed.stored.notes)
    seeds.sort(key=lambda stored: stored.path)
    problems.sort(key=lambda problem: problem.path)
    return LoadedScope(tuple(seeds), tuple(problems))


def locate_in_scope(
    scope: LoadedScope, seed_id: str, loaded_paths: Iterable[str] | None = None
) -> StoredSeed:
    """The single seed with that id in a loaded scope, or the SkillSpec error for why not.

    `loaded_paths`: the paths of every seed the whole scope loads, when `scope.seeds`
    holds only those that can match (the problems are always the whole scope's).
    """
    matches = [stored for stored in scope.seeds if stored.seed.id == seed_id]
    if len(matches) > 1:
        raise errors.AmbiguousSeed(seed_id, [stored.path for stored in matches])
    if matches:
        return matches[0]
    loaded = set(loaded_paths) if loaded_paths is not None else {stored.path for stored in scope.seeds}
    for problem in scope.problems:
        if file_stem(problem.path) == seed_id and problem.path not in loaded:
            # The broken file may well be this seed: never guess, never overwrite it.
            raise malformed_error(problem)
    raise errors.SeedNotFound(seed_id)


# ---------------------------------------------------------------------------
# Writing


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_store_directory(root: Path, directory: Path, *, create: bool = False) -> int:
    """A descriptor of `directory`, which must lie inside the store `root` once links are resolved.

    This is the store's trust boundary for writes: reads follow links anywhere
    (as SkillSpec does), writes never leave the root. `directory` is resolved,
    checked against the resolved root, then opened one component at a time from
    the root with O_NOFOLLOW, so a component swapped for a link after the check
    fails the open instead of leading elsewhere. Every write then goes through
    the descriptor. With `create`, missing components are created on the way.

    Raises:
        OutsideStore: `directory` resolves outside the root.
        OSError: any I/O failure (a component that is not a directory, or turned into a link).
    """
    root_real = os.path.realpath(root)
    real = os.path.realpath(directory)
    if real != root_real and not real.startswith(root_real.rstrip(os.sep) + os.sep):
        raise errors.OutsideStore(str(directory), str(root))
    fd = os.open(root_real, _DIRECTORY_FLAGS)
    try:
        relative = os.path.relpath(real, root_real)
        for part in [] if relative == "." else relative.split(os.sep):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            child = os.open(part, _DIRECTORY_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomically(root: Path, path: Path, data: bytes) -> None:
    """Replace `path` (inside the store `root`) with `data`, never leaving a torn file.

    The temporary file, the rename and the fsyncs all go through a descriptor of
    the target's directory (`open_store_directory`). A target that is a link is
    replaced by the new file; the file it pointed to is left alone.

    Raises OutsideStore when the directory resolves outside the store, and
    StoreUnavailable("failed to write <path>: ...") on any I/O error, after
    removing the temporary file.
    """
    name = path.name
    temp_name: str | None = None
    directory_fd: int | None = None
    try:
        directory_fd = open_store_directory(root, path.parent, create=True)
        try:
            # Keep the mode of the file being replaced, as an in-place write would.
            mode = stat.S_IMODE(os.stat(name, dir_fd=directory_fd).st_mode)
        except FileNotFoundError:
            mode = None
        # The name is cut so that any target name leaves room for the marker and suffix.
        stem = name[:MAX_IDENTIFIER_LENGTH]
        while True:
            candidate = f".{stem}{_TEMP_MARKER}{os.urandom(6).hex()}"
            try:
                # 0o666 before the umask: the permissions a plain write would give.
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
                fd = os.open(candidate, flags, 0o666, dir_fd=directory_fd)
            except FileExistsError:
                continue
            temp_name = candidate
            break
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp_name, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
        temp_name = None
        os.fsync(directory_fd)
    except OSError as err:
        raise errors.StoreUnavailable(f"failed to write {path}: {os_error_text(err)}") from err
    finally:
        if directory_fd is not None:
            if temp_name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temp_name, dir_fd=directory_fd)
            os.close(directory_fd)


def remove_file(root: Path, path: Path) -> None:
    """Unlink `path` (a link itself, not what it points to) through its directory inside the store.

    Raises OutsideStore or StoreUnavailable, as `write_atomically` does.
    """
    try:
        directory_fd = open_store_directory(root, path.parent)
        try:
            os.unlink(path.name, dir_fd=directory_fd)
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)
    except OSError as err:
        raise errors.StoreUnavailable(f"failed to remove {path}: {os_error_text(err)}") from err


def dump_seed_text(seed: Seed) -> str:
    from agentsidecar.seedstore_service.seedfile import dump_seed

    return dump_seed(seed)


def _seed_bytes(seed: Seed) -> bytes:
    """The file for `seed`; InvalidArgument when it would be more than a seed file may hold."""
    data = dump_seed_text(seed).encode("utf-8")
    if len(data) > MAX_SEED_FILE_BYTES:
        raise errors.InvalidArgument(
            f"the seed would take {len(data)} bytes, more than the {MAX_SEED_FILE_BYTES} "
            "a seed file may hold",
            "request",
        )
    return data


# ---------------------------------------------------------------------------


def listed_seed(seed: Seed, path: str, revision: str) -> ListedSeed:
    """The `list` row of a seed read from `path`."""
    return ListedSeed(
        id=seed.id,
        domain=seed.domain,
        kind=seed.kind,
        path=path,
        provides=seed.provides,
        verification_status=seed.verification_status,
        risks=seed_risks(seed),
        revision=revision,
    )


class SeedStore:
    """A SkillSpec capability seed store rooted at `root` (`.../capabilities`)."""

    def __init__(
        self,
        root: Path,
        *,
        lock_timeout: float = _DEFAULT_LOCK_TIMEOUT_SECONDS,
        persisted_index: bool = True,
        record_writes: bool = True,
    ) -> None:
        """`persisted_index`: keep what the files parsed to in `<root>/.seedstore-index/` (persisted.py)."""
        self.root = root
        self._lock_path = root / LOCK_FILE_NAME
        self._lock_timeout = lock_timeout
        self._lock: filelock.BaseFileLock | None = None  # made on first use: reads seldom need it
        self.persisted = PersistedIndex(root, self._try_locked) if persisted_index else None
        # Put each file this store writes into the persisted index at once. The service does
        # not: its in-memory index saves the sections that changed after each refresh, and
        # an entry a write left stale is only read again at the next start.
        self._record_writes = record_writes

    def __repr__(self) -> str:
        return f"SeedStore({str(self.root)!r})"

    # -- reading ---------------------------------------------------------

    def load(self, domain: str | None) -> LoadedScope:
        """Every seed in scope plus a Problem per file that could not be used; never raises for a file."""
        if domain is not None:
            validate_identifier(domain, "domain")
        if self.persisted is not None:
            return self._from_entries(
                domain, lambda files, walk_problems: _loaded(files, domain, walk_problems)
            )
        refs, walk_problems = walk_seed_files(self.root, domain)
        parsed = [read_seed_file(ref.path, ref.domain_dir) for ref in refs]
        return scope_from_files(parsed, domain, walk_problems)

    def load_for_search(self, domain: str | None, requested: str) -> LoadedScope:
        """`load(domain)` without seeds a search of `requested` (a canonical term) excludes for not matching.

        Those seeds change no search result; the problems are the whole scope's.
        """
        if self.persisted is None or not requested:
            return self.load(domain)
        if domain is not None:
            validate_identifier(domain, "domain")
        return self._from_entries(
            domain, lambda files, walk_problems: _loaded(files, domain, walk_problems, requested)
        )

    def listing(self, domain: str | None) -> tuple[tuple[ListedSeed, ...], tuple[Problem, ...]]:
        """The `list` rows of the scope and its problems; no Seed is built for a seed the index holds."""
        if domain is not None:
            validate_identifier(domain, "domain")
        if self.persisted is None:
            scope = self.load(domain)
            rows = tuple(listed_seed(stored.seed, stored.path, stored.revision) for stored in scope.seeds)
            return rows, scope.problems

        def listed(
            files: list[IndexedFile], walk_problems: list[Problem]
        ) -> tuple[tuple[ListedSeed, ...], tuple[Problem, ...]]:
            rows = tuple(indexed.listed() for indexed in files if indexed.in_scope(domain))
            return rows, tuple(assemble_problems(files, domain, walk_problems))

        return self._from_entries(domain, listed)

    def locate(self, seed_id: str, domain: str | None) -> tuple[StoredSeed, tuple[Problem, ...]]:
        validate_identifier(seed_id, "capability id")
        if domain is not None:
            validate_identifier(domain, "domain")
        if self.persisted is not None:
            # Only the seeds holding the id are built; the answer is the whole scope's.
            def matching(
                files: list[IndexedFile], walk_problems: list[Problem]
            ) -> tuple[LoadedScope, list[str]]:
                loaded = [indexed for indexed in files if indexed.in_scope(domain)]
                matches = tuple(
                    stored_from_entry(indexed.path, indexed.entry)
                    for indexed in loaded
                    if indexed.seed_id == seed_id
                )
                return LoadedScope(matches, tuple(assemble_problems(files, domain, walk_problems))), [
                    indexed.path for indexed in loaded
                ]

            scope, paths = self._from_entries(domain, matching)
            return locate_in_scope(scope, seed_id, paths), scope.problems
        scope = self.load(domain)
        return locate_in_scope(scope, seed_id), scope.problems

    def _from_entries(
        self, domain: str | None, answer: Callable[[list[IndexedFile], list[Problem]], _T]
    ) -> _T:
        """`answer` of the persisted index's entries for the scope; when an entry holds values
        the index never writes (`persisted.ENTRY_ERRORS`), `answer` of entries made from the files."""
        assert self.persisted is not None
        files, walk_problems = self.persisted.scan(domain)
        try:
            return answer(files, walk_problems)
        except ENTRY_ERRORS:
            files, walk_problems = self.persisted.scan(domain, trust=False)
            return answer(files, walk_problems)

    def _locate_for_write(
        self, seed_id: str, domain: str | None, locate: Locator | None
    ) -> tuple[StoredSeed, tuple[Problem, ...]]:
        """The seed a write targets, read from disk now (the caller holds the lock).

        Without a locator: the whole scope, as SkillSpec loads it. With one: the
        candidate files only, and the problems returned are those among them.
        """
        if locate is None:
            return self.locate(seed_id, domain)
        located = self._locate_among(seed_id, domain, locate(seed_id, domain))
        if located is None:
            return self.locate(seed_id, domain)
        return located

    def _locate_among(
        self, seed_id: str, domain: str | None, candidates: Iterable[str]
    ) -> tuple[StoredSeed, tuple[Problem, ...]] | None:
        """`locate` over the candidate files, or None when they show the locator is out of date.

        The rules are the whole-scope ones (`scope_from_files`, `locate_in_scope`),
        so the answer is the same as long as no other file of the scope holds the
        id or is named after it.
        """
        parsed_files: list[ParsedFile] = []
        for path in sorted({*candidates, *self._files_named_after(seed_id, domain)}):
            try:
                domain_dir = domain_dir_of(self.root, path)
            except ValueError:
                return None  # not a path a walk of this store gives
            if domain is not None and domain_dir != domain:
                continue  # outside the scope
            parsed = read_seed_file(path, domain_dir)
            if parsed.unreadable and (not os.path.lexists(path) or os.path.isdir(path)):
                return None  # vanished (or never a file): the seed may have moved
            holds_id = parsed.stored is not None and parsed.stored.seed.id == seed_id
            if not holds_id and file_stem(path) != seed_id:
                return None  # now holds another seed: the seed may have moved
            parsed_files.append(parsed)
        scope = scope_from_files(parsed_files, domain)
        return locate_in_scope(scope, seed_id), scope.problems

    def _files_named_after(self, seed_id: str, domain: str | None) -> list[str]:
        """`<id>.yml` / `<id>.yaml` in the scope's domain directories (and the root, for the whole store).

        Where SkillSpec and `add` put a seed: so a seed another program added since
        the locator last looked still counts, for ambiguity too. Directories are
        taken as the walk takes them (symlinks followed, a link back to the root skipped).
        """
        root = str(self.root)
        directories: list[str] = []
        if domain is not None:
            directories.append(join_path(root, domain))
        else:
            directories.append(root)
            try:
                root_stat = os.stat(root)
                root_identity = (root_stat.st_dev, root_stat.st_ino)
                with os.scandir(root) as entries:
                    for entry in entries:
                        with contextlib.suppress(OSError):
                            if entry.is_dir() and _identity(entry.stat()) != root_identity:
                                directories.append(join_path(root, entry.name))
            except OSError:
                pass  # no readable root: nothing named after the id either
        found: list[str] = []
        for directory in directories:
            for suffix in SEED_SUFFIXES:
                path = join_path(directory, seed_id + suffix)
                if os.path.lexists(path) and not os.path.isdir(path):
                    found.append(path)
        return found

    # -- writing ---------------------------------------------------------

    def add(self, spec: AddSpec) -> StoredSeed:
        """Write `<root>/<domain>/<id>.yml`; it may replace a valid seed there, never a broken file."""
        from agentsidecar.seedstore_service.patch import build_seed

        seed = build_seed(spec)
        validate_identifier(seed.id, "capability id")
        validate_identifier(seed.domain, "domain")
        path = self.root / seed.domain / f"{seed.id}.yml"
        data = _seed_bytes(seed)
        with self._locked():
            self._refuse_unusable_file(path)
            write_atomically(self.root, path, data)
            stored = stored_seed(seed, str(path), data)
            self._record(str(path), stored)
        return stored

    def update(
        self,
        seed_id: str,
        domain: str | None,
        patch: UpdatePatch,
        *,
        expected_revision: str | None,
        now_unix: int,
        locate: Locator | None = None,
    ) -> tuple[StoredSeed, tuple[Problem, ...]]:
        """Patch the seed and write it back to its file.

        Returns the written seed and the problems of the scope (with `locate`:
        only those among the candidate files).
        """
        # SkillSpec's order: the target, priority and ties; the seed; then every other value.
        self._validate_target(seed_id, domain)
        from agentsidecar.seedstore_service.patch import (
            apply_patch,
            validate_patch,
            validate_patch_before_load,
        )

        validate_patch_before_load(patch)
        self._require_root(seed_id)
        with self._locked():
            current, problems = self._locate_for_write(seed_id, domain, locate)
            validate_patch(patch)
            self._check_revision(current, expected_revision)
            updated = self._rewrite(current, apply_patch(current.seed, patch, now_unix))
        return updated, problems

    def prefer(
        self,
        seed_id: str,
        domain: str | None,
        for_capability: str,
        priority: int | None,
        *,
        expected_revision: str | None = None,
        locate: Locator | None = None,
    ) -> tuple[StoredSeed, tuple[Problem, ...]]:
        self._validate_target(seed_id, domain)
        from agentsidecar.seedstore_service.patch import apply_prefer, validate_prefer

        validate_prefer(for_capability, priority)
        self._require_root(seed_id)
        with self._locked():
            current, problems = self._locate_for_write(seed_id, domain, locate)
            self._check_revision(current, expected_revision)
            updated = self._rewrite(current, apply_prefer(current.seed, for_capability, priority))
        return updated, problems

    def remove(
        self, seed_id: str, domain: str | None, *, locate: Locator | None = None
    ) -> tuple[str, tuple[Problem, ...]]:
        """Delete the seed's file; the (possibly empty) domain directory stays, as in SkillSpec."""
        self._validate_target(seed_id, domain)
        self._require_root(seed_id)
        with self._locked():
            current, problems = self._locate_for_write(seed_id, domain, locate)
            remove_file(self.root, Path(current.path))
            self._record(current.path, None)
        return current.path, problems

    def write_verification(
        self, path: str, seed_id: str, verification: Verification, *, known: StoredSeed | None = None
    ) -> StoredSeed:
        """Replace only the verification block of the seed at `path`.

        The checks ran without the lock, so the file is read again under it:
        edits made meanwhile are kept. A file that vanished or now holds
        another seed is SeedNotFound; one that no longer parses is SeedMalformed.
        `known` (the seed as the checks found it) saves parsing the file again
        when it has not changed since (see `read_seed_file`).
        """
        validate_identifier(seed_id, "capability id")
        target = self._path_in_store(path)
        self._require_root(seed_id)
        with self._locked():
            parsed = read_seed_file(str(target), known=known)
            if parsed.stored is None:
                assert parsed.problem is not None
                if parsed.unreadable and not target.exists():
                    raise errors.SeedNotFound(seed_id)
                raise malformed_error(parsed.problem)
            if parsed.stored.seed.id != seed_id:
                raise errors.SeedNotFound(seed_id)
            return self._rewrite(
                parsed.stored, dataclasses.replace(parsed.stored.seed, verification=verification)
            )

    # -- helpers ---------------------------------------------------------

    def _file_lock(self) -> filelock.BaseFileLock:
        if self._lock is None:
            import filelock

            self._lock = filelock.FileLock(str(self._lock_path), timeout=self._lock_timeout)
        return self._lock

    @contextlib.contextmanager
    def _try_locked(self) -> Iterator[bool]:
        """Hold the store's lock if it is free now (or already held here); yields whether it is held."""
        import filelock

        lock = self._file_lock()
        try:
            lock.acquire(timeout=0)
        except (filelock.Timeout, OSError):
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import filelock

        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise errors.StoreUnavailable(f"failed to write {self.root}: {os_error_text(err)}") from err
        lock = self._file_lock()
        try:
            lock.acquire(poll_interval=_LOCK_POLL_SECONDS)
        except filelock.Timeout as err:
            raise errors.StoreUnavailable(f"timed out waiting for the store lock {self._lock_path}") from err
        except OSError as err:
            raise errors.StoreUnavailable(f"failed to lock {self._lock_path}: {os_error_text(err)}") from err
        try:
            yield
        finally:
            lock.release()

    @staticmethod
    def _validate_target(seed_id: str, domain: str | None) -> None:
        validate_identifier(seed_id, "capability id")
        if domain is not None:
            validate_identifier(domain, "domain")

    def _require_root(self, seed_id: str) -> None:
        # Editing a seed of a store that does not exist must not create the store.
        if not self.root.is_dir():
            raise errors.SeedNotFound(seed_id)

    @staticmethod
    def _check_revision(current: StoredSeed, expected_revision: str | None) -> None:
        if expected_revision is not None and expected_revision != current.revision:
            raise errors.RevisionMismatch(current.seed.id, expected_revision, current.revision)

    def _rewrite(self, current: StoredSeed, seed: Seed) -> StoredSeed:
        """Write `seed` back to the file it was found in (its name may differ from the id)."""
        data = _seed_bytes(seed)
        write_atomically(self.root, Path(current.path), data)
        stored = stored_seed(seed, current.path, data)
        self._record(current.path, stored)
        return stored

    def _record(self, path: str, stored: StoredSeed | None) -> None:
        """Tell the persisted index what a write left in `path` (the caller holds the lock)."""
        if self.persisted is None or not self._record_writes:
            return
        if stored is None:
            self.persisted.record(path, None, 0, locked=True)
            return
        checked_ns = time.time_ns()
        try:
            domain_dir = domain_dir_of(self.root, path)
            stat_result = os.stat(path)
        except (ValueError, OSError):
            return
        # The file was written moments ago, so its entry is racy: the next load compares its
        # bytes with this revision, and an edit made since by another program is seen then.
        domain_line = 0
        if domain_dir is not None and stored.seed.domain != domain_dir:
            domain_line = _domain_key_line(dump_seed_text(stored.seed))
        parsed = ParsedFile(path, stored, None, stored.revision, False, stat_result, domain_line)
        self.persisted.record(path, parsed, checked_ns, locked=True)

    @staticmethod
    def _refuse_unusable_file(path: Path) -> None:
        if not os.path.lexists(path):
            return
        parsed = read_seed_file(str(path))
        if parsed.problem is None:
            return
        if parsed.unreadable:
            raise errors.StoreUnavailable(parsed.problem.reason)
        raise malformed_error(parsed.problem)

    def _path_in_store(self, path: str) -> Path:
        """`path` if it names a seed file inside this store; checked lexically, like the identifier rule."""
        target = Path(path)
        if (
            not is_seed_file_name(target.name)
            or ".." in target.parts
            or not target.is_relative_to(self.root)
            or target == self.root
        ):
            raise errors.InvalidArgument(f"{path} is not a seed file in the store {self.root}", "path")
        return target
