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
  the number of entries, each block's length and CRC-32) and a body of blocks:
  the directory record, one JSON list per column of the entries, the entries'
  signatures packed, the `list` rows as the CLI prints them, and each entry's
  seed JSON text on a line of its own; a reader checks each block it uses
  before it uses it, and each column's values against the types the index
  writes (`indexfile.Section.column`, `Section.value`). indexfile.py holds the
  format. A truncated, foreign, corrupt or other-version file, or one with
  valid checksums holding values of other types, is ignored, and the section
  rebuilt from the seed files. The checksums guard against damage, not
  against a writer: a program that may write the index may write the seeds.
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
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from agentsidecar.seedstore_service import indexfile
from agentsidecar.seedstore_service.indexfile import (
    CHECKED,
    CTIME,
    DEV,
    DOMAIN,
    DOMAIN_LINE,
    ID,
    INO,
    KEYS,
    MTIME,
    NAME,
    NOTES,
    PROBLEM,
    RANK,
    REVISION,
    ROW,
    SEED,
    SIZE,
    directory_signature_of,
    racy,
    record_current,
    record_settled,
    section_directory,
    section_prefix,
)
from agentsidecar.seedstore_service.indexfile import INDEX_DIR_NAME as INDEX_DIR_NAME
from agentsidecar.seedstore_service.indexfile import RACY_WINDOW_NS as RACY_WINDOW_NS
from agentsidecar.seedstore_service.indexfile import name_in_section as name_in_section
from agentsidecar.seedstore_service.indexfile import section_file_name as section_file_name
from agentsidecar.seedstore_service.indexfile import section_of_file as section_of_file
from agentsidecar.seedstore_service.indexfile import signature_of as signature_of
from agentsidecar.seedstore_service.model import ListedSeed, Problem, VerificationStatus
from agentsidecar.seedstore_service.names import domain_mismatch_reason
from agentsidecar.seedstore_service.ranking import could_match, match_keys, rank_keys, seed_gates, seed_risks
from agentsidecar.seedstore_service.seedtext import seed_from_json, seed_to_json

_STATUSES: Mapping[str, VerificationStatus] = MappingProxyType(
    {status.value: status for status in VerificationStatus}
)

Entry = list[Any]
Signature = tuple[int, int, int, int, int]
DirectorySignature = tuple[int, int, int, int]  # mtime_ns, ctime_ns, inode, device


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

    def raw(self) -> indexfile.RawRecord:
        return (self.checked_ns, self.signatures, self.domains)

    def settled(self) -> bool:
        """Whether no directory changed within the racy window of the listing (a same-tick change shows)."""
        return record_settled(self.raw())

    def current(self, base: str) -> bool:
        """Whether every directory under `base` (the section's directory) is as recorded, and settled."""
        return record_current(self.raw(), base)


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


@dataclass(frozen=True, slots=True)
class IndexedFile:
    """One seed file of a load, with the entry that describes it now."""

    path: str
    domain_dir: str | None
    entry: Entry

    @property
    def seed_id(self) -> str | None:
        value: str | None = self.entry[ID]
        return value

    def problems(self, domain: str | None) -> Iterator[Problem]:
        """What this file adds to the scope's problems (the rules of `store.scope_from_files`)."""
        entry = self.entry
        problem = entry[PROBLEM]
        if problem is not None:
            yield Problem(self.path, problem[0], problem[1])
        elif domain is not None and entry[DOMAIN] != domain:
            yield mismatch_problem(self.path, domain, entry[DOMAIN], entry[DOMAIN_LINE])
        else:
            for line, reason in entry[NOTES]:
                yield Problem(self.path, line, reason)

    def in_scope(self, domain: str | None) -> bool:
        """Whether the file holds a seed the scope loads."""
        entry = self.entry
        return entry[PROBLEM] is None and (domain is None or entry[DOMAIN] == domain)

    def could_match(self, requested: str) -> bool:
        """`ranking.could_match` on the seed's keys: False only when a search of `requested` excludes it."""
        provides, texts = self.entry[KEYS]
        return could_match(provides, texts, requested)

    def seed_json(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.entry[SEED])
        return value

    def listed(self) -> ListedSeed:
        """The `list` row of the seed, from the entry (no Seed is built)."""
        entry = self.entry
        return listed_of_row(self.path, entry[ID], entry[DOMAIN], entry[ROW], entry[REVISION])


