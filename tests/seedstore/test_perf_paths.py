"""The fast paths agree with the plain ones: direct YAML writer, prepared scoring, index-located writes."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import MappingProxyType
from unittest import mock

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsidecar.seedstore_service import errors, ranking
from agentsidecar.seedstore_service.index import ChangeEvent, SeedIndex
from agentsidecar.seedstore_service.model import (
    Evidence,
    Outcome,
    Promotion,
    Rank,
    Risk,
    Seed,
    Verification,
    VerificationStatus,
)
from agentsidecar.seedstore_service.operations import SeedOperations
from agentsidecar.seedstore_service.patch import UpdatePatch
from agentsidecar.seedstore_service.seedfile import dump_seed, dump_seed_via_emitter, parse_seed, revision_of
from agentsidecar.seedstore_service.store import (
    Locator,
    ParsedFile,
    SeedBytes,
    SeedStore,
    StoredSeed,
    locate_in_scope,
    read_seed_bytes,
    read_seed_file,
    walk_seed_files,
)

from .test_index import DOMAINS, IDS, stores

WRITER = Path(__file__).with_name("writer_process.py")

# --- the direct YAML writer -----------------------------------------------------------------------

# Texts that stay on one line (the direct writer's domain), rich in YAML indicators and in
# words serde_yaml would read as numbers, bools or null.
ONE_LINE_ALPHABET = " :#-'\"?|>!%@`,[]{}~.&*+_=0123456789aAeExXoObBtrueflsnNT" + "é😀\u00a0\ue000\ufffd"
TRICKY_WORDS = [
    "",
    "true",
    "False",
    "null",
    "Null",
    "NULL",
    "~",
    "---",
    "...",
    "--- x",
    "- x",
    "-x",
    "? x",
    "?x",
    ": x",
    ":x",
    "a: b",
    "a:b",
    "a:",
    "a #b",
    "a#b",
    "#a",
    "0x1F",
    "0o17",
    "0b101",
    "-5",
    "+5",
    "+-5",
    "1e5",
    ".5",
    "5.",
    "1e999",
    ".inf",
    "-.inf",
    "+.inf",
    ".nan",
    "NaN",
    "inf",
    "0123",
    "-0123",
    "+0x1",
    "-0x1",
    "1_000",
    "yes",
    "-",
    "?",
    ":",
    "'",
    "it's",
    "@x",
    "x ",
    " x",
    "x" * 130,
    "1.5e+3",
    "0",
    "00",
    "+",
    ".",
    "voice-cli --help",
]
one_line_texts = st.text(alphabet=ONE_LINE_ALPHABET, max_size=12) | st.sampled_from(TRICKY_WORDS)
one_line_keys = one_line_texts.filter(lambda key: 0 < len(key) < 128)
# Anything at all: line breaks, tabs, control characters, BOMs, keys PyYAML writes as `? key`.
any_texts = (
    st.text(max_size=12)
    | st.text(alphabet=ONE_LINE_ALPHABET + "\n\t\r\x00\x85\u2028\u2029\ufeff\x7f", max_size=10)
    | one_line_texts
)
any_keys = any_texts | st.just("k" * 128)


def seeds_of(texts: st.SearchStrategy[str], keys: st.SearchStrategy[str]) -> st.SearchStrategy[Seed]:
    optional = st.none() | texts
    few = st.lists(texts, max_size=3).map(tuple)
    return st.builds(
        Seed,
        id=texts,
        domain=texts,
        kind=texts,
        command=optional,
        adapter=optional,
        script=optional,
        provides=few,
        aliases=few,
        rank=st.builds(
            Rank,
            default_priority=st.none() | st.integers(0, 100),
            preferred_for=few,
            avoid_for=few,
            tie_breakers=st.dictionaries(keys, texts, max_size=3).map(
                lambda ties: MappingProxyType(dict(sorted(ties.items())))
            ),
        ),
        evidence=st.lists(st.builds(Evidence, texts, optional, optional), max_size=2).map(tuple),
        auth_env=few,
        risk=st.builds(Risk, st.booleans(), st.booleans()),
        promotion=st.none() | st.builds(Promotion, texts),
        verification=st.none()
        | st.builds(
            Verification,
            st.sampled_from(VerificationStatus),
            st.sampled_from([0, 1, 1_700_000_000, 2**64 - 1]),
            st.lists(st.builds(Outcome, texts, st.booleans(), texts), max_size=2).map(tuple),
        ),
    )


# More than the profile's examples: byte identity with the emitter is what lets the fast writer
# replace it, and an example is a pure dump.
@pytest.mark.slow
@settings(max_examples=300)
@given(seeds_of(one_line_texts, one_line_keys))
def test_direct_writer_is_byte_identical_to_the_emitter_without_using_it(seed: Seed) -> None:
    with mock.patch.object(yaml, "emit", side_effect=AssertionError("emitter used")):
        written = dump_seed(seed)
    assert written == dump_seed_via_emitter(seed)


@pytest.mark.slow
@settings(max_examples=300)  # as above
@given(seeds_of(any_texts, any_keys))
def test_dump_seed_is_byte_identical_to_the_emitter_for_any_seed(seed: Seed) -> None:
    assert dump_seed(seed) == dump_seed_via_emitter(seed)


def random_seed(chooser: random.Random, one_line: bool) -> Seed:
    """A seed of random texts; drawn directly, since Hypothesis takes ~20 ms to draw one."""
    alphabet = ONE_LINE_ALPHABET if one_line else ONE_LINE_ALPHABET + "\n\t\r\x00\x85\u2028\ufeff"

    def text() -> str:
        if chooser.random() < 0.3:
            return chooser.choice(TRICKY_WORDS)
        return "".join(chooser.choice(alphabet) for _ in range(chooser.randint(0, 10)))

    def optional() -> str | None:
        return None if chooser.random() < 0.4 else text()

    def few(most: int = 3) -> tuple[str, ...]:
        return tuple(text() for _ in range(chooser.randint(0, most)))

    ties = {text() or "k": text() for _ in range(chooser.randint(0, 2))}
    return Seed(
        id=text(),
        domain=text(),
        kind=text(),
        command=optional(),
        adapter=optional(),
        script=optional(),
        provides=few(),
        aliases=few(),
        rank=Rank(
            chooser.choice([None, 0, 55, 100]),
            few(2),
            few(2),
            MappingProxyType({key[:100]: value for key, value in sorted(ties.items())}),
        ),
        evidence=tuple(Evidence(text(), optional(), optional()) for _ in range(chooser.randint(0, 2))),
        auth_env=few(2),
        risk=Risk(chooser.random() < 0.5, chooser.random() < 0.5),
        promotion=None if chooser.random() < 0.5 else Promotion(text()),
        verification=None
        if chooser.random() < 0.5
        else Verification(
            chooser.choice(list(VerificationStatus)),
            chooser.choice([0, 1_700_000_000, 2**64 - 1]),
            tuple(Outcome(text(), chooser.random() < 0.5, text()) for _ in range(chooser.randint(0, 2))),
        ),
    )


@pytest.mark.slow
def test_dump_seed_is_byte_identical_to_the_emitter_for_thousands_of_seeds() -> None:
    chooser = random.Random(20_261_130)
    for number in range(4000):
        one_line = number % 4 != 0
        seed = random_seed(chooser, one_line)
        with mock.patch.object(yaml, "emit", wraps=yaml.emit) as emit:
            written = dump_seed(seed)
        assert written == dump_seed_via_emitter(seed), seed
        if one_line:
            assert emit.call_count == 0, seed


@pytest.mark.parametrize(
    "seed",
    [
        Seed("a", "d", "two\nlines"),
        Seed("a", "d", "k", aliases=("tab\there",)),
        Seed("a", "d", "k", rank=Rank(tie_breakers=MappingProxyType({"k" * 128: "v"}))),
        Seed("a", "d", "k", evidence=(Evidence("cli_help", None, "line\u2028break"),)),
    ],
)
def test_values_the_direct_writer_cannot_handle_go_to_the_emitter(seed: Seed) -> None:
    with mock.patch.object(yaml, "emit", wraps=yaml.emit) as emit:
        written = dump_seed(seed)
    assert emit.call_count == 1
    assert parse_seed(written, "x.yml") == seed


# --- writes located through the index -------------------------------------------------------------


def write_tree(root: Path, files: Sequence[tuple[str, str]]) -> None:
    for relative, content in files:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def replace_tree(root: Path, files: Sequence[tuple[str, str]]) -> None:
    shutil.rmtree(root, ignore_errors=True)
    write_tree(root, files)


Outcome_ = tuple[str, str, str]  # ("ok", relative path, bytes written) or ("error", type, message)


def update_outcome(
    seed_store: SeedStore, seed_id: str, domain: str | None, locate: Locator | None = None
) -> Outcome_:
    """What an update did, with the store root taken out so two copies of a store compare equal."""
    root = str(seed_store.root)
    patch = UpdatePatch(add_aliases=("added alias",))
    try:
        stored, _problems = seed_store.update(
            seed_id, domain, patch, expected_revision=None, now_unix=1, locate=locate
        )
    except errors.SeedStoreError as error:
        return ("error", type(error).__name__, str(error).replace(root, "<root>"))
    return ("ok", stored.path.replace(root, "<root>"), Path(stored.path).read_text())


# Fewer than the profile's examples: each one writes two whole stores to disk and updates through the index.
@pytest.mark.slow
@settings(max_examples=80)
@given(
    before=stores(),
    after=stores(),
    seed_id=st.sampled_from(IDS),
    domain=st.none() | st.sampled_from(DOMAINS),
    stale=st.booleans(),
)
def test_update_through_the_index_does_what_the_whole_scan_does(
    before: list[tuple[str, str]],
    after: list[tuple[str, str]],
    seed_id: str,
    domain: str | None,
    stale: bool,
) -> None:
    """On a random store, also when other programs rewrote it since the index last looked.

    These stores name every file after the id it holds (or was meant to), in a domain
    directory: where the store looks for files its locator may not know about yet.
    """
    with tempfile.TemporaryDirectory() as temp:
        indexed_root, scanned_root = Path(temp) / "a" / "capabilities", Path(temp) / "b" / "capabilities"
        write_tree(indexed_root, before)
        seed_index = SeedIndex(SeedStore(indexed_root))
        seed_index.refresh()
        if stale:
            replace_tree(indexed_root, after)
        write_tree(scanned_root, after if stale else before)

        lookup_answer: Outcome_ | None = None
        if not stale:
            # The index's own lookup (reads) agrees with the whole scan too.
            try:
                found = locate_in_scope(seed_index.lookup(seed_id, domain), seed_id)
                lookup_answer = ("ok", found.path, "")
            except errors.SeedStoreError as error:
                lookup_answer = ("error", type(error).__name__, str(error))
            try:
                expected_found, _ = SeedStore(indexed_root).locate(seed_id, domain)
                scanned_answer = ("ok", expected_found.path, "")
            except errors.SeedStoreError as error:
                scanned_answer = ("error", type(error).__name__, str(error))
            assert lookup_answer == scanned_answer

        through_index = update_outcome(SeedStore(indexed_root), seed_id, domain, seed_index.candidate_paths)
        by_scan = update_outcome(SeedStore(scanned_root), seed_id, domain)
        assert through_index == by_scan


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "capabilities"


def put_seed(root: Path, seed: Seed, relative: str | None = None) -> Path:
    path = root / (relative or f"{seed.domain}/{seed.id}.yml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_seed(seed))
    return path


def simple(seed_id: str, domain: str = "voice", **changes: object) -> Seed:
    seed = Seed(seed_id, domain, "cli", command=seed_id, provides=("text_to_speech",))
    return dataclasses.replace(seed, **changes)  # type: ignore[arg-type]


class ReadCounter:
    """Records every seed file read by the store and the index."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.store_reads: list[str] = []
        self.index_reads: list[str] = []
        monkeypatch.setattr(
            "agentsidecar.seedstore_service.store.read_seed_file", self._reader(self.store_reads)
        )
        monkeypatch.setattr(
            "agentsidecar.seedstore_service.index.read_seed_file", self._reader(self.index_reads)
        )
        monkeypatch.setattr(
            "agentsidecar.seedstore_service.index.read_seed_bytes", self._bytes_reader(self.index_reads)
        )

    @staticmethod
    def _reader(into: list[str]) -> Callable[[str, str | None, StoredSeed | None], ParsedFile]:
        def read(path: str, domain_dir: str | None = None, known: StoredSeed | None = None) -> ParsedFile:
            into.append(path)
            return read_seed_file(path, domain_dir, known)

        return read

    @staticmethod
    def _bytes_reader(into: list[str]) -> Callable[[str], SeedBytes | ParsedFile]:
        def read(path: str) -> SeedBytes | ParsedFile:
            into.append(path)
            return read_seed_bytes(path)

        return read

    def clear(self) -> None:
        self.store_reads.clear()
        self.index_reads.clear()


