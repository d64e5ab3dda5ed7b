"""An in-memory index of the seed store, so a search never re-parses the store.

`refresh()` walks the tree with the loader's rules, stats every file and
re-reads only the files whose (mtime_ns, size, inode) signature changed. A
file modified within the last couple of seconds is re-read on the next refresh
too, whatever its signature says: file systems stamp mtimes coarsely, so a
same-size edit inside one tick would otherwise go unseen (git's "racy clean"
problem). Re-reading a file whose bytes did not change produces no event.

`search()` returns exactly what `ranking.search` returns over the same scope,
but only scores the seeds that can match:

* direct: a dict from canonical `provides` entry to seed paths;
* alias/evidence, `canonical(text)` contains the requested term: the distinct
  canonical alias/evidence texts are joined by "\\x00" into one haystack, scanned
  with `str.find`, offsets mapped back to texts with `bisect`. A text holding the
  term holds each of its two-character strings (bigrams), so a longer term only
  scans the bucket of its rarest bigram: the texts holding that bigram, found
  with one scan of the haystack of all texts and joined into a haystack of
  their own. A bigram's rarity is how often it occurs in the haystack of all
  texts (`str.count`; nought exactly when no text holds it). Haystacks and
  counts are made on first use; a text new to the index is added to those that
  cover it, and a text gone from it stays in them (each text found is looked up
  again) until they hold more gone texts than held ones, when they are made
  again. The index keeps no per-bigram set of texts, which at 100,000 seeds
  would hold millions of entries;
* alias/evidence, the requested term contains `canonical(text)`: every
  substring of the (short) term looked up in a dict of canonical texts.

A requested term that canonicalises to "" matches nearly everything; that case
goes to the linear reference implementation.

Each indexed seed keeps a `ranking.PreparedSeed` (its canonical forms, computed
when the file is read), so scoring a match costs set lookups, not canonicalisation.

`start_from_persisted()` fills the index from the persisted index alone (no
walk, no Seed built: each entry's stored keys feed the search structures, and a
seed is decoded when an answer shows it, through a bounded cache; the postings
that look a seed up by id or file name are built by the first lookup or the
sweep, whichever comes first). Until the next whole `refresh()` (the service
runs it at once after READY) every entry an answer uses is first checked against
its file's signature and read again if it changed. Files added or removed while
the service was stopped are found before the start returns: every directory a
section was listed from is stat'ed, and a section whose directories changed (or
changed too close to that listing to tell, or that the index does not hold) is
listed again (see persisted.py).

`build()` fills an empty index for a first start (no persisted index to start from): it
reads the store a section at a time, saves each section of the persisted index, and
indexes that section as a start from the persisted index would, so no Seed is kept
and the index holds what the next start would. A large store's sections are read and
parsed by worker processes meanwhile.

`refresh_paths()` re-reads named files only: the service calls it for the file it
has just written, so a write does not pay for a walk of the whole store. For
writes, `candidate_paths()` names the files that can decide a lookup by id, and
`lookup()` answers one from memory.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import gc
import os
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, islice
from typing import Any, NamedTuple, TypeVar

from agentsidecar.seedstore_service import indexfile, paging, persisted, ranking
from agentsidecar.seedstore_service.model import ListedSeed, Problem, Seed
from agentsidecar.seedstore_service.names import canonical
from agentsidecar.seedstore_service.seedtext import validate_identifier
from agentsidecar.seedstore_service.store import (
    SEED_SUFFIXES,
    LoadedScope,
    ParsedFile,
    SeedStore,
    StoredSeed,
    domain_dir_of,
    domain_mismatch_problem,
    file_stem,
    listed_seed,
    parse_seed_bytes,
    read_seed_bytes,
    read_seed_file,
    scope_from_files,
    walk_seed_files,
)

# A file whose mtime is this close to the refresh that read it is read again next time.
_RACY_WINDOW_NS = 2_000_000_000
_SEPARATOR = "\x00"  # never produced by canonical()
_ALL_TEXTS = ""  # the haystack key of the all-texts haystack (bucket keys are bigrams)
# How many seeds decoded from the persisted index are kept for answers that need them again.
_DECODED_CACHE_SIZE = 4096
# A search matching more seeds than this scores the ones not decoded from their sections'
# columns (`SeedIndex.search`): as many as the decoded cache holds.
_COLUMN_SCORING_MIN = _DECODED_CACHE_SIZE
# The most scopes (domains, and the whole store) each answer cache keeps: a caller names the
# domain, and every name that is an identifier is a scope, so the caches are bounded.
_CACHED_SCOPES = 256
# What `_whole_scope` builds and keeps.
_Answer = TypeVar("_Answer")

ChangeKind = str  # "added" | "updated" | "removed" | "verified" | "malformed"


@dataclass(frozen=True)
class ChangeEvent:
    kind: ChangeKind
    path: str
    id: str
    domain: str
    revision: str  # "" when removed
    seed: Seed | None  # None when removed or malformed
    problem: Problem | None  # set when malformed


Signature = persisted.Signature  # size, mtime_ns, ctime_ns, inode, device


class _Entry(NamedTuple):
    """What the index holds of one seed file.

    A named tuple: a start from the persisted index makes one per file, and a tuple is the
    cheapest immutable record to make.
    """

    signature: Signature | None
    domain_dir: str | None
    # What the file parsed to; None for an entry taken as is from the persisted index
    # (`section`), whose seed is decoded only when an answer needs it (`SeedIndex._parsed`).
    read: ParsedFile | None
    # Read too soon after its last modification to trust the signature.
    racy: bool
    # When the read that gave `parsed` started (time.time_ns()).
    checked_ns: int = 0
    # For an entry taken from the persisted index: its section, narrowed to
    # `persisted.KEPT_COLUMNS`, and its row there.
    section: indexfile.Section | None = None
    row: int = 0

    @property
    def revision(self) -> str:
        if self.read is not None:
            return self.read.revision
        assert self.section is not None
        value: str = self.section.column(indexfile.REVISION)[self.row]
        return value

    def problem(self, path: str) -> Problem | None:
        if self.read is not None:
            return self.read.problem
        assert self.section is not None
        problem = self.section.column(indexfile.PROBLEM)[self.row]
        return None if problem is None else Problem(path, problem[0], problem[1])


class _SeedKeys(NamedTuple):
    """What the search structures hold of one seed file: its id, domains and canonical keys.

    A named tuple: a start from the persisted index makes one per seed, and a tuple is the
    cheapest immutable record to make.
    """

    seed_id: str
    seed_domain: str
    domain_dir: str | None
    provides: Sequence[str]
    texts: Sequence[str]
    # Kept for a seed read from its file; built on use (and kept in a bounded cache) for an
    # entry taken from the persisted index.
    prepared: ranking.PreparedSeed | None


@dataclass(frozen=True, slots=True)
class RefreshStats:
    """What a refresh did: files walked, taken from the persisted index, read; its seconds."""

    files: int
    from_persisted: int
    read: int
    seconds: float


def _without_verification(seed: Seed) -> Seed:
    return dataclasses.replace(seed, verification=None)


def _bigrams(text: str) -> set[str]:
    return {text[start : start + 2] for start in range(len(text) - 1)}


class _Haystack:
    """Texts joined by a separator they never contain, searched with one `str.find` pass.

    Texts are only ever added (`add`, joined on the next search), so a text taken from the
    index stays in its haystacks until they are rebuilt: callers look each text found up again.
    """

    __slots__ = ("_joined", "_pending", "_starts", "_texts")

    def __init__(self, texts: Iterable[str]) -> None:
        self._texts: list[str] = []
        # array: a haystack of a 100k-seed store's texts has hundreds of thousands of offsets;
        # boxed ints would triple that.
        self._starts = array("q")
        self._joined = ""
        self._pending = list(texts)

    def __len__(self) -> int:
        return len(self._texts) + len(self._pending)

    def add(self, text: str) -> None:
        self._pending.append(text)

    def _settled(self) -> str:
        """The joined texts, the added ones included."""
        pending = self._pending
        if pending:
            start = len(self._joined) + len(_SEPARATOR) if self._texts else 0
            widths = [len(text) + len(_SEPARATOR) for text in pending[:-1]]
            self._starts.extend(accumulate(widths, initial=start))
            joined = _SEPARATOR.join(pending)
            self._joined = self._joined + _SEPARATOR + joined if self._texts else joined
            self._texts.extend(pending)
            self._pending = []
        return self._joined

    def count(self, needle: str) -> int:
        """How often `needle` (non-empty, separator-free) occurs, non-overlapping: 0 iff in no text."""
        return self._settled().count(needle)

    def texts_containing(self, needle: str) -> Iterator[str]:
        """Each text holding `needle` (non-empty, separator-free), once for each time it was added."""
        joined = self._settled()
        starts, texts = self._starts, self._texts
        position = joined.find(needle)
        while position != -1:
            number = bisect.bisect_right(starts, position) - 1
            yield texts[number]
            if number + 1 >= len(starts):
                return
            position = joined.find(needle, starts[number + 1])


class SeedIndex:
    """The parsed content of a SeedStore, kept in memory and brought up to date by `refresh()`."""

    def __init__(self, store: SeedStore) -> None:
        self.store = store
        self._entries: dict[str, _Entry] = {}
        self._walk_problems: tuple[Problem, ...] = ()
        # Search structures, maintained incrementally; keys are seed file paths.
        self._seeds: dict[str, _SeedKeys] = {}
        # Lookup by id: the files holding each id, and every file by its name's stem. None from a
        # start from the persisted index until a lookup or the sweep needs them (`_lookup_postings`):
        # READY does not wait for them. Postings (these two and the two below) hold one path as a
        # str, more as a set (`_Holders`): most keys of a large store belong to one seed, and a set
        # apiece would dominate its memory.
        self._paths_by_id: dict[str, _Holders] | None = {}
        self._paths_by_stem: dict[str, _Holders] | None = {}
        # Files that are a problem, or hold a seed declaring another domain than its directory.
        self._problem_paths: set[str] = set()
        self._by_provides: dict[str, _Holders] = {}
        self._by_text: dict[str, _Holders] = {}
        # Built on first use; dropped when the texts they hold change (keys: bigram or _ALL_TEXTS).
        self._haystacks: dict[str, _Haystack] = {}
        # Occurrences of each bigram in the haystack of all texts, counted on first use; dropped
        # with the bigram's haystack.
        self._bigram_counts: dict[str, int] = {}
        # Answers built from the whole of a scope, dropped together when any entry changes
        # (`_answers_changed`).
        self._scope_cache: dict[str | None, LoadedScope] = {}
        self._problem_cache: dict[str | None, tuple[Problem, ...]] = {}
        self._listing_cache: dict[str | None, tuple[tuple[ListedSeed, ...], tuple[Problem, ...]]] = {}
        # The persisted index is consulted for files this index has not read yet (the first
        # refresh after a start) and saved after a whole refresh that read any file.
        self.last_refresh: RefreshStats | None = None
        # One refresh at a time; searches wait only while a refresh applies its changes.
        self._refresh_lock = threading.Lock()
        self._state_lock = threading.RLock()
        # False from a start from the persisted index (`start_from_persisted`) until a whole
        # refresh has compared every file's signature; meanwhile each entry an answer uses is
        # checked against its file first (`_ensure_current`), and `_checked` holds those found current.
        self._swept = True
        self._checked: set[str] = set()
        # Decoded seeds and prepared keys of entries taken from the persisted index, most recent last.
        self._decoded: OrderedDict[str, tuple[ParsedFile, ranking.PreparedSeed | None]] = OrderedDict()
        # Changes found by `_ensure_current`, handed out by the next refresh; sections they left unsaved.
        self._pending_events: list[ChangeEvent] = []
        self._unsaved: set[str | None] = set()
        # The directory record each section of the persisted index holds (as read or last saved).
        self._saved_directories: dict[str | None, persisted.DirectoryRecord] = {}

    # -- refresh ---------------------------------------------------------

    def refresh(self, domain: str | None = None) -> list[ChangeEvent]:
        """Bring the index up to date with the files; return what changed, in path order.

        With `domain`, only that domain's files are walked (those of other
        domains, and the walk's own problems, wait for a whole refresh).
        """
        with self._refresh_lock:
            started = time.perf_counter()
            started_ns = time.time_ns()
            listed: dict[str, tuple[str | None, os.stat_result]] = {}
            refs, walk_problems = walk_seed_files(self.store.root, domain, listed)
            records = persisted.directory_records(str(self.store.root), listed, started_ns)
            fresh: dict[str, _Entry] = {}
            seen: set[str] = set()
            saved = self.store.persisted
            sections: dict[str | None, dict[str, persisted.Entry]] = {}
            taken: set[str] = set()  # files whose entry came from the persisted index
            for ref in refs:
                seen.add(ref.path)
                old = self._entries.get(ref.path)
                signature = _signature_of(ref.path)
                if old is not None and not old.racy and old.signature == signature:
                    continue
                if old is None and saved is not None and signature is not None:
                    section = sections.get(ref.domain_dir)
                    if section is None:
                        # Walk order keeps a section's files together: hold one section's entries at a time.
                        sections.clear()
                        section = sections[ref.domain_dir] = saved.read_section(ref.domain_dir)
                    name = persisted.name_in_section(str(self.store.root), ref.path, ref.domain_dir)
                    entry = _entry_from_persisted(section.get(name), ref.path, ref.domain_dir, signature)
                    if entry is not None:
                        fresh[ref.path] = entry
                        taken.add(ref.path)
                        continue
                if old is None:
                    fresh[ref.path] = _read_entry(ref.path, ref.domain_dir, started_ns, None)
                else:
                    fresh[ref.path] = self._read_again(ref.path, old, started_ns)
            # The sections of the persisted index that no longer match memory.
            dirty = {entry.domain_dir for path, entry in fresh.items() if path not in taken}
            if domain is None:
                for listed_section, record in records.items():
                    old_record = self._saved_directories.get(listed_section)
                    if (
                        old_record is None
                        or old_record.signatures != record.signatures
                        or not old_record.settled()
                    ):
                        dirty.add(listed_section)
            with self._state_lock:
                # Under the state lock: an answer may have read a changed file meanwhile (`_ensure_current`).
                vanished = [
                    path
                    for path, entry in self._entries.items()
                    if path not in seen and (domain is None or entry.domain_dir == domain)
                ]
                dirty.update(self._entries[path].domain_dir for path in vanished)
                events, changed = self._apply(fresh, vanished)
                if self._pending_events:
                    events = sorted([*self._pending_events, *events], key=lambda event: event.path)
                    self._pending_events = []
                dirty.update(self._unsaved)
                self._unsaved = set()
                if domain is None:
                    self._swept = True
                    self._checked = set()
                    self._lookup_postings()
                walk_changed = domain is None and tuple(walk_problems) != self._walk_problems
                if walk_changed:
                    self._walk_problems = tuple(walk_problems)
                if changed or walk_changed:
                    self._answers_changed()
            read = len(fresh) - len(taken)
            if saved is not None and domain is None and dirty:
                self._save(saved, dirty, records)
            self.last_refresh = RefreshStats(len(refs), len(taken), read, time.perf_counter() - started)
            return events

    def build(self, *, workers: int | None = None) -> None:
        """Fill an empty index from the files, and hold it as a start from the persisted index does.

        For a first start, before anyone watches: it tells no changes. Each section is read
        file by file and turned at once into what the persisted index writes (saved, best
        effort, as a whole `refresh()` saves it), and the index keeps that section as a start
        from the persisted index keeps it: the search keys, the columns a seed is decoded
        from when an answer shows it, and no Seed. So only a few sections' parsed seeds are
        alive at a time, and what stays is what the next start would hold. Unlike such a
        start, every file has just been read: the index is swept. A file that could not be
        stat'ed has no entry there and is kept as read.

        `workers`: how many processes read and parse the sections (`_read_section`, the same
        function either way) while this one saves and indexes them; by default one per CPU
        this process may use for a store of at least `_PARALLEL_MIN_FILES` files, else none
        (the sections are read here). A pool that cannot be started, or breaks, leaves the
        sections it has not read to this process.
        """
        with self._refresh_lock:
            if self._entries:
                raise ValueError("build() fills an empty index; refresh() updates one")
            started = time.perf_counter()
            started_ns = time.time_ns()
            root = str(self.store.root)
            listed: dict[str, tuple[str | None, os.stat_result]] = {}
            refs, walk_problems = walk_seed_files(self.store.root, None, listed)
            records = persisted.directory_records(root, listed, started_ns)
            by_section: dict[str | None, list[tuple[str, str | None]]] = {}
            for ref in refs:
                by_section.setdefault(ref.domain_dir, []).append((ref.path, ref.domain_dir))
            names = sorted(records.keys() | by_section.keys(), key=_section_order)
            # A section's files in chunks: a section of any size is spread over the workers.
            jobs: list[_SectionJob] = []
            chunks: list[int] = []  # how many jobs each section has
            for name in names:
                files = by_section.get(name, [])
                starts = range(0, len(files), _CHUNK_FILES) if files else range(1)
                jobs.extend((root, files[start : start + _CHUNK_FILES], started_ns) for start in starts)
                chunks.append(len(starts))
            if workers is None:
                workers = _cpus() if len(refs) >= _PARALLEL_MIN_FILES else 0
            saved = self.store.persisted
            with self._state_lock:
                self._paths_by_id = self._paths_by_stem = None
                self._haystacks.clear()
                self._bigram_counts.clear()
                with contextlib.closing(_read_sections(jobs, workers)) as results:
                    self._index_sections(root, names, chunks, results, records, saved, started_ns)
                if saved is not None:
                    self._saved_directories = dict(records)
                self._walk_problems = tuple(walk_problems)
                self._swept = True
                self._checked = set()
                self._answers_changed()
            self.last_refresh = RefreshStats(len(refs), 0, len(refs), time.perf_counter() - started)

    def _index_sections(
        self,
        root: str,
        names: Sequence[str | None],
        chunks: Sequence[int],
        results: Iterator[_SectionRead],
        records: dict[str | None, persisted.DirectoryRecord],
        saved: persisted.PersistedIndex | None,
        started_ns: int,
    ) -> None:
        """Index each section from the results of its jobs (`chunks` of them), in order."""
        for name, count in zip(names, chunks, strict=True):
            rows: list[persisted.Entry] = []
            unstatted: list[tuple[ParsedFile, str | None]] = []
            for chunk_rows, chunk_unstatted in islice(results, count):
                rows.extend(chunk_rows)
                unstatted.extend(chunk_unstatted)
            record = records.get(name, persisted.DirectoryRecord())
            self._index_section(root, name, rows, record, saved)
            del rows
            if unstatted:
                self._apply(
                    {
                        parsed.path: _Entry(None, domain_dir, parsed, True, started_ns)
                        for parsed, domain_dir in unstatted
                    },
                    [],
                )

    def _index_section(
        self,
        root: str,
        section_name: str | None,
        rows: list[persisted.Entry],
        record: persisted.DirectoryRecord,
        saved: persisted.PersistedIndex | None,
    ) -> None:
        """Save a section's entries as the persisted index's section, and index that section as
        `_load_section` does."""
        data = persisted.section_data(root, section_name, rows, record)
        if saved is not None:
            saved.write_section_data([(section_name, data)])
        section = indexfile.open_section(data, root, section_name)
        del data
        # Encoded just now, so it opens and its columns are whole.
        assert section is not None
        loaded = self._load_section(root, section_name, section, [])
        assert loaded

    def _save(
        self,
        saved: persisted.PersistedIndex,
        dirty: Collection[str | None],
        records: dict[str | None, persisted.DirectoryRecord],
    ) -> None:
        """Write these sections of the persisted index from memory (best effort, see persisted.py),
        and hold each as a start from the persisted index would hold it (`_hold_saved`).

        `records`: the directories as the walk this memory reflects listed them.
        """
        root = str(self.store.root)
        with self._state_lock:
            held: dict[str | None, list[tuple[str, _Entry]]] = {section: [] for section in dirty}
            for path, entry in self._entries.items():
                if entry.domain_dir in held:
                    held[entry.domain_dir].append((path, entry))
        directories = {section: records.get(section, persisted.DirectoryRecord()) for section in held}
        encoded = self._encoded_sections(root, held, directories)
        saved.write_section_data(encoded)
        for _unwritten in encoded:
            pass  # not written (another process holds the lock): held all the same
        self._saved_directories.update(directories)

    def _encoded_sections(
        self,
        root: str,
        held: dict[str | None, list[tuple[str, _Entry]]],
        directories: dict[str | None, persisted.DirectoryRecord],
    ) -> Iterator[tuple[str | None, bytes]]:
        """Each section's index file, made from these entries one section at a time (a whole
        store's entries at once would be several times what the index holds), and held once
        made (`_hold_saved`). The entries are immutable: no lock is needed to read them."""
        for section_name in list(held):
            rows: list[persisted.Entry] = []
            made_from: dict[str, tuple[str, _Entry]] = {}
            for path, entry in held.pop(section_name):
                if entry.signature is None:
                    continue  # a file that could not be stat'ed: read again each time
                name = persisted.name_in_section(root, path, section_name)
                if entry.section is not None:
                    try:
                        whole = persisted.entry_of_row(
                            name, path, entry.section, entry.row, entry.signature, entry.checked_ns
                        )
                    except ValueError:
                        # The section does not hold what was written after all: save what the file holds.
                        read = read_seed_file(path, entry.domain_dir, None)
                        rows.append(persisted.entry_from_parsed(name, read, time.time_ns()))
                        continue
                else:
                    assert entry.read is not None
                    whole = persisted.entry_from_parts(name, entry.signature, entry.checked_ns, entry.read)
                rows.append(whole)
                made_from[name] = (path, entry)
            data = persisted.section_data(root, section_name, rows, directories[section_name])
            del rows
            self._hold_saved(root, section_name, data, made_from)
            yield section_name, data

    def _hold_saved(
        self, root: str, section_name: str | None, data: bytes, held: dict[str, tuple[str, _Entry]]
    ) -> None:
        """Hold the entries a save just encoded (`data`) as a start from the persisted index holds
        them: each decoded from its row of the section when an answer needs it, and not as the
        parsed seed (and prepared keys) a refresh read, which cost several times as much memory.

        `held`: the entry each row was made from; one that has changed since is left as it is.
        """
        section = indexfile.open_section(data, root, section_name)
        if section is None:
            return
        kept = persisted.kept_of(section)
        try:
            names = section.column(indexfile.NAME)
            for position in persisted.KEPT_COLUMNS:
                section.column(position)  # whole now, so `kept` decodes it when asked
        except ValueError:
            return
        with self._state_lock:
            entries, seeds = self._entries, self._seeds
            for row, name in enumerate(names):
                path, entry = held.get(name, ("", None))
                if entry is None or entries.get(path) is not entry:
                    continue
                entries[path] = entry._replace(read=None, section=kept, row=row)
                keys = seeds.get(path)
                if keys is not None and keys.prepared is not None:
                    seeds[path] = keys._replace(prepared=None)

    def refresh_paths(self, paths: Collection[str], known: Collection[StoredSeed] = ()) -> list[ChangeEvent]:
        """Bring only these files up to date (each read again, or dropped when gone); return what changed.

        For a file just written through the store: the next read sees it at once,
        without a walk of the whole store. Files elsewhere wait for `refresh()`.
        A path a walk of the store would not give is ignored. `known` are seeds
        as just written: a file still holding those bytes is not parsed again.
        """
        known_by_path = {stored.path: stored for stored in known}
        with self._refresh_lock:
            started_ns = time.time_ns()
            fresh: dict[str, _Entry] = {}
            vanished: list[str] = []
            for path in sorted(set(paths)):
                try:
                    domain_dir = domain_dir_of(self.store.root, path)
                except ValueError:
                    continue
                if not os.path.lexists(path) or os.path.isdir(path):
                    if path in self._entries:
                        vanished.append(path)
                    continue
                old = self._entries.get(path)
                earlier = known_by_path.get(path) or (
                    self._parsed(path, old).stored if old is not None else None
                )
                fresh[path] = _read_entry(path, domain_dir, started_ns, earlier)
            with self._state_lock:
                events, changed = self._apply(fresh, vanished)
                if changed:
                    self._answers_changed()
            return events

    def _apply(self, fresh: dict[str, _Entry], vanished: list[str]) -> tuple[list[ChangeEvent], bool]:
        events: list[tuple[str, ChangeEvent]] = []
        changed = bool(vanished)
        for path in vanished:
            removed = self._removed_event(path, self._entries[path])
            del self._entries[path]
            self._unindex(path)
            self._forget_name(path)
            events.append((path, removed))
        for path, entry in fresh.items():
            old = self._entries.get(path)
            self._entries[path] = entry
            if old is None and self._paths_by_stem is not None:
                _add_holder(self._paths_by_stem, file_stem(path), path)
            if (
                old is not None
                and old.revision == entry.revision
                and old.problem(path) == entry.problem(path)
            ):
                continue  # touched, or re-read because racy: same bytes, nothing to tell
            changed = True
            events.extend((path, event) for event in self._change_events(path, old, entry))
            self._unindex(path)
            assert entry.read is not None  # entries from the persisted index come in through _load_section
            parsed = entry.read
            stored = parsed.stored
            if stored is not None:
                self._index(path, stored, entry.domain_dir)
            if parsed.problem is not None or (
                stored is not None and (stored.seed.domain != entry.domain_dir or stored.notes)
            ):
                self._problem_paths.add(path)
            else:
                self._problem_paths.discard(path)
        events.sort(key=lambda item: item[0])
        return [event for _path, event in events], changed

    def _removed_event(self, path: str, old: _Entry) -> ChangeEvent:
        if old.read is None:
            keys = self._seeds.get(path)  # a problem file has none
            if keys is not None:
                return ChangeEvent("removed", path, keys.seed_id, keys.seed_domain, "", None, None)
            return ChangeEvent("removed", path, file_stem(path), old.domain_dir or "", "", None, None)
        stored = self._parsed(path, old).stored
        if stored is not None:
            seed = stored.seed
            return ChangeEvent("removed", path, seed.id, seed.domain, "", None, None)
        return ChangeEvent("removed", path, file_stem(path), old.domain_dir or "", "", None, None)

    def _change_events(self, path: str, old: _Entry | None, new: _Entry) -> list[ChangeEvent]:
        assert new.read is not None
        stored = new.read.stored
        if stored is None:
            problem = new.read.problem
            if old is not None and old.problem(path) == problem:
                return []
            domain = new.domain_dir or ""
            return [ChangeEvent("malformed", path, file_stem(path), domain, new.read.revision, None, problem)]
        seed = stored.seed
        added = ChangeEvent("added", path, seed.id, seed.domain, stored.revision, seed, None)
        previous = self._parsed(path, old).stored if old is not None else None
        if previous is None:
            return [added]
        if (previous.seed.id, previous.seed.domain) != (seed.id, seed.domain):
            # The file now holds another seed: to a watcher keyed by id that is a removal and an addition.
            assert old is not None
            return [self._removed_event(path, old), added]
        if previous.seed == seed:
            return []  # same content, different bytes (formatting)
        only_verdict = _without_verification(previous.seed) == _without_verification(seed)
        kind = "verified" if only_verdict else "updated"
        return [ChangeEvent(kind, path, seed.id, seed.domain, stored.revision, seed, None)]

    def _forget_name(self, path: str) -> None:
        self._problem_paths.discard(path)
        if self._paths_by_stem is not None:
            _discard_holder(self._paths_by_stem, file_stem(path), path)

    def _index(self, path: str, stored: StoredSeed, domain_dir: str | None) -> None:
        prepared = ranking.prepare_seed(stored.seed, stored.path)
        seed = stored.seed
        keys = _SeedKeys(
            seed.id, seed.domain, domain_dir, tuple(prepared.provides), tuple(prepared.texts), prepared
        )
        self._index_keys(path, keys)

    def _index_keys(self, path: str, keys: _SeedKeys) -> None:
        self._seeds[path] = keys
        if self._paths_by_id is not None:
            _add_holder(self._paths_by_id, keys.seed_id, path)
        for value in keys.provides:
            _add_holder(self._by_provides, value, path)
        for text in keys.texts:
            if _add_holder(self._by_text, text, path):
                self._add_to_haystacks(text)

    def _unindex(self, path: str) -> None:
        self._decoded.pop(path, None)
        keys = self._seeds.pop(path, None)
        if keys is None:
            return
        if self._paths_by_id is not None:
            _discard_holder(self._paths_by_id, keys.seed_id, path)
        for value in keys.provides:
            _discard_holder(self._by_provides, value, path)
        for text in keys.texts:
            if _discard_holder(self._by_text, text, path):
                self._text_dropped()

    def _add_to_haystacks(self, text: str) -> None:
        """Add a text new to the index to the haystacks (and counts) already made that cover it."""
        haystacks = self._haystacks
        if not haystacks:
            return
        everything = haystacks.get(_ALL_TEXTS)
        if everything is None:
            return  # bucket haystacks and counts go with the haystack of all texts
        everything.add(text)
        counts = self._bigram_counts
        for bigram in _bigrams(text):
            bucket = haystacks.get(bigram)
            if bucket is not None:
                bucket.add(text)
            if bigram in counts:
                counts[bigram] += 1

    def _text_dropped(self) -> None:
        """A text left the index: it stays in the haystacks (searches look texts up again) until
        they hold more dropped texts than held ones; then they are made again on first use."""
        everything = self._haystacks.get(_ALL_TEXTS)
        if everything is not None and len(everything) > 2 * len(self._by_text):
            self._haystacks.clear()
            self._bigram_counts.clear()

    # -- entries taken from the persisted index ---------------------------

    def start_from_persisted(self) -> bool:
        """Fill the index from the persisted index alone, without walking the store; False if it has none.

        No Seed is built: the search structures come from each entry's stored keys,
        and a seed is decoded when an answer needs it. Racy entries and problem files
        are read now. Until the next whole `refresh()` (the sweep that compares every
        file's signature and finds files added meanwhile) each entry an answer uses
        is checked against its file first, so no answer comes from an entry whose
        file has changed.
        """
        saved = self.store.persisted
        if saved is None:
            return False
        # The load makes a few objects per seed and none cyclic: the cyclic collector, run again
        # and again over a heap that keeps growing, would cost more than the load itself.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._start_from(saved)
        finally:
            if collecting:
                gc.enable()

    def _start_from(self, saved: persisted.PersistedIndex) -> bool:
        with self._refresh_lock:
            started = time.perf_counter()
            root = str(self.store.root)
            suspect: list[str] = []
            records: dict[str | None, persisted.DirectoryRecord] = {}
            with self._state_lock:
                if not self._entries:
                    self._haystacks.clear()
                    self._bigram_counts.clear()
                    self._paths_by_id = self._paths_by_stem = None
                # One section at a time: its file's bytes are dropped before the next is read.
                for section_name, section in saved.open_all_sections():
                    if self._load_section(root, section_name, section, suspect):
                        checked_ns, signatures, domains = section.record
                        records[section_name] = persisted.DirectoryRecord(checked_ns, signatures, domains)
                if not records:
                    return False
                self._saved_directories = dict(records)
                self._swept = False
                self._checked = set()
                self._answers_changed()
                listed_again = self._list_changed_sections(records)
                self._ensure_current(suspect)
            files = len(self._entries)
            read = len(suspect) + listed_again
            self.last_refresh = RefreshStats(files, files - read, read, time.perf_counter() - started)
            return True

    def _list_changed_sections(self, records: dict[str | None, persisted.DirectoryRecord]) -> int:
        """List again each section whose directories are not as its record says, and each domain
        directory the index does not hold; read the files they name that the index lacks and drop
        those it holds that are gone. Returns how many files were read.

        Creating, removing or renaming an entry changes its directory's mtime and ctime, so the
        sections left alone name every file there is.
        """
        root = str(self.store.root)
        stale: set[str | None] = {
            section
            for section, record in records.items()
            if not record.current(indexfile.section_directory(root, section))
        }
        root_record = records.get(None)
        if root_record is None or None in stale:
            root_files, domains = _list_root(self.store.root)
            stale.add(None)
        else:
            root_files, domains = [], list(root_record.domains)
        stale.update(domain_dir for domain_dir in domains if domain_dir not in records)
        # The index's own directory changes with every save, so no record vouches for it; the
        # walk treats it as any directory of the root, and listing it costs little.
        if os.path.isdir(os.path.join(root, persisted.INDEX_DIR_NAME)):
            stale.add(persisted.INDEX_DIR_NAME)
        if not stale:
            return 0
        started_ns = time.time_ns()
        # Only a section the persisted index held has entries to drop.
        held: dict[str | None, list[str]] = {section: [] for section in stale}
        if any(section in records for section in stale):
            for path, entry in self._entries.items():
                if entry.domain_dir in held:
                    held[entry.domain_dir].append(path)
        fresh: dict[str, _Entry] = {}
        vanished: list[str] = []
        for section in sorted(stale, key=lambda name: (name is not None, name or "")):
            present: dict[str, str | None]
            if section is None:
                present = {path: None for path in root_files}
            else:
                refs, _problems = walk_seed_files(self.store.root, section)
                present = {ref.path: ref.domain_dir for ref in refs}
            vanished.extend(path for path in held[section] if path not in present)
            for path, domain_dir in present.items():
                if path not in self._entries:
                    fresh[path] = _read_entry(path, domain_dir, started_ns, None)
        self._unsaved.update(stale)
        for section in stale:
            self._saved_directories.pop(section, None)
        events, changed = self._apply(fresh, vanished)
        self._pending_events.extend(events)
        if changed:
            self._answers_changed()
        return len(fresh)

    def _load_section(
        self, root: str, domain_dir: str | None, section: indexfile.Section, suspect: list[str]
    ) -> bool:
        """Index a section's persisted entries as they are; False when its columns are not whole
        (nothing is indexed: the section is listed and its files read, as for a missing file).

        Only the columns the index uses are decoded, straight into its structures: the
        section keeps, `narrowed`, what a seed is decoded from when an answer needs it
        (`_parsed`), and `_save` makes the entries whole again. The paths of entries that
        must be read before use (racy, or a problem) go to `suspect`.
        """
        kept = persisted.kept_of(section)
        try:
            names = section.column(indexfile.NAME)
            columns = [
                section.column(position)
                for position in (
                    indexfile.SIZE,
                    indexfile.MTIME,
                    indexfile.CTIME,
                    indexfile.INO,
                    indexfile.DEV,
                    indexfile.CHECKED,
                    indexfile.ID,
                    indexfile.DOMAIN,
                    indexfile.KEYS,
                    indexfile.NOTES,
                    indexfile.PROBLEM,
                )
            ]
            for position in persisted.KEPT_COLUMNS:
                section.column(position)  # whole now, so `kept` decodes it when asked
        except ValueError:
            return False
        window = persisted.RACY_WINDOW_NS
        new_tuple = tuple.__new__  # the named tuples' own constructors add a Python call a row
        prefix = indexfile.section_prefix(root, domain_dir)
        entries = self._entries
        seeds = self._seeds
        by_provides = self._by_provides
        by_text = self._by_text
        problem_paths = self._problem_paths
        for row, (
            name,
            size,
            mtime,
            ctime,
            ino,
            dev,
            checked,
            seed_id,
            seed_domain,
            keys,
            notes,
            problem,
        ) in enumerate(zip(names, *columns, strict=True)):
            path = prefix + name
            if path in entries:
                continue
            racy = (mtime if mtime > ctime else ctime) + window >= checked
            entries[path] = new_tuple(
                _Entry, ((size, mtime, ctime, ino, dev), domain_dir, None, racy, checked, kept, row)
            )
            if problem is not None:
                problem_paths.add(path)
                suspect.append(path)
                continue
            if seed_domain == domain_dir:
                seed_domain = domain_dir
            provides, texts = keys
            seeds[path] = new_tuple(_SeedKeys, (seed_id, seed_domain, domain_dir, provides, texts, None))
            # `_index_keys` without the lookup postings (built when needed) and with most keys new.
            for value in provides:
                if by_provides.setdefault(value, path) is not path:
                    _add_holder(by_provides, value, path)
            for text in texts:
                if by_text.setdefault(text, path) is not path:
                    _add_holder(by_text, text, path)
            if seed_domain != domain_dir or notes:
                problem_paths.add(path)
            if racy:
                suspect.append(path)
        return True

    def _ensure_current(self, paths: Iterable[str]) -> bool:
        """Before the first sweep: read again each of `paths` whose file no longer has its entry's signature.

        Returns whether any entry changed (the caller then looks again). The changes
        are handed to watchers by the next refresh, which also saves them.
        """
        if self._swept:
            return False
        stale: list[str] = []
        for path in paths:
            if path in self._checked:
                continue
            entry = self._entries.get(path)
            if entry is None or entry.section is None:
                continue
            if entry.racy or _signature_of(path) != entry.signature:
                stale.append(path)
            else:
                self._checked.add(path)
        if not stale:
            return False
        started_ns = time.time_ns()
        fresh: dict[str, _Entry] = {}
        vanished: list[str] = []
        for path in stale:
            entry = self._entries[path]
            if not os.path.lexists(path) or os.path.isdir(path):
                vanished.append(path)
                continue
            fresh[path] = self._read_again(path, entry, started_ns)
        self._unsaved.update(self._entries[path].domain_dir for path in stale)
        events, changed = self._apply(fresh, vanished)
        self._pending_events.extend(events)
        self._checked.update(stale)
        if changed:
            self._answers_changed()
        return changed

    def _read_again(self, path: str, old: _Entry, started_ns: int) -> _Entry:
        """`old`'s file read again. When its bytes are those an entry taken from the persisted
        index stands for (a file touched, or read again because its entry was racy), that
        entry itself, with this read's signature and instant: the index keeps it in that
        compact form, and decodes and parses nothing."""
        read = read_seed_bytes(path)
        if isinstance(read, ParsedFile):
            return _entry_of(read, old.domain_dir, started_ns)
        if old.section is not None and read.revision == old.revision:
            signature = persisted.signature_of(read.stat_result)
            return old._replace(
                signature=old.signature if signature == old.signature else signature,
                racy=_is_racy(read.stat_result, started_ns),
                checked_ns=started_ns,
            )
        # A parse held in memory is reused when the bytes are its own (`parse_seed_bytes`).
        known = old.read.stored if old.read is not None else None
        return _entry_of(parse_seed_bytes(read, old.domain_dir, known), old.domain_dir, started_ns)

    def _parsed(self, path: str, entry: _Entry) -> ParsedFile:
        """What the entry's file parsed to; decoded (and kept a while) for a persisted entry."""
        if entry.read is not None:
            return entry.read
        with self._state_lock:  # the cache is shared by answers and the refresh
            cached = self._decoded.get(path)
            if cached is not None:
                self._decoded.move_to_end(path)
                return cached[0]
            assert entry.section is not None
            try:
                parsed: ParsedFile = persisted.parsed_of_row(path, entry.section, entry.row)
            except ValueError:
                # The section does not hold what was written after all: never answer from it.
                parsed = dataclasses.replace(read_seed_file(path, entry.domain_dir, None), stat_result=None)
            self._remember(path, parsed, None)
            return parsed

    def _remember(self, path: str, parsed: ParsedFile, prepared: ranking.PreparedSeed | None) -> None:
        self._decoded[path] = (parsed, prepared)
        self._decoded.move_to_end(path)
        while len(self._decoded) > _DECODED_CACHE_SIZE:
            self._decoded.popitem(last=False)

    def _stored(self, path: str) -> StoredSeed:
        stored = self._parsed(path, self._entries[path]).stored
        assert stored is not None
        return stored

    def _prepared(self, path: str, keys: _SeedKeys) -> ranking.PreparedSeed:
        if keys.prepared is not None:
            return keys.prepared
        cached = self._decoded.get(path)
        if cached is not None and cached[1] is not None:
            self._decoded.move_to_end(path)
            return cached[1]
        parsed = self._parsed(path, self._entries[path])
        assert parsed.stored is not None
        prepared = ranking.prepare_seed(parsed.stored.seed, path)
        self._remember(path, parsed, prepared)
        return prepared

    def _lookup_postings(self) -> tuple[dict[str, _Holders], dict[str, _Holders]]:
        """The lookup postings (`_paths_by_id`, `_paths_by_stem`), built from the entries if need be."""
        by_id, by_stem = self._paths_by_id, self._paths_by_stem
        if by_id is not None and by_stem is not None:
            return by_id, by_stem
        by_id, by_stem = {}, {}
        seeds = self._seeds
        for path in self._entries:
            stem = file_stem(path)
            keys = seeds.get(path)
            if keys is not None:
                seed_id = keys.seed_id
                if stem == seed_id:
                    stem = seed_id  # one string for both keys (most files are named after their seed)
                if by_id.setdefault(seed_id, path) is not path:
                    _add_holder(by_id, seed_id, path)
            if by_stem.setdefault(stem, path) is not path:
                _add_holder(by_stem, stem, path)
        self._paths_by_id, self._paths_by_stem = by_id, by_stem
        return by_id, by_stem

    # -- reading ---------------------------------------------------------

    @contextlib.contextmanager
    def held_if_free(self) -> Iterator[bool]:
        """Hold the index still if no refresh is applying its changes; yields whether it is held.

        Every read below only touches memory, so while this yields True they
        answer at once: the service then reads on its event loop, and falls back
        to a worker thread (which may wait for the refresh) when it yields False.
        """
        held = self._state_lock.acquire(blocking=False)
        try:
            yield held
        finally:
            if held:
                self._state_lock.release()

    def scope(self, domain: str | None) -> LoadedScope:
        """What `SeedStore.load(domain)` returns, from memory (as of the last refresh)."""

        def build(paths: list[str]) -> LoadedScope:
            seeds = [self._stored(path) for path in sorted(paths)]
            return LoadedScope(tuple(seeds), self._problems(domain))

        return self._whole_scope(self._scope_cache, domain, build)

    def listing(self, domain: str | None) -> tuple[tuple[ListedSeed, ...], tuple[Problem, ...]]:
        """What `SeedStore.listing(domain)` returns, from memory (as of the last refresh), the rows
        sorted by (domain, id, path) and the problems by (path, line, reason).

        No seed is decoded for an entry taken from the persisted index: its row is the one the
        index wrote for the same bytes (`persisted.listed_of_row`).
        """

        def build(paths: list[str]) -> tuple[tuple[ListedSeed, ...], tuple[Problem, ...]]:
            columns: _Columns = {}
            listed = sorted((self._listed(path, columns) for path in paths), key=paging.seed_key)
            return tuple(listed), tuple(sorted(self._problems(domain), key=paging.problem_key))

        return self._whole_scope(self._listing_cache, domain, build)

    def _whole_scope(
        self, cache: dict[str | None, _Answer], domain: str | None, build: Callable[[list[str]], _Answer]
    ) -> _Answer:
        """`build` of the paths of the seeds in scope, each checked against its file first
        (`_ensure_current`), kept in `cache` until an entry changes (`_answers_changed`)."""
        if domain is not None:
            validate_identifier(domain, "domain")
        with self._state_lock:
            cached = cache.get(domain)
            if cached is not None:
                return cached
            while True:
                seeds = self._seeds.items()
                paths = [path for path, keys in seeds if domain is None or _in_domain(keys, domain)]
                if not self._ensure_current(paths):
                    break
            answer = build(paths)
            _remember(cache, domain, answer)
            return answer

    def _listed(self, path: str, columns: _Columns) -> ListedSeed:
        """The `list` row of the seed in `path`; from its section's `list` rows for an entry taken
        from the persisted index (`persisted.listed_of_row`)."""
        entry = self._entries[path]
        section = entry.section
        if entry.read is None and section is not None:
            rows = _column(section, indexfile.ROW, columns)
            if rows is not None:
                keys = self._seeds[path]
                with contextlib.suppress(ValueError):
                    return persisted.listed_of_row(
                        path, keys.seed_id, keys.seed_domain, rows[entry.row], entry.revision
                    )
        stored = self._stored(path)
        return listed_seed(stored.seed, path, stored.revision)

    def _answers_changed(self) -> None:
        """Drop what was built from whole scopes: an entry, or the walk's problems, changed."""
        self._scope_cache.clear()
        self._problem_cache.clear()
        self._listing_cache.clear()

    def problems(self, domain: str | None) -> tuple[Problem, ...]:
        """What `scope(domain).problems` holds, without building the scope."""
        if domain is not None:
            validate_identifier(domain, "domain")
        with self._state_lock:
            return self._problems(domain)

    def candidate_paths(self, seed_id: str, domain: str | None) -> tuple[str, ...]:
        """The files of the scope that can decide a lookup of `seed_id`, sorted.

        Those holding a seed with that id, and those named after it (a broken file
        may be that seed). `locate_in_scope` over just these answers as it would over the whole scope.
        """
        if domain is not None:
            validate_identifier(domain, "domain")
        with self._state_lock:
            by_id, by_stem = self._lookup_postings()
            paths = {*_holders(by_id, seed_id), *_holders(by_stem, seed_id)}
            return tuple(
                sorted(path for path in paths if domain is None or self._entries[path].domain_dir == domain)
            )

    def lookup(self, seed_id: str, domain: str | None) -> LoadedScope:
        """The part of `scope(domain)` made of the candidate files of `seed_id` (as of the last refresh)."""
        with self._state_lock:
            paths = self.candidate_paths(seed_id, domain)
            if self._ensure_current(paths):
                paths = self.candidate_paths(seed_id, domain)
            return scope_from_files((self._parsed(path, self._entries[path]) for path in paths), domain)

    def _problems(self, domain: str | None) -> tuple[Problem, ...]:
        cached = self._problem_cache.get(domain)
        if cached is not None:
            return cached
        problems: list[Problem] = []
        if domain is None:
            problems.extend(self._walk_problems)
        else:
            domain_path = str(self.store.root / domain)
            problems.extend(
                problem
                for problem in self._walk_problems
                if problem.path == domain_path or problem.path.startswith(domain_path + os.sep)
            )
        for path in self._problem_paths:
            entry = self._entries[path]
            if domain is not None and entry.domain_dir != domain:
                continue
            parsed = self._parsed(path, entry)
            if parsed.problem is not None:
                problems.append(parsed.problem)
            elif domain is not None and parsed.stored is not None and parsed.stored.seed.domain != domain:
                problems.append(domain_mismatch_problem(parsed.stored, domain, parsed.domain_line))
            elif parsed.stored is not None:
                problems.extend(parsed.stored.notes)
        problems.sort(key=lambda problem: problem.path)
        result = tuple(problems)
        _remember(self._problem_cache, domain, result)
        return result

    def search(self, query: ranking.SearchQuery) -> tuple[ranking.SearchResult, tuple[Problem, ...]]:
        """Exactly `ranking.search(scope seeds, query)`, scoring only the seeds that can match."""
        ranking.validate_query(query)
        with self._state_lock:
            requested = canonical(query.capability)
            while True:
                problems = self._problems(query.domain)
                # "" is in every text: every seed with an alias or evidence text matches it.
                matched = self._matching_paths(requested) if requested else set(self._seeds)
                if not self._ensure_current(matched):
                    break
            candidates: list[ranking.RankedCandidate] = []
            # More seeds than the decoded cache holds would each be decoded again by the next such
            # search: those are scored from their sections' columns instead, decoded for this
            # search only. Fewer are decoded, and kept for the searches that follow.
            columns: _Columns | None = {} if len(matched) > _COLUMN_SCORING_MIN else None
            # Path order, as the reference iterates: finish_search's sort is stable.
            for path in sorted(matched):
                keys = self._seeds[path]
                if query.domain is not None and not _in_domain(keys, query.domain):
                    continue
                candidate = self._candidate(path, keys, requested, query, columns)
                if candidate is not None:
                    candidates.append(candidate)
            return ranking.finish_search(candidates, query), problems

    def _candidate(
        self,
        path: str,
        keys: _SeedKeys,
        requested: str,
        query: ranking.SearchQuery,
        columns: _Columns | None,
    ) -> ranking.RankedCandidate | None:
        """`ranking.score_prepared` of the seed in `path`; given `columns`, for an entry taken from
        the persisted index whose seed is not decoded, from its section's rank inputs and `list`
        row (the values `ranking.prepare_seed` gives for the same bytes): no seed is decoded."""
        entry = self._entries[path]
        section = entry.section
        if (
            columns is not None
            and keys.prepared is None
            and entry.read is None
            and section is not None
            and path not in self._decoded
        ):
            ranks = _column(section, indexfile.RANK, columns)
            rows = _column(section, indexfile.ROW, columns)
            if ranks is not None and rows is not None:
                preferred_for, avoid_for, priority, external_service, may_cost_money, risks, gates = ranks[
                    entry.row
                ]
                inputs = ranking.ScoreInputs(
                    seed_id=keys.seed_id,
                    domain=keys.seed_domain,
                    path=path,
                    status=rows[entry.row][2],
                    provides=keys.provides,
                    texts=keys.texts,
                    preferred_for=preferred_for,
                    avoid_for=avoid_for,
                    priority=priority,
                    external_service=external_service,
                    may_cost_money=may_cost_money,
                    risks=risks,
                    required_gates=gates,
                )
                return ranking.score_inputs(requested, query, inputs)
        return ranking.score_prepared(self._prepared(path, keys), requested, query)

    def _matching_paths(self, requested: str) -> set[str]:
        matched: set[str] = set(_holders(self._by_provides, requested))
        by_text = self._by_text
        # The requested term contains the text; "" is in every term. A non-empty canonical
        # text neither starts nor ends with "_", so no other slice can be one.
        matched.update(_holders(by_text, ""))
        length = len(requested)
        for start in range(length):
            if requested[start] == "_":
                continue
            for end in range(start + 1, length + 1):
                if requested[end - 1] != "_":
                    matched.update(_holders(by_text, requested[start:end]))
        # The text contains the requested term.
        for text in self._texts_containing(requested):
            matched.update(_holders(by_text, text))
        return matched

    def _texts_containing(self, requested: str) -> Iterator[str]:
        if len(requested) == 1:
            return self._all_texts().texts_containing(requested)
        rarest = min(_bigrams(requested), key=self._bigram_count)
        if not self._bigram_count(rarest):
            return iter(())
        haystack = self._haystacks.get(rarest)
        if haystack is None:
            # The texts holding the bigram: a bigram never spans the separator.
            bucket = self._all_texts().texts_containing(rarest)
            haystack = self._haystacks[rarest] = _Haystack(bucket)
        return haystack.texts_containing(requested)

    def _all_texts(self) -> _Haystack:
        haystack = self._haystacks.get(_ALL_TEXTS)
        if haystack is None:
            # Bucket haystacks and counts are made from this one, and go with it.
            self._haystacks.clear()
            self._bigram_counts.clear()
            haystack = self._haystacks[_ALL_TEXTS] = _Haystack(self._by_text.keys())
        return haystack

    def _bigram_count(self, bigram: str) -> int:
        """How rare `bigram` is: its occurrences in the haystack of all texts, plus one for each
        text added since that holds it (0: no text holds it)."""
        count = self._bigram_counts.get(bigram)
        if count is None:
            count = self._bigram_counts[bigram] = self._all_texts().count(bigram)
        return count


_Holders = str | set[str]
# The columns of sections one answer decoded (`_column`), for that answer only.
_Columns = dict[tuple[indexfile.Section, int], list[Any] | None]


def _remember(cache: dict[str | None, _Answer], domain: str | None, answer: _Answer) -> None:
    """Keep `answer` for `domain`, the earliest kept one dropped when `_CACHED_SCOPES` are kept."""
    if len(cache) >= _CACHED_SCOPES:
        del cache[next(iter(cache))]
    cache[domain] = answer


def _column(section: indexfile.Section, position: int, columns: _Columns) -> list[Any] | None:
    """`section.column(position)`, decoded once per answer and not kept by the section; None when
    it is not the column written (each seed it would answer for is decoded instead)."""
    key = (section, position)
    if key not in columns:
        try:
            columns[key] = section.column(position, keep=False)
        except ValueError:
            columns[key] = None
    return columns[key]


def _add_holder(postings: dict[str, _Holders], key: str, path: str) -> bool:
    """Add `path` to the holders of `key`; True when `key` had none."""
    holders = postings.get(key)
    if holders is None:
        postings[key] = path
        return True
    if isinstance(holders, str):
        if holders != path:
            postings[key] = {holders, path}
    else:
        holders.add(path)
    return False


def _discard_holder(postings: dict[str, _Holders], key: str, path: str) -> bool:
    """Take `path` from the holders of `key`; True when `key` has none left (and is gone)."""
    holders = postings.get(key)
    if holders is None:
        return False
    if isinstance(holders, str):
        if holders != path:
            return False
        del postings[key]
        return True
    holders.discard(path)
    if len(holders) == 1:
        postings[key] = next(iter(holders))
    elif not holders:
        del postings[key]
        return True
    return False


def _holders(postings: dict[str, _Holders], key: str) -> Collection[str]:
    holders = postings.get(key)
    if holders is None:
        return ()
    return (holders,) if isinstance(holders, str) else holders


def _in_domain(keys: _SeedKeys, domain: str) -> bool:
    """Whether `load(domain)` would return the seed: stored under that domain and declaring it."""
    return keys.domain_dir == domain and keys.seed_domain == domain


def _read_entry(path: str, domain_dir: str | None, started_ns: int, known: StoredSeed | None) -> _Entry:
    # `known`: an earlier parse, reused when the bytes are unchanged (a racy or just-written file).
    return _entry_of(read_seed_file(path, domain_dir, known), domain_dir, started_ns)


def _is_racy(stat_result: os.stat_result, started_ns: int) -> bool:
    """Whether a file so stat'ed by a read that started at `started_ns` may change unseen."""
    return stat_result.st_mtime_ns + _RACY_WINDOW_NS >= started_ns


def _entry_of(parsed: ParsedFile, domain_dir: str | None, started_ns: int) -> _Entry:
    """The entry of what a read that started at `started_ns` gave."""
    stat_result = parsed.stat_result
    if stat_result is None:
        return _Entry(None, domain_dir, parsed, True, started_ns)
    signature = persisted.signature_of(stat_result)
    racy = _is_racy(stat_result, started_ns)
    # The entry lives as long as the file is indexed: keep the five numbers, not the
    # whole os.stat_result (~570 bytes a seed, a tenth of what an indexed seed costs).
    return _Entry(signature, domain_dir, dataclasses.replace(parsed, stat_result=None), racy, started_ns)


# A store with fewer seed files is built in one process: starting the workers would cost more
# than they save.
_PARALLEL_MIN_FILES = 20_000
# The most files one job of the build reads.
_CHUNK_FILES = 1000

_SectionJob = tuple[str, list[tuple[str, str | None]], int]  # root, (path, domain dir) each, started_ns
# The persisted entries of a job's files, and what the files that could not be stat'ed gave
# (with their domain directories).
_SectionRead = tuple[list[persisted.Entry], list[tuple[ParsedFile, str | None]]]


def _read_section(job: _SectionJob) -> _SectionRead:
    """Read and parse some of a section's files into the entries the persisted index writes.

    Module level and of plain values, so a worker process runs it as this one would.
    """
    root, files, started_ns = job
    rows: list[persisted.Entry] = []
    unstatted: list[tuple[ParsedFile, str | None]] = []
    for path, domain_dir in files:
        parsed = read_seed_file(path, domain_dir, None)
        if parsed.stat_result is None:
            unstatted.append((parsed, domain_dir))
            continue
        name = persisted.name_in_section(root, path, domain_dir)
        signature = persisted.signature_of(parsed.stat_result)
        rows.append(persisted.entry_from_parts(name, signature, started_ns, parsed))
    return rows, unstatted


def _read_sections(jobs: Sequence[_SectionJob], workers: int) -> Generator[_SectionRead, None, None]:
    """`_read_section` of each job, in order: by a pool of `workers` processes when more than one,
    the jobs a pool could not do (it did not start, or broke) read here."""
    done = 0
    if workers > 1 and len(jobs) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        # spawn: this process runs threads (the event loop's, gRPC's), which a fork would not carry.
        context = multiprocessing.get_context("spawn")
        try:
            with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
                for result in pool.map(_read_section, jobs):
                    yield result
                    done += 1
        except (OSError, BrokenProcessPool):
            pass
    for job in jobs[done:]:
        yield _read_section(job)


def _cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _section_order(section: str | None) -> tuple[bool, str]:
    """The root's section first, then the domains by name."""
    return section is not None, section or ""


def _entry_from_persisted(
    saved: persisted.Entry | None, path: str, domain_dir: str | None, signature: Signature
) -> _Entry | None:
    """The entry the persisted index holds for `path`, if its signature is current and not racy."""
    if saved is None:
        return None
    try:
        parsed = persisted.parsed_from_entry(path, domain_dir, saved, signature)
    except (KeyError, TypeError, ValueError, IndexError):
        return None  # an entry this version cannot use: read the file
    if parsed is None:
        return None
    return _Entry(signature, domain_dir, parsed, False, persisted.checked_ns_of(saved))


def _list_root(root: os.PathLike[str] | str) -> tuple[list[str], list[str]]:
    """The seed files lying in the store root and its domain directories, by the walk's rules
    (`store.walk_seed_files`: symlinks followed, a directory that is the root itself skipped)."""
    root_text = str(root)
    prefix = indexfile.section_prefix(root_text, None)
    files: list[str] = []
    domains: list[str] = []
    try:
        root_stat = os.stat(root_text)
        with os.scandir(root_text) as listing:
            found = sorted(listing, key=lambda entry: entry.name)
    except OSError:
        return files, domains
    for entry in found:
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            if entry.name.endswith(SEED_SUFFIXES):
                files.append(prefix + entry.name)
            continue
        with contextlib.suppress(OSError):
            entry_stat = entry.stat()
            if (entry_stat.st_dev, entry_stat.st_ino) != (root_stat.st_dev, root_stat.st_ino):
                domains.append(entry.name)
    return files, domains


def _signature_of(path: str) -> Signature | None:
    try:
        stat_result = os.stat(path)
    except OSError:
        return None
    return persisted.signature_of(stat_result)