def listed_of_row(path: str, seed_id: str, domain: str, row: Any, revision: str) -> ListedSeed:
    """The `list` row of the seed in `path` from its entry's ROW value (no Seed is built); the
    value's shape and types were checked with its column (`indexfile.Section.column`).

    Raises:
        ValueError: the row's status is not one the index writes (the caller decodes the seed).
    """
    kind, provides, status, risks = row
    verification_status = _STATUSES.get(status)
    if verification_status is None:
        raise ValueError(f"the list row of {path} holds a status the index never writes")
    return ListedSeed(
        id=seed_id,
        domain=domain,
        kind=kind,
        path=path,
        provides=tuple(provides),
        verification_status=verification_status,
        risks=tuple(risks),
        revision=revision,
    )


def mismatch_problem(path: str, domain: str, declared: str, line: int) -> Problem:
    return Problem(path, line, domain_mismatch_reason(path, domain, declared))


# --- entries ---------------------------------------------------------------------


def checked_ns_of(entry: Entry) -> int:
    value: int = entry[CHECKED]
    return value


def parsed_from_entry(path: str, domain_dir: str | None, entry: Entry, signature: Signature) -> Any:
    """The `store.ParsedFile` an entry stands for (no stat result), or None unless it can be trusted now.

    Trusted: the file's current `signature` is the entry's, and the entry is not racy.
    """
    if not _signature_matches(entry, signature) or racy(entry):
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
        preferred_for, avoid_for = rank_keys(seed)
        rank = [
            sorted(preferred_for),
            sorted(avoid_for),
            seed.rank.default_priority,
            seed.risk.external_service,
            seed.risk.may_cost_money,
            list(seed_risks(seed)),
            list(seed_gates(seed)),
        ]
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
            rank,
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
        None,
    ]


def parsed_of_entry(path: str, entry: Entry) -> Any:
    """The `store.ParsedFile` an entry stands for (no stat result), without checking its signature."""
    from agentsidecar.seedstore_service.store import ParsedFile

    problem = entry[PROBLEM]
    if problem is not None:
        return ParsedFile(path, None, Problem(path, problem[0], problem[1]), entry[REVISION], False, None, 0)
    stored = stored_from_entry(path, entry)
    return ParsedFile(path, stored, None, entry[REVISION], False, None, entry[DOMAIN_LINE])


def stored_from_entry(path: str, entry: Entry) -> Any:
    """The `store.StoredSeed` of a seed entry."""
    from agentsidecar.seedstore_service.store import StoredSeed

    notes = tuple(Problem(path, line, reason) for line, reason in entry[NOTES])
    return StoredSeed(seed_from_json(json.loads(entry[SEED])), path, entry[REVISION], notes)


# What answering from an entry raises when the entry holds values the index never writes: a
# section file with valid checksums that another program wrote. Such an answer is made again
# from the files (`PersistedIndex.scan(trust=False)`), which also replaces the entries.
ENTRY_ERRORS = (TypeError, ValueError, KeyError, IndexError, AttributeError)


# The columns a start from the index keeps of a section to decode its seeds later (`parsed_of_row`).
KEPT_COLUMNS = (REVISION, NOTES, PROBLEM, DOMAIN_LINE)
# The columns it also keeps as written, unchecked: the `list` rows and the rank inputs, which a
# listing or a search decodes when it is asked for (`listed_of_row`, `SeedIndex._candidate`),
# so that no seed is decoded to list or to score it.
ANSWER_COLUMNS = (ROW, RANK)


