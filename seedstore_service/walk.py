"""Which files of a store are seed files: the directory walk, on plain strings and tuples.

Imports only `os`, `stat` and `operator`: the read commands that answer from the
persisted index (quickread.py) walk the store exactly as a load does, through this
one walk (`walk_directories`, which `walk` flattens); store.py wraps `walk`'s results
in `SeedFileRef` and `Problem`.
"""

from __future__ import annotations

import os
import stat
from operator import attrgetter, itemgetter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import TypeVar

    # (path, the domain directory of the files in it or None in the root)
    FileRef = tuple[str, str | None]
    # (a listed directory's path prefix, `join_path(directory, "")`; the domain directory of the
    # files in it or None in the root; the entries of its seed files, in the listing's order)
    DirectoryFiles = tuple[str, str | None, list[os.DirEntry[str]]]
    _T = TypeVar("_T")
    # (path, line, reason), a `model.Problem`'s fields
    WalkProblem = tuple[str, int, str]

SEED_SUFFIXES = (".yml", ".yaml")


def file_stem(path: str) -> str:
    """The file name without its seed suffix: what a broken file is taken to be named after."""
    name = os.path.basename(path)
    for suffix in SEED_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def os_error_text(err: OSError) -> str:
    """An OSError as Rust's io::Error prints it, e.g. `No such file or directory (os error 2)`."""
    if err.errno is not None and err.strerror:
        return f"{err.strerror} (os error {err.errno})"
    return str(err)


def join_path(directory: str, name: str) -> str:
    """`str(Path(directory) / name)` for a plain entry name, without pathlib's cost.

    A walk of 10,000 files spent most of its time building Path objects.
    """
    if directory == ".":
        return name
    return directory + name if directory.endswith(os.sep) else directory + os.sep + name


def walk(
    root: str,
    domain: str | None,
    directories: dict[str, tuple[str | None, os.stat_result]] | None = None,
) -> tuple[list[FileRef], list[WalkProblem]]:
    """Seed files of the whole store, or of `<root>/<domain>` only, sorted by path.

    `root` is spelled as `str(pathlib.Path)` spells it and `domain` is an identifier.
    `directories`, when given, receives each directory listed: its path, the
    domain directory of the files in it, and its stat taken before it was listed.

    Recursive, following symlinks like SkillSpec, but with a loop guard: a
    directory that is its own ancestor is skipped. The guard starts from the
    root even for a domain walk, so a domain walk finds exactly the files a
    whole-store walk finds under that domain. A missing directory is an empty
    scope; an unreadable directory is a problem.
    """
    listed, problems = walk_directories(root, domain, directories)
    files = [(prefix + entry.name, domain_dir) for prefix, domain_dir, entries in listed for entry in entries]
    files.sort(key=_path_of)
    return files, problems


def walk_directories(
    root: str,
    domain: str | None,
    directories: dict[str, tuple[str | None, os.stat_result]] | None = None,
) -> tuple[list[DirectoryFiles], list[WalkProblem]]:
    """`walk`'s seed files by the directory holding them, each directory's in the order the system
    listed them, the directories in the order they were listed (those holding none left out);
    the problems sorted by path. A file's path is its directory's prefix and its entry's name.
    """
    listed: list[DirectoryFiles] = []
    problems: list[WalkProblem] = []
    start_path, start_stat, ancestors, problem = _start(root, domain)
    if problem is not None:
        problems.append(problem)
    if start_stat is None:
        return listed, problems
    # (directory, the domain directory of the files in it, identities of it and its ancestors)
    pending: list[tuple[str, str | None, frozenset[tuple[int, int]]]] = [(start_path, domain, ancestors)]
    if directories is not None:
        directories[start_path] = (domain, start_stat)
    while pending:
        directory, domain_dir, chain = pending.pop()
        try:
            with os.scandir(directory) as entries:
                listing = list(entries)
        except OSError as err:
            problems.append((directory, 0, f"failed to read {directory}: {os_error_text(err)}"))
            continue
        prefix = join_path(directory, "")
        try:
            kinds = list(map(_is_dir, listing))  # follows symlinks
        except OSError:
            kinds = None  # one whose kind cannot be told: the loop below counts it as no directory
        if kinds is not None and not any(kinds):
            # Files only (a domain directory, mostly): the seed files are those with a seed suffix.
            all_seeds = _all_seed_names(map(_name_of, listing))
            seed_files = listing if all_seeds else [e for e in listing if _is_seed_name(e)]
        else:
            seed_files = []
            for entry in listing:
                try:
                    is_dir = entry.is_dir()  # follows symlinks
                except OSError:
                    is_dir = False
                if not is_dir:
                    if entry.name.endswith(SEED_SUFFIXES):
                        seed_files.append(entry)
                    continue
                path = prefix + entry.name
                try:
                    entry_stat = entry.stat()
                except OSError as err:
                    problems.append((path, 0, f"failed to read {path}: {os_error_text(err)}"))
                    continue
                identity = (entry_stat.st_dev, entry_stat.st_ino)
                if identity in chain:
                    continue  # a symlink loop; SkillSpec would recurse forever
                child_domain_dir = entry.name if domain_dir is None else domain_dir
                pending.append((path, child_domain_dir, chain | {identity}))
                if directories is not None:
                    directories[path] = (child_domain_dir, entry_stat)
        if seed_files:
            listed.append((prefix, domain_dir, seed_files))
    problems.sort(key=_path_of)
    return listed, problems


