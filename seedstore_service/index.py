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
  canonical alias/evidence texts are bucketed by the two-character strings
  (bigrams) they contain. A text holding the term holds each of its bigrams, so
  only the bucket of the term's rarest bigram is searched: its texts joined by
  "\\x00" into one haystack, scanned with `str.find`, offsets mapped back to
  texts with `bisect`. A bucket's haystack is built on first use and dropped
  when its texts change; a one-character term scans a haystack of all texts;
* alias/evidence, the requested term contains `canonical(text)`: every
  substring of the (short) term looked up in a dict of canonical texts.

A requested term that canonicalises to "" matches nearly everything; that case
goes to the linear reference implementation.

Each indexed seed keeps a `ranking.PreparedSeed` (its canonical forms, computed
when the file is read), so scoring a match costs set lookups, not canonicalisation.

`refresh_paths()` re-reads named files only: the service calls it for the file it
has just written, so a write does not pay for a walk of the whole store. For
writes, `candidate_paths()` names the files that can decide a lookup by id, and
`lookup()` answers one from memory.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import os
import threading
import time
from array import array
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from agentsidecar.seedstore_service import persisted, ranking
from agentsidecar.seedstore_service.model import Problem, Seed
from agentsidecar.seedstore_service.seedtext import canonical, validate_identifier
from agentsidecar.seedstore_service.store import (
    LoadedScope,
    ParsedFile,
    SeedStore,
    StoredSeed,
    domain_dir_of,
    domain_mismatch_problem,
    file_stem,
    read_seed_file,
    scope_from_files,
    walk_seed_files,
)

# A file whose mtime is this close to the refresh that read it is read again next time.
_RACY_WINDOW_NS = 2_000_000_000
_SEPARATOR = "\x00"  # never produced by canonical()
_ALL_TEXTS = ""  # the haystack key of the all-texts haystack (bucket keys are bigrams)

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


@dataclass(frozen=True, slots=True)
class _Entry:
    signature: Signature | None
    domain_dir: str | None
    parsed: ParsedFile
    # Read too soon after its last modification to trust the signature.
    racy: bool
    # When the read that gave `parsed` started (time.time_ns()).
    checked_ns: int = 0


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
    """Texts joined by a separator they never contain, searched with one `str.find` pass."""

    __slots__ = ("joined", "starts", "texts")

    def __init__(self, texts: Collection[str]) -> None:
        self.texts = list(texts)
        # array: a 100k-seed store has millions of offsets across buckets; boxed ints would triple that.
        self.starts = array("q")
        offset = 0
        for text in self.texts:
            self.starts.append(offset)
            offset += len(text) + len(_SEPARATOR)
        self.joined = _SEPARATOR.join(self.texts)

    def texts_containing(self, needle: str) -> Iterator[str]:
        """Each text holding `needle` (non-empty, separator-free) once."""
        position = self.joined.find(needle)
        while position != -1:
            number = bisect.bisect_right(self.starts, position) - 1
            yield self.texts[number]
            if number + 1 >= len(self.starts):
                return
            position = self.joined.find(needle, self.starts[number + 1])


