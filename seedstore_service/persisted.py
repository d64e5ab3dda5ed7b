"""The persisted index: what each seed file parsed to, kept on disk so a load need not parse YAML.

The files stay the source of truth; the index only saves parsing them again.

* Where: `<root>/.seedstore-index/`, one file per section of the store (each
  domain directory, and the files lying in the root). The names end in `.json`,
  never `.yml`/`.yaml`, so neither SkillSpec nor our loader reads them as seeds.
  A domain load reads its own section only.
* Trust: an entry is used only while the file's signature is what it was when
  the file was read: size, mtime_ns, ctime_ns, inode and device (ctime cannot
  be set back by another program, so an edit that restores the mtime is still
  seen). A file whose mtime or ctime lies within `RACY_WINDOW_NS` of the read
  that made its entry is read again on every load and its bytes compared
  (by revision, a hash): coarse file-system clocks could give a same-size edit
  inside one tick the same signature. New and removed files are found by the
  directory walk every load already does.
* Directories: each section also records the signature (mtime_ns, ctime_ns,
  inode, device) of every directory its files were listed from, taken before
  the listing, and the root section that of the store root and the domain
  directories it held (`DirectoryRecord`). Creating, removing or renaming an
  entry changes its directory's mtime and ctime, so a start that finds every
  recorded directory unchanged, and none changed within `RACY_WINDOW_NS` of the
  listing, knows the section names every file there is; any other section is
  listed again before it is used.
* Integrity: a file is a header line (format, version, store root, section,
  the body's length and CRC-32) and a body: one JSON line of the entries by
  column, then each entry's seed JSON text on a line of its own (decoded only
  for a seed an answer shows). A truncated, foreign, corrupt
  or other-version file is ignored, and the section rebuilt from the seed files.
* Writing: a section is rewritten only when something in it changed, to a
  temporary name in the index directory then renamed over the old one (through
  a descriptor of that directory, as every write of the store is), while
  holding the store's lock. Readers take the lock without waiting: when a writer
  holds it they skip saving (the next load saves). Two writers never interleave,
  and a reader always sees a whole file. Saving is best effort: a read-only store
  still loads, from the seed files.

`load_scope` answers exactly what `store.load` from the files answers; the
tests compare the two on random edit sequences.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import stat
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from agentsidecar.seedstore_service.model import ListedSeed, Problem, VerificationStatus
from agentsidecar.seedstore_service.ranking import could_match, match_keys
from agentsidecar.seedstore_service.seedtext import seed_from_json, seed_to_json

INDEX_DIR_NAME = ".seedstore-index"
FORMAT = "agentsidecar-seedstore-index"
VERSION = 3
# A file modified this close to the read that made its entry is compared by content on every load.
RACY_WINDOW_NS = 2_000_000_000
_ROOT_SECTION = "root"
_IDENTIFIER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW
# The most an index file may hold: a million seeds' entries, far beyond any store.
_MAX_INDEX_BYTES = 1 << 30

# An entry, as stored (a JSON array; positions below):
# [name, size, mtime_ns, ctime_ns, ino, dev, checked_ns, revision,
#  seed id or null, declared domain, seed JSON text (ASCII bytes), notes [[line, reason], ...],
#  problem [line, reason] or null, domain_line, the `list` row [kind, provides, status, risks] or null,
#  the search keys [canonical provides, canonical texts] (ranking.match_keys) or null]
_NAME, _SIZE, _MTIME, _CTIME, _INO, _DEV, _CHECKED, _REVISION = range(8)
_ID, _DOMAIN, _SEED, _NOTES, _PROBLEM, _DOMAIN_LINE, _ROW, _KEYS = range(8, 16)
_ENTRY_LENGTH = 16
_STATUSES: Mapping[str, VerificationStatus] = MappingProxyType(
    {status.value: status for status in VerificationStatus}
)
# The positions stored as JSON columns: all but the seed text, which has a line of its own.
_COLUMN_POSITIONS = tuple(position for position in range(_ENTRY_LENGTH) if position != _SEED)

Entry = list[Any]
Signature = tuple[int, int, int, int, int]
DirectorySignature = tuple[int, int, int, int]  # mtime_ns, ctime_ns, inode, device


def signature_of(stat_result: os.stat_result) -> Signature:
    return (
        stat_result.st_size,
        stat_result.st_mtime_ns,
        stat_result.st_ctime_ns,
        stat_result.st_ino,
        stat_result.st_dev,
    )


def directory_signature_of(stat_result: os.stat_result) -> DirectorySignature:
    return (stat_result.st_mtime_ns, stat_result.st_ctime_ns, stat_result.st_ino, stat_result.st_dev)


@dataclass(frozen=True, slots=True)
class DirectoryRecord:
    """The directories a section's files were listed from, as they were just before the listing.

    `signatures`: (the directory relative to the section's own, "" for itself;
    its signature). `domains`: for the root section, the domain directories the
    root held. `checked_ns`: when the listing began. An empty record vouches for nothing.
    """

    checked_ns: int = 0
    signatures: tuple[tuple[str, DirectorySignature], ...] = ()
    domains: tuple[str, ...] = ()

    def settled(self) -> bool:
        """Whether no directory changed within the racy window of the listing (a same-tick change shows)."""
        return bool(self.signatures) and all(
            max(signature[0], signature[1]) + RACY_WINDOW_NS < self.checked_ns
            for _name, signature in self.signatures
        )

    def current(self, base: str) -> bool:
        """Whether every directory under `base` (the section's directory) is as recorded, and settled."""
        if not self.settled():
            return False
        for name, signature in self.signatures:
            try:
                found = os.stat(os.path.join(base, name) if name else base)
            except OSError:
                return False
            if directory_signature_of(found) != signature:
                return False
        return True


def section_directory(root: str, domain_dir: str | None) -> str:
    """The directory of a section, spelled as the walk spells it."""
    return root if domain_dir is None else os.path.join(root, domain_dir)


def directory_records(
    root: str, listed: Mapping[str, tuple[str | None, os.stat_result]], checked_ns: int
) -> dict[str | None, DirectoryRecord]:
    """Each section's record from what a walk listed (`store.walk_seed_files`'s `directories`)."""
    grouped: dict[str | None, list[tuple[str, DirectorySignature]]] = {}
    for path, (domain_dir, stat_result) in listed.items():
        if domain_dir == INDEX_DIR_NAME:
            # Every save changes it: a start lists it again (it is no section the root record names).
            continue
        base = section_directory(root, domain_dir)
        name = "" if path == base else os.path.relpath(path, base)
        grouped.setdefault(domain_dir, []).append((name, directory_signature_of(stat_result)))
    domains = tuple(sorted(domain_dir for domain_dir in grouped if domain_dir is not None))
    return {
        domain_dir: DirectoryRecord(
            checked_ns, tuple(sorted(signatures)), domains if domain_dir is None else ()
        )
        for domain_dir, signatures in grouped.items()
    }


def section_file_name(domain_dir: str | None) -> str:
    """The index file of a section: `d-<name>.json` for an identifier, else a hash of the name."""
    if domain_dir is None:
        return f"{_ROOT_SECTION}.json"
    if _IDENTIFIER_CHARS.issuperset(domain_dir) and not domain_dir.startswith(".") and len(domain_dir) <= 200:
        return f"d-{domain_dir}.json"
    import hashlib

    digest = hashlib.sha256(domain_dir.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return f"h-{digest}.json"


@dataclass(frozen=True, slots=True)
class IndexedFile:
    """One seed file of a load, with the entry that describes it now."""

    path: str
    domain_dir: str | None
    entry: Entry

    @property
    def seed_id(self) -> str | None:
        value: str | None = self.entry[_ID]
        return value

    def problems(self, domain: str | None) -> Iterator[Problem]:
        """What this file adds to the scope's problems (the rules of `store.scope_from_files`)."""
        entry = self.entry
        problem = entry[_PROBLEM]
        if problem is not None:
            yield Problem(self.path, problem[0], problem[1])
        elif domain is not None and entry[_DOMAIN] != domain:
            yield mismatch_problem(self.path, domain, entry[_DOMAIN], entry[_DOMAIN_LINE])
        else:
            for line, reason in entry[_NOTES]:
                yield Problem(self.path, line, reason)

    def in_scope(self, domain: str | None) -> bool:
        """Whether the file holds a seed the scope loads."""
        entry = self.entry
        return entry[_PROBLEM] is None and (domain is None or entry[_DOMAIN] == domain)

    def could_match(self, requested: str) -> bool:
        """`ranking.could_match` on the seed's keys: False only when a search of `requested` excludes it."""
        provides, texts = self.entry[_KEYS]
        return could_match(provides, texts, requested)

    def seed_json(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.entry[_SEED])
        return value

    def listed(self) -> ListedSeed:
        """The `list` row of the seed, from the entry (no Seed is built)."""
        entry = self.entry
        kind, provides, status, risks = entry[_ROW]
        return ListedSeed(
            id=entry[_ID],
            domain=entry[_DOMAIN],
            kind=kind,
            path=self.path,
            provides=tuple(provides),
            verification_status=_STATUSES[status],
            risks=tuple(risks),
            revision=entry[_REVISION],
        )


def mismatch_problem(path: str, domain: str, declared: str, line: int) -> Problem:
    return Problem(
        path, line, f'seed {path} is stored under domain "{domain}" but declares domain "{declared}"'
    )


# --- entries ---------------------------------------------------------------------


def _section_prefix(root: str, domain_dir: str | None) -> str:
    base = root if domain_dir is None else os.path.join(root, domain_dir)
    return base.rstrip(os.sep) + os.sep if base != "." else ""


def name_in_section(root: str, path: str, domain_dir: str | None) -> str:
    """`path` (as the walk spells it) relative to its section's directory: the key of its entry."""
    prefix = _section_prefix(root, domain_dir)
    return path[len(prefix) :] if path.startswith(prefix) else path


def checked_ns_of(entry: Entry) -> int:
    value: int = entry[_CHECKED]
    return value


def parsed_from_entry(path: str, domain_dir: str | None, entry: Entry, signature: Signature) -> Any:
    """The `store.ParsedFile` an entry stands for (no stat result), or None unless it can be trusted now.

    Trusted: the file's current `signature` is the entry's, and the entry is not racy.
    """
    if not _signature_matches(entry, signature) or _racy(entry):
        return None
    return parsed_of_entry(path, entry)


def entry_from_parsed(name: str, parsed: Any, checked_ns: int) -> Entry:
    """The entry of a `store.ParsedFile` read at `checked_ns`; its signature is that of the read."""
    stat_result = parsed.stat_result
    signature = signature_of(stat_result) if stat_result is not None else None
    return entry_from_parts(name, signature, checked_ns, parsed)


def entry_from_parts(name: str, signature: Signature | None, checked_ns: int, parsed: Any) -> Entry:
    """The entry of a `store.ParsedFile` whose file had `signature` when the read at `checked_ns` began."""
    sig: tuple[int | None, ...] = signature if signature is not None else (None, None, None, None, None)
    stored = parsed.stored
    if stored is not None:
        seed = stored.seed
        notes = [[problem.line, problem.reason] for problem in stored.notes]
        # ASCII: a seed text is stored as one line of bytes, whatever characters the seed holds.
        seed_text = json.dumps(seed_to_json(seed), separators=(",", ":")).encode("ascii")
        flags = (
            ("external_service", seed.risk.external_service),
            ("may_cost_money", seed.risk.may_cost_money),
        )
        row = [seed.kind, list(seed.provides), seed.verification_status.value, [n for n, on in flags if on]]
        provides, texts = match_keys(seed)
        return [
            name,
            *sig,
            checked_ns,
            parsed.revision,
            seed.id,
            seed.domain,
            seed_text,
            notes,
            None,
            parsed.domain_line,
            row,
            [sorted(provides), sorted(texts)],
        ]
    problem = parsed.problem
    return [
        name,
        *sig,
        checked_ns,
        parsed.revision,
        None,
        "",
        b"",
        [],
        [problem.line, problem.reason],
        0,
        None,
        None,
    ]


def revision_of_entry(entry: Entry) -> str:
    value: str = entry[_REVISION]
    return value


def seed_identity_of_entry(entry: Entry) -> tuple[str, str] | None:
    """(id, declared domain) of a seed entry, None for a problem; no seed is decoded."""
    if entry[_PROBLEM] is not None:
        return None
    return entry[_ID], entry[_DOMAIN]


def problem_of_entry(path: str, entry: Entry) -> Problem | None:
    problem = entry[_PROBLEM]
    return None if problem is None else Problem(path, problem[0], problem[1])


def parsed_of_entry(path: str, entry: Entry) -> Any:
    """The `store.ParsedFile` an entry stands for (no stat result), without checking its signature."""
    from agentsidecar.seedstore_service.store import ParsedFile

    problem = entry[_PROBLEM]
    if problem is not None:
        return ParsedFile(path, None, Problem(path, problem[0], problem[1]), entry[_REVISION], False, None, 0)
    stored = stored_from_entry(path, entry)
    return ParsedFile(path, stored, None, entry[_REVISION], False, None, entry[_DOMAIN_LINE])


def take_fields(entry: Entry) -> tuple[Signature, int, bool, str | None, str, list[str], list[str], bool]:
    """(signature, checked_ns, racy, seed id or None for a problem, declared domain, canonical
    provides, canonical texts, has notes) of a persisted entry, in one call.

    The entry keeps only what its seed is decoded from: its name, `list` row and search
    keys are dropped (`resaved` makes them again).
    """
    signature = (entry[_SIZE], entry[_MTIME], entry[_CTIME], entry[_INO], entry[_DEV])
    checked: int = entry[_CHECKED]
    racy = max(entry[_MTIME], entry[_CTIME]) + RACY_WINDOW_NS >= checked
    entry[_NAME] = None
    if entry[_PROBLEM] is not None:
        return signature, checked, racy, None, "", [], [], False
    provides, texts = entry[_KEYS]
    entry[_KEYS] = entry[_ROW] = None
    return signature, checked, racy, entry[_ID], entry[_DOMAIN], provides, texts, bool(entry[_NOTES])


def resaved(entry: Entry, name: str, path: str) -> Entry:
    """A whole entry named `name` again from what `take_fields` left (the seed is decoded for the rest)."""
    signature = (entry[_SIZE], entry[_MTIME], entry[_CTIME], entry[_INO], entry[_DEV])
    return entry_from_parts(name, signature, entry[_CHECKED], parsed_of_entry(path, entry))


def section_prefix(root: str, domain_dir: str | None) -> str:
    """What a walk's path of a section's file starts with; the entry's name follows."""
    return _section_prefix(root, domain_dir)


def stored_from_entry(path: str, entry: Entry) -> Any:
    """The `store.StoredSeed` of a seed entry."""
    from agentsidecar.seedstore_service.store import StoredSeed

    notes = tuple(Problem(path, line, reason) for line, reason in entry[_NOTES])
    return StoredSeed(seed_from_json(json.loads(entry[_SEED])), path, entry[_REVISION], notes)


def _persistable(entry: Entry) -> bool:
    return entry[_SIZE] is not None


def _racy(entry: Entry) -> bool:
    changed_ns: int = max(entry[_MTIME], entry[_CTIME])
    checked_ns: int = entry[_CHECKED]
    return changed_ns + RACY_WINDOW_NS >= checked_ns


def _same_but_checked(old: Entry, new: Entry) -> bool:
    return old[:_CHECKED] == new[:_CHECKED] and old[_CHECKED + 1 :] == new[_CHECKED + 1 :]


def _signature_matches(entry: Entry, signature: Signature) -> bool:
    return bool(
        entry[_SIZE] == signature[0]
        and entry[_MTIME] == signature[1]
        and entry[_CTIME] == signature[2]
        and entry[_INO] == signature[3]
        and entry[_DEV] == signature[4]
    )


# --- index files ---------------------------------------------------------------


def _header(root: str, domain_dir: str | None, body: bytes) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "root": root,
        "section": domain_dir,
        "length": len(body),
        "crc32": zlib.crc32(body),
    }


def encode_section(
    root: str, domain_dir: str | None, entries: Iterable[Entry], directories: DirectoryRecord | None = None
) -> bytes:
    """A section file: the header line, the directory record, the entries by column, then one seed
    JSON text a line.

    By column: a reader decodes a few long lists instead of a list per entry, and
    the seed texts (most of the bytes) are split off undecoded, so a reader parses
    only the seeds it answers with (`stored_from_entry`).
    """
    rows = list(entries)
    columns = [[entry[position] for entry in rows] for position in _COLUMN_POSITIONS]
    seeds = b"\n".join(_seed_bytes(entry[_SEED]) for entry in rows)
    head = json.dumps(columns, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape")
    record = directories or DirectoryRecord()
    listed = [
        record.checked_ns,
        [[name, *signature] for name, signature in record.signatures],
        record.domains,
    ]
    meta = json.dumps(listed, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape")
    body = meta + b"\n" + head + b"\n" + seeds
    header = json.dumps(_header(root, domain_dir, body), ensure_ascii=False, separators=(",", ":"))
    return header.encode("utf-8", "surrogateescape") + b"\n" + body


def _seed_bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode("ascii")


def _decode_json(data: bytes) -> Any:
    """`json.loads`, with the cyclic collector paused: a section makes many lists, none cyclic."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return json.loads(data)
    finally:
        if collecting:
            gc.enable()


def section_of_file(data: bytes) -> tuple[bool, str | None]:
    """(whether the header names a section, which one): the section an index file says it holds."""
    head, newline, _body = data.partition(b"\n")
    try:
        header = json.loads(head) if newline else None
    except (ValueError, TypeError, RecursionError):
        header = None
    if not isinstance(header, dict) or "section" not in header:
        return False, None
    section = header["section"]
    return isinstance(section, str | None), section if isinstance(section, str) else None


def decode_section(data: bytes, root: str, domain_dir: str | None) -> dict[str, Entry] | None:
    """The entries of an index file by name, or None when it is not a whole index of this section."""
    decoded = decode_section_and_record(data, root, domain_dir)
    return None if decoded is None else decoded[0]


def _record_of(meta: Any) -> DirectoryRecord | None:
    if not isinstance(meta, list) or len(meta) != 3:
        return None
    checked_ns, listed, domains = meta
    if not isinstance(checked_ns, int) or not isinstance(listed, list) or not isinstance(domains, list):
        return None
    signatures: list[tuple[str, DirectorySignature]] = []
    for item in listed:
        if not (
            isinstance(item, list)
            and len(item) == 5
            and isinstance(item[0], str)
            and all(isinstance(number, int) for number in item[1:])
        ):
            return None
        signatures.append((item[0], (item[1], item[2], item[3], item[4])))
    if not all(isinstance(name, str) for name in domains):
        return None
    return DirectoryRecord(checked_ns, tuple(signatures), tuple(domains))


def decode_section_and_record(
    data: bytes, root: str, domain_dir: str | None
) -> tuple[dict[str, Entry], DirectoryRecord] | None:
    """The entries of an index file by name and its directory record, or None when it is not a
    whole index of this section."""
    head, newline, body = data.partition(b"\n")
    if not newline:
        return None
    try:
        header = json.loads(head)
        if header != _header(root, domain_dir, body):
            return None
        meta_text, newline, rest = body.partition(b"\n")
        if not newline:
            return None
        record = _record_of(json.loads(meta_text))
        if record is None:
            return None
        columns_text, newline, seeds_text = rest.partition(b"\n")
        if not newline:
            return None
        columns = _decode_json(columns_text)
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(columns, list) or len(columns) != len(_COLUMN_POSITIONS):
        return None
    count = len(columns[0]) if isinstance(columns[0], list) else -1
    if any(not isinstance(column, list) or len(column) != count for column in columns):
        return None
    seeds = seeds_text.split(b"\n") if count else []
    if len(seeds) != count:
        return None
    columns.insert(_SEED, seeds)
    result: dict[str, Entry] = {}
    for entry in map(list, zip(*columns, strict=True)):
        if not isinstance(entry[_NAME], str):
            return None
        result[entry[_NAME]] = entry
    return result, record


class PersistedIndex:
    """The index files of one store; `try_lock` yields whether the store's lock is now held."""

    def __init__(self, root: Path, try_lock: Callable[[], contextlib.AbstractContextManager[bool]]) -> None:
        self.root = root
        self._root_text = str(root)
        self._directory = root / INDEX_DIR_NAME
        self._try_lock = try_lock

    def read_section(self, domain_dir: str | None) -> dict[str, Entry]:
        """The entries of a section's index file; empty when it is missing or cannot be used."""
        return self.load_section(domain_dir)[0]

    def load_section(self, domain_dir: str | None) -> tuple[dict[str, Entry], DirectoryRecord]:
        """The entries and directory record of a section's index file; empty when it cannot be used."""
        data = self._read_file(os.path.join(str(self._directory), section_file_name(domain_dir)))
        decoded = None if data is None else decode_section_and_record(data, self._root_text, domain_dir)
        return decoded if decoded is not None else ({}, DirectoryRecord())

    def read_all_sections(self) -> dict[str | None, tuple[dict[str, Entry], DirectoryRecord]]:
        """Every usable section file of the index (entries, directory record) by section; a file
        that is not one is left out."""
        directory = str(self._directory)
        try:
            names = sorted(name for name in os.listdir(directory) if name.endswith(".json"))
        except OSError:
            return {}
        sections: dict[str | None, tuple[dict[str, Entry], DirectoryRecord]] = {}
        for name in names:
            data = self._read_file(os.path.join(directory, name))
            if data is None:
                continue
            named, section = section_of_file(data)
            if not named or section_file_name(section) != name or section in sections:
                continue
            decoded = decode_section_and_record(data, self._root_text, section)
            if decoded is not None:
                sections[section] = decoded
        return sections

    @staticmethod
    def _read_file(path: str) -> bytes | None:
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError:
            return None
        try:
            with open(fd, "rb") as handle:
                stat_result = os.fstat(handle.fileno())
                if not stat.S_ISREG(stat_result.st_mode) or stat_result.st_size > _MAX_INDEX_BYTES:
                    return None
                return handle.read(_MAX_INDEX_BYTES + 1)
        except OSError:
            return None

    def write_sections(
        self,
        sections: Mapping[str | None, Iterable[Entry]],
        *,
        locked: bool = False,
        directories: Mapping[str | None, DirectoryRecord] | None = None,
    ) -> None:
        """Replace these sections' index files; skipped when another process holds the lock.

        `locked`: the caller holds the store's lock already. `directories`: each
        section's record, taken before the listing its entries reflect (a section
        without one is listed again on the next start).
        """
        if not sections or not self.root.is_dir():
            return  # a read never creates the store
        lock: contextlib.AbstractContextManager[bool] = (
            contextlib.nullcontext(True) if locked else self._try_lock()
        )
        with lock as held:
            if not held:
                return
            with contextlib.suppress(OSError, ValueError):
                self._write(sections, directories or {})

    def _write(
        self,
        sections: Mapping[str | None, Iterable[Entry]],
        directories: Mapping[str | None, DirectoryRecord],
    ) -> None:
        from agentsidecar.seedstore_service.errors import OutsideStore
        from agentsidecar.seedstore_service.store import open_store_directory

        try:
            directory_fd = open_store_directory(self.root, self._directory, create=True)
        except OutsideStore:
            return
        try:
            for domain_dir, entries in sections.items():
                kept = sorted(
                    (entry for entry in entries if _persistable(entry)), key=lambda entry: entry[_NAME]
                )
                data = encode_section(self._root_text, domain_dir, kept, directories.get(domain_dir))
                name = section_file_name(domain_dir)
                temp_name = f".{name}.tmp-{os.urandom(6).hex()}"
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
                fd = os.open(temp_name, flags, 0o666, dir_fd=directory_fd)
                try:
                    try:
                        view = memoryview(data)
                        while view:
                            view = view[os.write(fd, view) :]
                    finally:
                        os.close(fd)
                    os.replace(temp_name, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(temp_name, dir_fd=directory_fd)
                    raise
        finally:
            os.close(directory_fd)

    # -- loading ---------------------------------------------------------

    def scan(self, domain: str | None) -> tuple[list[IndexedFile], list[Problem]]:
        """Every seed file of the scope (the walk's order) with an up-to-date entry, and the walk's problems.

        Files that are new, changed or racy are read (and parsed when their bytes
        changed); the sections that changed are saved.
        """
        from agentsidecar.seedstore_service.store import read_seed_file, walk_seed_files

        listed: dict[str, tuple[str | None, os.stat_result]] = {}
        listed_ns = time.time_ns()
        refs, walk_problems = walk_seed_files(self.root, domain, listed)
        records = directory_records(self._root_text, listed, listed_ns)
        sections: dict[str | None, dict[str, Entry]] = {}
        seen: dict[str | None, set[str]] = {}
        changed: set[str | None] = set()
        prefixes: dict[str | None, str] = {}
        files: list[IndexedFile] = []
        for ref in refs:
            section = ref.domain_dir
            entries = sections.get(section)
            if entries is None:
                entries = sections[section] = self.read_section(section)
                seen[section] = set()
                prefixes[section] = _section_prefix(self._root_text, section)
            prefix = prefixes[section]
            name = ref.path[len(prefix) :] if ref.path.startswith(prefix) else ref.path
            seen[section].add(name)
            entry = entries.get(name)
            fresh = entry
            try:
                found = os.stat(ref.path)
            except OSError:
                found = None
            if (
                entry is None
                or found is None
                or entry[_SIZE] != found.st_size
                or entry[_MTIME] != found.st_mtime_ns
                or entry[_CTIME] != found.st_ctime_ns
                or entry[_INO] != found.st_ino
                or entry[_DEV] != found.st_dev
                or _racy(entry)
            ):
                checked_ns = time.time_ns()
                known = None
                if entry is not None and entry[_PROBLEM] is None:
                    with contextlib.suppress(Exception):
                        known = stored_from_entry(ref.path, entry)
                parsed = read_seed_file(ref.path, ref.domain_dir, known)
                fresh = entry_from_parsed(name, parsed, checked_ns)
                if _persistable(fresh):
                    if fresh != entry:
                        entries[name] = fresh
                        # A racy entry read again to the same result: saving it would change nothing.
                        if entry is None or not _racy(fresh) or not _same_but_checked(entry, fresh):
                            changed.add(section)
                elif entry is not None:
                    del entries[name]
                    changed.add(section)
            assert fresh is not None
            files.append(IndexedFile(ref.path, section, fresh))
        for section, entries in sections.items():
            gone = [name for name in entries if name not in seen[section]]
            for name in gone:
                del entries[name]
                changed.add(section)
        if changed:
            # A load saves the directory records only along with entries it changed: it walks
            # every time and needs none; the service's sweep saves the rest.
            self.write_sections(
                {section: sections[section].values() for section in changed},
                directories={section: records.get(section, DirectoryRecord()) for section in changed},
            )
        return files, walk_problems

    def record(self, path: str, parsed: Any, checked_ns: int, *, locked: bool) -> None:
        """Put the file just written (`parsed`: what it now holds, or None when removed) into its section."""
        from agentsidecar.seedstore_service.store import domain_dir_of

        try:
            section = domain_dir_of(self.root, path)
        except ValueError:
            return
        name = name_in_section(self._root_text, path, section)
        entries, record = self.load_section(section)
        if parsed is None:
            entries.pop(name, None)
        else:
            entries[name] = entry_from_parsed(name, parsed, checked_ns)
        # The record still vouches for nothing newer than its listing: this write changed the
        # directory, so the next start lists the section again rather than trust it.
        self.write_sections({section: entries.values()}, locked=locked, directories={section: record})


def assemble_problems(
    files: Iterable[IndexedFile], domain: str | None, walk_problems: Iterable[Problem]
) -> list[Problem]:
    problems = list(walk_problems)
    for indexed in files:
        entry = indexed.entry
        if entry[_PROBLEM] is None and not entry[_NOTES] and (domain is None or entry[_DOMAIN] == domain):
            continue  # a seed in scope with nothing to report: most files
        problems.extend(indexed.problems(domain))
    problems.sort(key=lambda problem: problem.path)
    return problems