@pytest.fixture
def crowded(root: Path) -> Path:
    """40 seeds in two domains and a broken file."""
    for number in range(40):
        put_seed(root, simple(f"seed-{number:02d}", ("voice", "audio")[number % 2]))
    (root / "voice" / "broken.yml").write_text("id: broken\ndomain: voice\nkind: cli\nwhat: 1\n")
    # Written an hour ago, as a store at rest is: the index trusts their signatures
    # (files modified within its racy window are read again by every walk).
    an_hour_ago = time.time() - 3600
    for path in root.rglob("*.yml"):
        os.utime(path, (an_hour_ago, an_hour_ago))
    return root


def test_service_writes_read_only_the_target_file(crowded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    published: list[ChangeEvent] = []
    seed_store = SeedStore(crowded)
    operations = SeedOperations(seed_store, SeedIndex(seed_store), on_changes=published.extend)
    operations.refresh_index()
    published.clear()
    reads = ReadCounter(monkeypatch)
    target = str(crowded / "voice" / "seed-10.yml")

    view = operations.update("seed-10", None, UpdatePatch(add_aliases=("narrator",)))

    assert reads.store_reads == [target]  # read again under the lock, nothing else
    assert reads.index_reads == [target]  # the written file, brought into the index
    assert view.stored.path == target
    assert view.problems == SeedStore(crowded).load(None).problems  # the broken file, as a scan reports it
    assert [problem.path for problem in view.problems] == [str(crowded / "voice" / "broken.yml")]
    assert [(event.kind, event.path) for event in published] == [("updated", target)]
    result = operations.search(ranking.SearchQuery("narrator")).result
    assert [candidate.id for candidate in result.candidates] == ["seed-10"]

    reads.clear()
    view = operations.prefer("seed-11", "audio", "narration", 70)
    assert reads.store_reads == reads.index_reads == [str(crowded / "audio" / "seed-11.yml")]
    assert view.problems == ()  # the audio domain has none
    assert view.stored.seed.rank.default_priority == 70

    reads.clear()
    removed = operations.remove("seed-12", None)
    assert reads.store_reads == [removed.path]
    # Gone: dropped from the index without a read. The write-time walk reads again
    # only the two files written moments ago (their signatures are not trusted yet).
    assert reads.index_reads == [
        str(crowded / "audio" / "seed-11.yml"),
        str(crowded / "voice" / "seed-10.yml"),
    ]
    assert "seed-12" not in [entry.id for entry in operations.list_seeds(None).entries]
    assert operations.inspect("seed-13", None).stored.seed.id == "seed-13"


def test_the_local_path_without_an_index_still_scans_the_whole_scope(
    crowded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    operations = SeedOperations(SeedStore(crowded))
    reads = ReadCounter(monkeypatch)

    operations.update("seed-10", None, UpdatePatch(add_aliases=("narrator",)))

    assert len(reads.store_reads) == 41


def test_located_writes_keep_the_ambiguity_and_malformed_rules(crowded: Path) -> None:
    seed_store = SeedStore(crowded)
    operations = SeedOperations(seed_store, SeedIndex(seed_store))
    put_seed(crowded, simple("twin", "voice"))
    put_seed(crowded, simple("twin", "audio"))
    stray = put_seed(crowded, simple("stray", "audio"), "voice/stray.yml")
    operations.refresh_index()

    with pytest.raises(errors.AmbiguousSeed) as ambiguous:
        operations.update("twin", None, UpdatePatch(kind="x"))
    assert ambiguous.value.paths == [str(crowded / "audio" / "twin.yml"), str(crowded / "voice" / "twin.yml")]
    assert operations.update("twin", "audio", UpdatePatch(kind="x")).stored.seed.kind == "x"
    with pytest.raises(errors.SeedMalformed) as malformed:
        operations.prefer("broken", None, "speech", None)
    assert malformed.value.path == str(crowded / "voice" / "broken.yml")
    with pytest.raises(
        errors.SeedMalformed, match='is stored under domain "voice" but declares domain "audio"'
    ):
        operations.remove("stray", "voice")
    assert stray.exists()
    with pytest.raises(errors.SeedNotFound):
        operations.remove("nope", None)


def test_a_stale_index_never_misdirects_a_write(root: Path) -> None:
    say = put_seed(root, simple("say"), "voice/legacy-name.yml")
    put_seed(root, simple("espeak"))
    seed_store = SeedStore(root)
    operations = SeedOperations(seed_store, SeedIndex(seed_store))
    operations.refresh_index()

    # Another program moves `say` to a new file and puts another seed in its old one.
    say.write_text(dump_seed(simple("other")))
    moved = put_seed(root, simple("say"), "voice/moved.yml")
    assert operations.update("say", None, UpdatePatch(kind="adapter")).stored.path == str(moved)
    assert parse_seed(say.read_text(), str(say)) == simple("other")

    # ... deletes `espeak` and writes it elsewhere under a name the store does not probe.
    (root / "voice" / "espeak.yml").unlink()
    elsewhere = put_seed(root, simple("espeak"), "voice/nested/speaker.yml")
    assert operations.update("espeak", "voice", UpdatePatch(kind="adapter")).stored.path == str(elsewhere)

    # ... adds a seed the index has never seen, under another name.
    fresh = put_seed(root, simple("jq", "dev"), "dev/json-tool.yml")
    assert operations.prefer("jq", None, "json", None).stored.path == str(fresh)

    # ... adds a second `say` where SkillSpec would put it: now ambiguous, as a scan says.
    put_seed(root, simple("say", "audio"))
    with pytest.raises(errors.AmbiguousSeed):
        operations.update("say", None, UpdatePatch(kind="cli"))


def test_a_locator_naming_files_outside_the_store_is_ignored_for_a_scan(root: Path, tmp_path: Path) -> None:
    target = put_seed(root, simple("say"))
    outside = put_seed(tmp_path / "elsewhere", simple("say"))

    def misleading(seed_id: str, domain: str | None) -> tuple[str, ...]:
        return (str(outside), str(root / "voice" / ".." / ".." / "elsewhere" / "voice" / "say.yml"))

    stored, _ = SeedStore(root).update(
        "say", None, UpdatePatch(kind="x"), expected_revision=None, now_unix=1, locate=misleading
    )

    assert stored.path == str(target)
    assert parse_seed(outside.read_text(), str(outside)).kind == "cli"


def test_a_located_write_checks_the_revision_it_reads_under_the_lock(root: Path) -> None:
    put_seed(root, simple("say"))
    seed_store = SeedStore(root)
    seed_index = SeedIndex(seed_store)
    seed_index.refresh()
    first, _ = seed_store.update(
        "say", None, UpdatePatch(add_aliases=("one",)), expected_revision=None, now_unix=1
    )  # the index has not seen this write

    with pytest.raises(errors.RevisionMismatch) as stale:
        seed_store.update(
            "say",
            None,
            UpdatePatch(add_aliases=("two",)),
            expected_revision=seed_index.scope(None).seeds[0].revision,
            now_unix=2,
            locate=seed_index.candidate_paths,
        )
    assert stale.value.actual == first.revision

    second, _ = seed_store.update(
        "say",
        None,
        UpdatePatch(add_aliases=("two",)),
        expected_revision=first.revision,
        now_unix=2,
        locate=seed_index.candidate_paths,
    )
    assert second.seed.aliases == ("one", "two")


@pytest.mark.slow
def test_writes_through_indexes_and_plain_writers_lose_nothing(root: Path) -> None:
    """Two services' worth of index-located writers in threads, and a scanning writer process."""
    put_seed(root, simple("say"))
    updates = 25

    def service_worker(name: str) -> None:
        seed_store = SeedStore(root)
        operations = SeedOperations(seed_store, SeedIndex(seed_store))
        operations.refresh_index()
        for number in range(updates):
            operations.update("say", None, UpdatePatch(add_provides=(f"{name}_{number}",)))

    threads = [threading.Thread(target=service_worker, args=(name,)) for name in ("ta", "tb")]
    scanner = subprocess.Popen(
        [sys.executable, str(WRITER), "add-provides", str(root), "say", "9", str(updates)],
        stderr=subprocess.PIPE,
        text=True,
    )
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    _, stderr = scanner.communicate(timeout=60)
    assert scanner.returncode == 0, stderr

    provides = SeedStore(root).locate("say", None)[0].seed.provides
    for prefix in ("ta", "tb", "w9"):
        assert [value for value in provides if value.startswith(prefix)] == [
            f"{prefix}_{number}" for number in range(updates)
        ]
    assert len(provides) == 1 + 3 * updates


# --- the index's new reads ------------------------------------------------------------------------


def test_refresh_paths_updates_only_the_named_files(root: Path) -> None:
    say = put_seed(root, simple("say"))
    espeak = put_seed(root, simple("espeak"))
    seed_index = SeedIndex(SeedStore(root))
    seed_index.refresh()

    say.write_text(dump_seed(simple("say", aliases=("speak",))))
    espeak.write_text(dump_seed(simple("espeak", aliases=("talk",))))
    added = put_seed(root, simple("piper", "audio"))

    events = seed_index.refresh_paths([str(say), str(added), "/not/in/the/store.yml"])
    assert [(event.kind, event.id) for event in events] == [("added", "piper"), ("updated", "say")]
    assert {stored.seed.id: stored.seed for stored in seed_index.scope(None).seeds} == {
        "say": simple("say", aliases=("speak",)),
        "piper": simple("piper", "audio"),
        "espeak": simple("espeak"),  # not named: still as the index last saw it
    }

    say.unlink()
    assert seed_index.refresh_paths([str(say)]) == [
        ChangeEvent("removed", str(say), "say", "voice", "", None, None)
    ]
    # A full refresh then reports only what the named refreshes did not.
    assert [(event.kind, event.id) for event in seed_index.refresh()] == [("updated", "espeak")]
    assert seed_index.scope(None) == SeedStore(root).load(None)


def test_candidates_lookup_and_problems_match_the_scope(root: Path) -> None:
    say = put_seed(root, simple("say"))
    legacy = put_seed(root, simple("say", "audio"), "audio/legacy.yaml")
    stray = put_seed(root, simple("mixer", "audio"), "voice/mixer.yml")
    broken = root / "voice" / "say.yaml"
    broken.write_text("id: [unclosed\n")
    seed_index = SeedIndex(SeedStore(root))
    seed_index.refresh()

    assert seed_index.candidate_paths("say", None) == tuple(sorted((str(say), str(legacy), str(broken))))
    assert seed_index.candidate_paths("say", "audio") == (str(legacy),)
    assert seed_index.candidate_paths("nope", None) == ()
    for domain in (None, "voice", "audio", "video"):
        assert seed_index.problems(domain) == SeedStore(root).load(domain).problems
    assert [problem.path for problem in seed_index.problems("voice")] == [str(stray), str(broken)]
    with pytest.raises(errors.InvalidIdentifier):
        seed_index.candidate_paths("say", "../x")


def test_walk_spells_paths_as_pathlib_does(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    put_seed(root, simple("say"))
    put_seed(root, simple("deep"), "voice/nested/deep.yaml")
    monkeypatch.chdir(root)
    refs, _ = walk_seed_files(Path("."), None)
    assert [ref.path for ref in refs] == [str(Path(".") / "voice" / "nested" / "deep.yaml"), "voice/say.yml"]
    monkeypatch.chdir(root.parent)
    refs, _ = walk_seed_files(Path("capabilities"), "voice")
    assert [(ref.path, ref.domain_dir) for ref in refs] == [
        ("capabilities/voice/nested/deep.yaml", "voice"),
        ("capabilities/voice/say.yml", "voice"),
    ]
    assert (
        revision_of((root / "voice" / "say.yml").read_bytes())
        == SeedStore(Path("capabilities")).load(None).seeds[1].revision
    )
