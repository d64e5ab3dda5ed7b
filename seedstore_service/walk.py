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
    # (path, the domain directory of the files in it or None in the root)
    FileRef = tuple[str, str | None]
    # (a listed directory's path prefix, `join_path(directory, "")`; the domain directory of the
    # files in it or None in the root; the entries of its seed files, in the listing's order)
    DirectoryFiles = tuple[str, str | None, list[os.DirEntry[str]]]
    # (path, line, reason), a `model.Problem`'s fields
    WalkProblem = tuple[str, int, str]

SEED_SUFFIXES = (".yml", ".yaml")


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
    start_path = root if domain is None else join_path(root, domain)
    listed: list[DirectoryFiles] = []
    problems: list[WalkProblem] = []
    try:
        start_stat = os.stat(start_path)
    except FileNotFoundError:
        return listed, problems
    except OSError as err:
        problems.append((start_path, 0, f"failed to read {start_path}: {os_error_text(err)}"))
        return listed, problems
    if domain is not None and not stat.S_ISDIR(start_stat.st_mode):
        return listed, problems  # a stray file named like the domain: a whole-store walk ignores it too
    ancestors: frozenset[tuple[int, int]] = frozenset({(start_stat.st_dev, start_stat.st_ino)})
    if domain is not None:
        try:
            root_stat = os.stat(root)
        except OSError:
            pass
        else:
            ancestors |= {(root_stat.st_dev, root_stat.st_ino)}
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
            seed_files = listing if _all_seed_names(listing) else [e for e in listing if _is_seed_name(e)]
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


_path_of = itemgetter(0)
_name_of = attrgetter("name")
_is_dir = os.DirEntry.is_dir


def _is_seed_name(entry: os.DirEntry[str]) -> bool:
    return entry.name.endswith(SEED_SUFFIXES)


def _all_seed_names(entries: list[os.DirEntry[str]]) -> bool:
    """Whether every entry's name ends with a seed suffix, counted in one text: a name holds no
    NUL, so in the names each followed by one, a suffix followed by a NUL ends a name, and a name
    ends with at most one of the suffixes."""
    text = "\0".join(map(_name_of, entries)) + "\0"
    return sum(text.count(suffix + "\0") for suffix in SEED_SUFFIXES) == len(entries)