def kept_of(section: indexfile.Section) -> indexfile.Section:
    """What a start from the index keeps of `section`: `KEPT_COLUMNS` and `ANSWER_COLUMNS`."""
    return section.narrowed((*KEPT_COLUMNS, *ANSWER_COLUMNS))


def parsed_of_row(path: str, section: indexfile.Section, row: int) -> Any:
    """The `store.ParsedFile` the entry at `row` of `section` stands for (no stat result, its
    signature unchecked), decoded from `KEPT_COLUMNS` and the seed texts.

    Raises:
        ValueError: the section does not hold what was written (the caller reads the file).
    """
    from agentsidecar.seedstore_service.store import ParsedFile, StoredSeed

    revision = section.column(REVISION)[row]
    problem = section.column(PROBLEM)[row]
    if problem is not None:
        return ParsedFile(path, None, Problem(path, problem[0], problem[1]), revision, False, None, 0)
    notes = tuple(Problem(path, line, reason) for line, reason in section.column(NOTES)[row])
    try:
        seed = seed_from_json(json.loads(section.seeds()[row]))
    except (TypeError, KeyError, IndexError, AttributeError) as error:
        raise ValueError(f"the seed text of {path} is not one the index writes: {error}") from None
    stored = StoredSeed(seed, path, revision, notes)
    return ParsedFile(path, stored, None, revision, False, None, section.column(DOMAIN_LINE)[row])


def entry_of_row(
    name: str, path: str, section: indexfile.Section, row: int, signature: Signature, checked_ns: int
) -> Entry:
    """A whole entry named `name` again from the row of a section `narrowed` to `KEPT_COLUMNS`
    (the seed is decoded for the rest)."""
    return entry_from_parts(name, signature, checked_ns, parsed_of_row(path, section, row))


def _persistable(entry: Entry) -> bool:
    return entry[SIZE] is not None


def _same_but_checked(old: Entry, new: Entry) -> bool:
    return old[:CHECKED] == new[:CHECKED] and old[CHECKED + 1 :] == new[CHECKED + 1 :]


def _signature_matches(entry: Entry, signature: Signature) -> bool:
    return bool(
        entry[SIZE] == signature[0]
        and entry[MTIME] == signature[1]
        and entry[CTIME] == signature[2]
        and entry[INO] == signature[3]
        and entry[DEV] == signature[4]
    )


def encode_section(
    root: str, domain_dir: str | None, entries: Iterable[Entry], directories: DirectoryRecord | None = None
) -> bytes:
    """`indexfile.encode_section` with the directory record (an empty one vouches for nothing)."""
    return indexfile.encode_section(root, domain_dir, entries, (directories or DirectoryRecord()).raw())


def section_data(
    root: str, domain_dir: str | None, entries: Iterable[Entry], directories: DirectoryRecord | None = None
) -> bytes:
    """The index file of a section holding these entries: those with a signature, by name."""
    kept = sorted((entry for entry in entries if _persistable(entry)), key=lambda entry: entry[NAME])
    return encode_section(root, domain_dir, kept, directories)


def decode_section(data: bytes, root: str, domain_dir: str | None) -> dict[str, Entry] | None:
    """The entries of an index file by name, or None when it is not a whole index of this section."""
    decoded = indexfile.decode_section(data, root, domain_dir)
    return None if decoded is None else decoded[0]