class SeedIndex:
    """The parsed content of a SeedStore, kept in memory and brought up to date by `refresh()`."""

    def __init__(self, store: SeedStore) -> None:
        self.store = store
        self._entries: dict[str, _Entry] = {}
        self._walk_problems: tuple[Problem, ...] = ()
        # Search structures, maintained incrementally; keys are seed file paths.
        self._seeds: dict[str, tuple[StoredSeed, str | None, ranking.PreparedSeed]] = {}
        # Lookup by id: the files holding each id, and every file by its name's stem.
        self._paths_by_id: dict[str, set[str]] = {}
        self._paths_by_stem: dict[str, set[str]] = {}
        # Files that are a problem, or hold a seed declaring another domain than its directory.
        self._problem_paths: set[str] = set()
        self._by_provides: dict[str, set[str]] = {}
        self._by_text: dict[str, set[str]] = {}
        self._texts_by_bigram: dict[str, set[str]] = {}
        # Built on first use; dropped when the texts they hold change (keys: bigram or _ALL_TEXTS).
        self._haystacks: dict[str, _Haystack] = {}
        self._scope_cache: dict[str | None, LoadedScope] = {}
        self._problem_cache: dict[str | None, tuple[Problem, ...]] = {}
        # The persisted index is consulted for files this index has not read yet (the first
        # refresh after a start) and saved after a whole refresh that read any file.
        self.last_refresh: RefreshStats | None = None
        # One refresh at a time; searches wait only while a refresh applies its changes.
        self._refresh_lock = threading.Lock()
        self._state_lock = threading.RLock()

    # -- refresh ---------------------------------------------------------

    def refresh(self, domain: str | None = None) -> list[ChangeEvent]:
        """Bring the index up to date with the files; return what changed, in path order.

        With `domain`, only that domain's files are walked (those of other
        domains, and the walk's own problems, wait for a whole refresh).
        """
        with self._refresh_lock:
            started = time.perf_counter()
            started_ns = time.time_ns()
            refs, walk_problems = walk_seed_files(self.store.root, domain)
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
                known = old.parsed.stored if old is not None else None
                fresh[ref.path] = _read_entry(ref.path, ref.domain_dir, started_ns, known)
            vanished = [
                path
                for path, entry in self._entries.items()
                if path not in seen and (domain is None or entry.domain_dir == domain)
            ]
            # The sections of the persisted index that no longer match memory.
            dirty = {entry.domain_dir for path, entry in fresh.items() if path not in taken}
            dirty.update(self._entries[path].domain_dir for path in vanished)
            with self._state_lock:
                events, changed = self._apply(fresh, vanished)
                walk_changed = domain is None and tuple(walk_problems) != self._walk_problems
                if walk_changed:
                    self._walk_problems = tuple(walk_problems)
                if changed or walk_changed:
                    self._scope_cache.clear()
                    self._problem_cache.clear()
            read = len(fresh) - len(taken)
            if saved is not None and domain is None and dirty:
                self._save(saved, dirty)
            self.last_refresh = RefreshStats(len(refs), len(taken), read, time.perf_counter() - started)
            return events

    def _save(self, saved: persisted.PersistedIndex, dirty: Collection[str | None]) -> None:
        """Write these sections of the persisted index from memory (best effort, see persisted.py)."""
        with self._state_lock:
            sections: dict[str | None, list[persisted.Entry]] = {section: [] for section in dirty}
            for path, entry in self._entries.items():
                if entry.signature is None or entry.domain_dir not in sections:
                    continue
                name = persisted.name_in_section(str(self.store.root), path, entry.domain_dir)
                sections[entry.domain_dir].append(
                    persisted.entry_from_parts(name, entry.signature, entry.checked_ns, entry.parsed)
                )
        saved.write_sections(sections)

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
                earlier = known_by_path.get(path) or (old.parsed.stored if old is not None else None)
                fresh[path] = _read_entry(path, domain_dir, started_ns, earlier)
            with self._state_lock:
                events, changed = self._apply(fresh, vanished)
                if changed:
                    self._scope_cache.clear()
                    self._problem_cache.clear()
            return events

    def _apply(self, fresh: dict[str, _Entry], vanished: list[str]) -> tuple[list[ChangeEvent], bool]:
        events: list[tuple[str, ChangeEvent]] = []
        changed = bool(vanished)
        for path in vanished:
            gone = self._entries.pop(path)
            self._unindex(path)
            self._forget_name(path)
            events.append((path, self._removed_event(path, gone)))
        for path, entry in fresh.items():
            old = self._entries.get(path)
            self._entries[path] = entry
            if old is None:
                self._paths_by_stem.setdefault(file_stem(path), set()).add(path)
            if (
                old is not None
                and old.parsed.revision == entry.parsed.revision
                and old.parsed.problem == entry.parsed.problem
            ):
                continue  # touched, or re-read because racy: same bytes, nothing to tell
            changed = True
            self._unindex(path)
            stored = entry.parsed.stored
            if stored is not None:
                self._index(path, stored, entry.domain_dir)
            if entry.parsed.problem is not None or (
                stored is not None and (stored.seed.domain != entry.domain_dir or stored.notes)
            ):
                self._problem_paths.add(path)
            else:
                self._problem_paths.discard(path)
            events.extend((path, event) for event in self._change_events(path, old, entry))
        events.sort(key=lambda item: item[0])
        return [event for _path, event in events], changed

    @staticmethod
    def _removed_event(path: str, old: _Entry) -> ChangeEvent:
        if old.parsed.stored is not None:
            seed = old.parsed.stored.seed
            return ChangeEvent("removed", path, seed.id, seed.domain, "", None, None)
        return ChangeEvent("removed", path, file_stem(path), old.domain_dir or "", "", None, None)

    def _change_events(self, path: str, old: _Entry | None, new: _Entry) -> list[ChangeEvent]:
        stored = new.parsed.stored
        if stored is None:
            problem = new.parsed.problem
            if old is not None and old.parsed.problem == problem:
                return []
            domain = new.domain_dir or ""
            return [
                ChangeEvent("malformed", path, file_stem(path), domain, new.parsed.revision, None, problem)
            ]
        seed = stored.seed
        added = ChangeEvent("added", path, seed.id, seed.domain, stored.revision, seed, None)
        previous = old.parsed.stored if old is not None else None
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
        stem = file_stem(path)
        holders = self._paths_by_stem[stem]
        holders.discard(path)
        if not holders:
            del self._paths_by_stem[stem]

    def _index(self, path: str, stored: StoredSeed, domain_dir: str | None) -> None:
        keys = ranking.prepare_seed(stored.seed, stored.path)
        self._seeds[path] = (stored, domain_dir, keys)
        self._paths_by_id.setdefault(stored.seed.id, set()).add(path)
        for value in keys.provides:
            self._by_provides.setdefault(value, set()).add(path)
        for text in keys.texts:
            holders = self._by_text.get(text)
            if holders is None:
                self._by_text[text] = {path}
                self._haystacks.pop(_ALL_TEXTS, None)
                for bigram in _bigrams(text):
                    self._texts_by_bigram.setdefault(bigram, set()).add(text)
                    self._haystacks.pop(bigram, None)
            else:
                holders.add(path)

    def _unindex(self, path: str) -> None:
        record = self._seeds.pop(path, None)
        if record is None:
            return
        seed_id = record[0].seed.id
        id_holders = self._paths_by_id[seed_id]
        id_holders.discard(path)
        if not id_holders:
            del self._paths_by_id[seed_id]
        keys = record[2]
        for value in keys.provides:
            holders = self._by_provides[value]
            holders.discard(path)
            if not holders:
                del self._by_provides[value]
        for text in keys.texts:
            holders = self._by_text[text]
            holders.discard(path)
            if not holders:
                del self._by_text[text]
                self._haystacks.pop(_ALL_TEXTS, None)
                for bigram in _bigrams(text):
                    bucket = self._texts_by_bigram[bigram]
                    bucket.discard(text)
                    if not bucket:
                        del self._texts_by_bigram[bigram]
                    self._haystacks.pop(bigram, None)

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
        if domain is not None:
            validate_identifier(domain, "domain")
        with self._state_lock:
            cached = self._scope_cache.get(domain)
            if cached is not None:
                return cached
            seeds: list[StoredSeed] = []
            for stored, domain_dir, _keys in self._seeds.values():
                if domain is None or _in_domain(stored, domain_dir, domain):
                    seeds.append(stored)
            seeds.sort(key=lambda stored: stored.path)
            scope = LoadedScope(tuple(seeds), self._problems(domain))
            self._scope_cache[domain] = scope
            return scope

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
            paths = self._paths_by_id.get(seed_id, set()) | self._paths_by_stem.get(seed_id, set())
            return tuple(
                sorted(path for path in paths if domain is None or self._entries[path].domain_dir == domain)
            )

    def lookup(self, seed_id: str, domain: str | None) -> LoadedScope:
        """The part of `scope(domain)` made of the candidate files of `seed_id` (as of the last refresh)."""
        with self._state_lock:
            paths = self.candidate_paths(seed_id, domain)
            return scope_from_files((self._entries[path].parsed for path in paths), domain)

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
            parsed = entry.parsed
            if parsed.problem is not None:
                problems.append(parsed.problem)
            elif domain is not None and parsed.stored is not None and parsed.stored.seed.domain != domain:
                problems.append(domain_mismatch_problem(parsed.stored, domain, parsed.domain_line))
            elif parsed.stored is not None:
                problems.extend(parsed.stored.notes)
        problems.sort(key=lambda problem: problem.path)
        result = tuple(problems)
        self._problem_cache[domain] = result
        return result

    def search(self, query: ranking.SearchQuery) -> tuple[ranking.SearchResult, tuple[Problem, ...]]:
        """Exactly `ranking.search(scope seeds, query)`, scoring only the seeds that can match."""
        ranking.validate_query(query)
        with self._state_lock:
            problems = self._problems(query.domain)
            requested = canonical(query.capability)
            if not requested:
                # Everything with an alias or evidence text matches "": the linear reference is as good.
                seeds = self.scope(query.domain).seeds
                return ranking.search(((stored.seed, stored.path) for stored in seeds), query), problems
            matched = self._matching_paths(requested)
            candidates: list[ranking.RankedCandidate] = []
            # Path order, as the reference iterates: finish_search's sort is stable.
            for path in sorted(matched):
                stored, domain_dir, prepared = self._seeds[path]
                if query.domain is not None and not _in_domain(stored, domain_dir, query.domain):
                    continue
                candidate = ranking.score_prepared(prepared, requested, query)
                if candidate is not None:
                    candidates.append(candidate)
            return ranking.finish_search(candidates, query), problems

    def _matching_paths(self, requested: str) -> set[str]:
        matched: set[str] = set(self._by_provides.get(requested, ()))
        by_text = self._by_text
        # The requested term contains the text; "" is in every term. A non-empty canonical
        # text neither starts nor ends with "_", so no other slice can be one.
        matched |= by_text.get("", set())
        length = len(requested)
        for start in range(length):
            if requested[start] == "_":
                continue
            for end in range(start + 1, length + 1):
                if requested[end - 1] != "_":
                    holders = by_text.get(requested[start:end])
                    if holders:
                        matched |= holders
        # The text contains the requested term.
        for text in self._texts_containing(requested):
            matched |= by_text[text]
        return matched

    def _texts_containing(self, requested: str) -> Iterator[str]:
        if len(requested) == 1:
            return self._haystack(_ALL_TEXTS, self._by_text.keys()).texts_containing(requested)
        buckets = self._texts_by_bigram
        rarest = min(_bigrams(requested), key=lambda bigram: len(buckets.get(bigram, ())))
        bucket = buckets.get(rarest)
        if not bucket:
            return iter(())
        return self._haystack(rarest, bucket).texts_containing(requested)

    def _haystack(self, key: str, texts: Collection[str]) -> _Haystack:
        haystack = self._haystacks.get(key)
        if haystack is None:
            haystack = self._haystacks[key] = _Haystack(texts)
        return haystack


def _in_domain(stored: StoredSeed, domain_dir: str | None, domain: str) -> bool:
    """Whether `load(domain)` would return the seed: stored under that domain and declaring it."""
    return domain_dir == domain and stored.seed.domain == domain


def _read_entry(path: str, domain_dir: str | None, started_ns: int, known: StoredSeed | None) -> _Entry:
    # `known`: an earlier parse, reused when the bytes are unchanged (a racy or just-written file).
    parsed = read_seed_file(path, domain_dir, known)
    stat_result = parsed.stat_result
    if stat_result is None:
        return _Entry(None, domain_dir, parsed, True, started_ns)
    signature = persisted.signature_of(stat_result)
    racy = stat_result.st_mtime_ns + _RACY_WINDOW_NS >= started_ns
    # The entry lives as long as the file is indexed: keep the five numbers, not the
    # whole os.stat_result (~570 bytes a seed, a tenth of what an indexed seed costs).
    return _Entry(signature, domain_dir, dataclasses.replace(parsed, stat_result=None), racy, started_ns)


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


def _signature_of(path: str) -> Signature | None:
    try:
        stat_result = os.stat(path)
    except OSError:
        return None
    return persisted.signature_of(stat_result)