def _start(
    root: str, domain: str | None
) -> tuple[str, os.stat_result | None, frozenset[tuple[int, int]], WalkProblem | None]:
    """Where a walk starts: its directory, that directory's stat (None when the scope is empty),
    the identities the loop guard starts from, and the problem when it cannot be read."""
    start_path = root if domain is None else join_path(root, domain)
    nothing: frozenset[tuple[int, int]] = frozenset()
    try:
        start_stat = os.stat(start_path)
    except FileNotFoundError:
        return start_path, None, nothing, None
    except OSError as err:
        return (
            start_path,
            None,
            nothing,
            (start_path, 0, f"failed to read {start_path}: {os_error_text(err)}"),
        )
    if domain is not None and not stat.S_ISDIR(start_stat.st_mode):
        return (
            start_path,
            None,
            nothing,
            None,
        )  # a stray file named like the domain: a whole-store walk ignores it too
    ancestors: frozenset[tuple[int, int]] = frozenset({(start_stat.st_dev, start_stat.st_ino)})
    if domain is not None:
        try:
            root_stat = os.stat(root)
        except OSError:
            pass
        else:
            ancestors |= {(root_stat.st_dev, root_stat.st_ino)}
    return start_path, start_stat, ancestors, None


def walk_stats(
    root: str,
    domain: str | None,
    summary: Callable[[list[os.stat_result], list[tuple[int, ...]]], _T],
) -> list[tuple[str | None, list[tuple[list[str], _T]]]] | None:
    """The seed files `walk` finds, with each one's stat taken after its directory was listed, by
    the section holding them (the domain directory, or None for the root's files): for each
    directory holding any, in the order listed, the files' names relative to the section's
    directory, sorted, and `summary` of their stat results in that order and of those results'
    integer fields by column (`zip(*stats)`: a stat result is the tuple of st_mode, st_ino,
    st_dev, ...), made before the next directory is listed, so the stat results need not be
    kept; or None when the walk would report a problem, or a name listed cannot be stat'ed.

    The same walk on names and stat results instead of directory entries: a name is a
    directory when its stat (following symlinks, as `DirEntry.is_dir` does) says so, and
    every name is stat'ed (a seed file's stat is what an answer from the index needs).
    Where a stat fails, `walk` would count the name as a file or try to list it: this
    walk gives up instead, so it finds exactly `walk`'s files whenever it answers.
    """
    start_path, start_stat, ancestors, problem = _start(root, domain)
    if problem is not None:
        return None
    if start_stat is None:
        return []
    by_section: dict[str | None, list[tuple[list[str], _T]]] = {}
    # (directory, its path relative to its section's directory, the domain directory of the
    # files in it, identities of it and its ancestors)
    pending: list[tuple[str, str, str | None, frozenset[tuple[int, int]]]] = [
        (start_path, "", domain, ancestors)
    ]
    try:
        while pending:
            directory, inner, domain_dir, chain = pending.pop()
            prefix = join_path(directory, "")
            listed: list[tuple[str, os.stat_result, bool]] | None = None
            fd = os.open(directory, _DIRECTORY_FLAGS)
            try:
                names = os.listdir(fd)
                if _all_seed_names(names):
                    # Seed names only (a domain directory, mostly): every name is stat'ed, each
                    # looked up in the directory listed (the kernel walks one name, not the path).
                    names.sort()
                    stats = [os.stat(name, dir_fd=fd) for name in names]
                else:
                    stats = []
            finally:
                os.close(fd)
            by_field = list(zip(*stats, strict=True))  # st_mode first
            if stats and any(map(stat.S_ISDIR, by_field[0])):
                listed = [(n, r, stat.S_ISDIR(r.st_mode)) for n, r in zip(names, stats, strict=True)]
            elif not stats and names:
                # Other names too: each one's kind as the listing tells it, as `walk` takes it.
                listed = []
                with os.scandir(directory) as entries:
                    for entry in entries:
                        try:
                            is_dir = entry.is_dir()  # follows symlinks
                        except OSError:
                            is_dir = False
                        if is_dir or entry.name.endswith(SEED_SUFFIXES):
                            listed.append((entry.name, entry.stat(), is_dir))
                listed.sort(key=_path_of)
            if listed is not None:
                names, stats = [], []
                by_field = []
                for name, stat_result, is_dir in listed:
                    if not is_dir:
                        names.append(name)
                        stats.append(stat_result)
                        continue
                    identity = (stat_result.st_dev, stat_result.st_ino)
                    if identity in chain:
                        continue  # a symlink loop; SkillSpec would recurse forever
                    child_domain_dir = name if domain_dir is None else domain_dir
                    child_inner = inner + name + os.sep if domain_dir is not None else ""
                    pending.append((prefix + name, child_inner, child_domain_dir, chain | {identity}))
            if names:
                if inner:
                    names = list(map(inner.__add__, names))
                if not by_field:
                    by_field = list(zip(*stats, strict=True))
                by_section.setdefault(domain_dir, []).append((names, summary(stats, by_field)))
    except OSError:
        return None  # a directory `walk` reports, or a name that went or cannot be stat'ed
    return list(by_section.items())


_path_of = itemgetter(0)
_name_of = attrgetter("name")
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_is_dir = os.DirEntry.is_dir


def _is_seed_name(entry: os.DirEntry[str]) -> bool:
    return entry.name.endswith(SEED_SUFFIXES)


def _all_seed_names(names: Iterable[str]) -> bool:
    """Whether every name ends with a seed suffix, counted in one text: a name holds no NUL, so
    in the names each followed by one, a suffix followed by a NUL ends a name, and a name ends
    with at most one of the suffixes (so once the counts so far reach the number of names, every
    name is counted and the other suffixes' counts are 0)."""
    listed = list(names)
    text = "\0".join(listed) + "\0"
    counted = 0
    for suffix in SEED_SUFFIXES:
        counted += text.count(suffix + "\0")
        if counted == len(listed):
            return True
    return False