def decode_section_and_record(
    data: bytes, root: str, domain_dir: str | None
) -> tuple[dict[str, Entry], DirectoryRecord] | None:
    decoded = indexfile.decode_section(data, root, domain_dir)
    if decoded is None:
        return None
    entries, (checked_ns, signatures, domains) = decoded
    return entries, DirectoryRecord(checked_ns, signatures, domains)


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
        data = indexfile.read_index_file(os.path.join(str(self._directory), section_file_name(domain_dir)))
        decoded = None if data is None else decode_section_and_record(data, self._root_text, domain_dir)
        return decoded if decoded is not None else ({}, DirectoryRecord())

    def open_all_sections(self) -> Iterator[tuple[str | None, indexfile.Section]]:
        """Every usable section file of the index, opened (`indexfile.open_section`), one at a time;
        a file that is not one, or whose seed texts are not the ones written, is left out."""
        directory = str(self._directory)
        try:
            names = sorted(name for name in os.listdir(directory) if name.endswith(".json"))
        except OSError:
            return
        seen: set[str | None] = set()
        for name in names:
            data = indexfile.read_index_file(os.path.join(directory, name))
            if data is None:
                continue
            named, section_name = section_of_file(data)
            if not named or section_file_name(section_name) != name or section_name in seen:
                continue
            section = indexfile.open_section(data, self._root_text, section_name)
            del data
            if section is not None and section.seeds_intact():
                seen.add(section_name)
                yield section_name, section

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
        if not sections:
            return
        records = directories or {}
        self.write_section_data(
            (
                (domain_dir, section_data(self._root_text, domain_dir, entries, records.get(domain_dir)))
                for domain_dir, entries in sections.items()
            ),
            locked=locked,
        )

    def write_section_data(
        self, sections: Iterable[tuple[str | None, bytes]], *, locked: bool = False
    ) -> None:
        """Replace these sections' index files with these bytes (`section_data`'s), taken one
        at a time; skipped when another process holds the lock."""
        if not self.root.is_dir():
            return  # a read never creates the store
        lock: contextlib.AbstractContextManager[bool] = (
            contextlib.nullcontext(True) if locked else self._try_lock()
        )
        with lock as held:
            if not held:
                return
            with contextlib.suppress(OSError, ValueError):
                self._write(sections)

    def _write(self, sections: Iterable[tuple[str | None, bytes]]) -> None:
        from agentsidecar.seedstore_service.errors import OutsideStore
        from agentsidecar.seedstore_service.store import open_store_directory

        try:
            directory_fd = open_store_directory(self.root, self._directory, create=True)
        except OutsideStore:
            return
        try:
            for domain_dir, data in sections:
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

    def scan(self, domain: str | None, *, trust: bool = True) -> tuple[list[IndexedFile], list[Problem]]:
        """Every seed file of the scope (the walk's order) with an up-to-date entry, and the walk's problems.

        Files that are new, changed or racy are read (and parsed when their bytes
        changed); the sections that changed are saved. Without `trust`, every file is read
        and parsed, and its entry made again from it (`ENTRY_ERRORS`).
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
                prefixes[section] = section_prefix(self._root_text, section)
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
                not trust
                or entry is None
                or found is None
                or entry[SIZE] != found.st_size
                or entry[MTIME] != found.st_mtime_ns
                or entry[CTIME] != found.st_ctime_ns
                or entry[INO] != found.st_ino
                or entry[DEV] != found.st_dev
                or racy(entry)
            ):
                checked_ns = time.time_ns()
                known = None
                if trust and entry is not None and entry[PROBLEM] is None:
                    with contextlib.suppress(Exception):
                        known = stored_from_entry(ref.path, entry)
                parsed = read_seed_file(ref.path, ref.domain_dir, known)
                fresh = entry_from_parsed(name, parsed, checked_ns)
                if _persistable(fresh):
                    if fresh != entry:
                        entries[name] = fresh
                        # A racy entry read again to the same result: saving it would change nothing.
                        if entry is None or not racy(fresh) or not _same_but_checked(entry, fresh):
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
        if entry[PROBLEM] is None and not entry[NOTES] and (domain is None or entry[DOMAIN] == domain):
            continue  # a seed in scope with nothing to report: most files
        problems.extend(indexed.problems(domain))
    problems.sort(key=lambda problem: problem.path)
    return problems
