"""The in-memory index: the linear reference's answers, and change events for edits by other programs."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsidecar.seedstore_service import errors, ranking
from agentsidecar.seedstore_service.index import ChangeEvent, SeedIndex
from agentsidecar.seedstore_service.model import (
    Evidence,
    Outcome,
    Problem,
    Rank,
    Risk,
    Seed,
    Verification,
    VerificationStatus,
)
from agentsidecar.seedstore_service.patch import UpdatePatch
from agentsidecar.seedstore_service.seedfile import dump_seed, revision_of
from agentsidecar.seedstore_service.store import (
    LoadedScope,
    ParsedFile,
    SeedBytes,
    SeedStore,
    StoredSeed,
    read_seed_bytes,
    read_seed_file,
)

# Small vocabularies, so random seeds collide on the interesting cases: canonical equality
# (text-to-speech / text_to_speech), short texts inside long terms (speech, cli) and the reverse.
CAPABILITIES = [
    "text_to_speech",
    "text-to-speech",
    "speech",
    "voice_message",
    "cli",
    "tts",
    "audio_generation",
]
ALIASES = ["speech", "text to speech", "cli", "Voice Message!", "TTS", "audio", "say it", "x"]
EVIDENCE_TEXTS = [None, "", "--", "voice-cli --help", "say --version", "speech synthesis", "tts-cli", "help"]
QUERIES = [*CAPABILITIES, "help", "voice", "s", "text", "say_it", "-", "_", "unheard_of", "voice-cli"]
IDS = ["say", "espeak", "voice-cli", "piper", "x"]
DOMAINS = ["voice", "audio"]

verifications = st.sampled_from(
    [
        None,
        Verification(VerificationStatus.VERIFIED, 1),
        Verification(VerificationStatus.FAILED, 2),
        Verification(VerificationStatus.UNVERIFIED, 3),
    ]
)


@st.composite
def seeds(draw: st.DrawFn) -> Seed:
    return Seed(
        id=draw(st.sampled_from(IDS)),
        domain=draw(st.sampled_from(DOMAINS)),
        kind="cli",
        provides=tuple(draw(st.lists(st.sampled_from(CAPABILITIES), max_size=2))),
        aliases=tuple(draw(st.lists(st.sampled_from(ALIASES), max_size=2))),
        rank=Rank(
            default_priority=draw(st.none() | st.integers(0, 100)),
            preferred_for=tuple(draw(st.lists(st.sampled_from(CAPABILITIES), max_size=1))),
            avoid_for=tuple(draw(st.lists(st.sampled_from(CAPABILITIES), max_size=1))),
        ),
        evidence=tuple(
            Evidence("cli_help", command, detail)
            for command, detail in draw(
                st.lists(
                    st.tuples(st.sampled_from(EVIDENCE_TEXTS), st.sampled_from(EVIDENCE_TEXTS)), max_size=2
                )
            )
        ),
        auth_env=tuple(draw(st.lists(st.just("TOKEN"), max_size=1))),
        risk=Risk(external_service=draw(st.booleans()), may_cost_money=draw(st.booleans())),
        verification=draw(verifications),
    )


@st.composite
def stores(draw: st.DrawFn) -> list[tuple[str, str]]:
    """(relative path, content): seeds, some in a directory of another domain, some broken."""
    files: dict[str, str] = {}
    for seed in draw(st.lists(seeds(), max_size=8)):
        domain_dir = draw(st.sampled_from([seed.domain, seed.domain, seed.domain, "voice", "audio"]))
        suffix = draw(st.sampled_from([".yml", ".yml", ".yaml"]))
        files[f"{domain_dir}/{seed.id}{suffix}"] = dump_seed(seed)
    for name in draw(st.lists(st.sampled_from(IDS), max_size=2)):
        files[f"{draw(st.sampled_from(DOMAINS))}/{name}.yml"] = f"id: {name}\nunexpected: true\n"
    return sorted(files.items())


queries = st.builds(
    ranking.SearchQuery,
    capability=st.sampled_from(QUERIES),
    domain=st.none() | st.sampled_from([*DOMAINS, "video"]),
    local_only=st.booleans(),
    preferred_seed=st.none() | st.sampled_from(IDS),
)


def reference(
    seed_store: SeedStore, query: ranking.SearchQuery
) -> tuple[ranking.SearchResult, tuple[Problem, ...]]:
    scope = seed_store.load(query.domain)
    return ranking.search(((stored.seed, stored.path) for stored in scope.seeds), query), scope.problems


def assert_index_agrees(
    seed_store: SeedStore, seed_index: SeedIndex, query_list: list[ranking.SearchQuery]
) -> None:
    loaded: dict[str | None, LoadedScope] = {}
    for query in [*query_list, ranking.SearchQuery("speech")]:
        if query.domain not in loaded:
            loaded[query.domain] = seed_store.load(query.domain)
            assert seed_index.scope(query.domain) == loaded[query.domain]
        scope = loaded[query.domain]
        expected = ranking.search(((stored.seed, stored.path) for stored in scope.seeds), query)
        assert seed_index.search(query) == (expected, scope.problems)


# Fewer than the profile's examples: each one writes two whole stores to disk and rebuilds the index.
@pytest.mark.slow
@settings(max_examples=60)
@given(before=stores(), after=stores(), query_list=st.lists(queries, min_size=1, max_size=6))
def test_index_search_equals_the_linear_reference(
    before: list[tuple[str, str]], after: list[tuple[str, str]], query_list: list[ranking.SearchQuery]
) -> None:
    """On a random store, and again after another program rewrote it into another random store."""
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp) / "capabilities"
        for relative, content in before:
            write(root / relative, content)
        seed_store = SeedStore(root)
        seed_index = SeedIndex(seed_store)
        seed_index.refresh()
        assert_index_agrees(seed_store, seed_index, query_list)

        # Incremental: only changed files are re-read, and stale search structures must be dropped.
        kept = dict(after)
        for relative, _content in before:
            if relative not in kept:
                (root / relative).unlink()
        for relative, content in after:
            write(root / relative, content)
        seed_index.refresh()
        assert_index_agrees(seed_store, seed_index, query_list)


def test_index_search_finds_every_kind_of_match(tmp_path: Path) -> None:
    """A readable example of what the property checks, so a failure here names the rule."""
    root = tmp_path / "capabilities"
    examples = {
        "direct": Seed("direct", "voice", "cli", provides=("text_to_speech",)),
        "short-alias": Seed("short-alias", "voice", "cli", aliases=("speech",)),
        "long-alias": Seed("long-alias", "voice", "cli", aliases=("fast text to speech engine",)),
        "evidence": Seed(
            "evidence", "voice", "cli", evidence=(Evidence("cli_help", "tts --text-to-speech"),)
        ),
        "detail": Seed("detail", "voice", "cli", evidence=(Evidence("doc", None, "Text To Speech"),)),
        # No letters or digits: inert, where SkillSpec's substring test would match every capability.
        "empty-evidence": Seed("empty-evidence", "voice", "cli", evidence=(Evidence("cli_help", "--"),)),
        "unrelated": Seed("unrelated", "voice", "cli", provides=("speech_to_text",), aliases=("transcribe",)),
        "failed": Seed(
            "failed",
            "voice",
            "cli",
            provides=("text_to_speech",),
            verification=Verification(VerificationStatus.FAILED, 1),
        ),
    }
    for seed in examples.values():
        (root / "voice").mkdir(parents=True, exist_ok=True)
        (root / "voice" / f"{seed.id}.yml").write_text(dump_seed(seed))
    seed_index = SeedIndex(SeedStore(root))
    seed_index.refresh()

    result, problems = seed_index.search(ranking.SearchQuery("text-to-speech"))

    assert sorted(candidate.id for candidate in result.candidates) == [
        "detail",
        "direct",
        "evidence",
        "long-alias",
        "short-alias",
    ]
    assert problems == ()
    assert result == reference(SeedStore(root), ranking.SearchQuery("text-to-speech"))[0]


def test_search_structures_follow_refreshes(root: Path) -> None:
    first = root / "voice" / "synth.yml"
    write(first, dump_seed(make_seed(id="synth", provides=(), aliases=("speech synthesis",))))
    seed_index = SeedIndex(SeedStore(root))
    seed_index.refresh()
    query = ranking.SearchQuery("speech")
    assert [candidate.id for candidate in seed_index.search(query)[0].candidates] == ["synth"]

    second = root / "voice" / "asr.yml"
    write(second, dump_seed(make_seed(id="asr", provides=(), aliases=("speech recognition",))))
    seed_index.refresh()
    assert sorted(candidate.id for candidate in seed_index.search(query)[0].candidates) == ["asr", "synth"]

    first.unlink()
    seed_index.refresh()
    assert [candidate.id for candidate in seed_index.search(query)[0].candidates] == ["asr"]

    write(second, dump_seed(make_seed(id="asr", provides=(), aliases=("transcribe",))))
    seed_index.refresh()
    assert seed_index.search(query)[0].candidates == ()
    assert [
        candidate.id for candidate in seed_index.search(ranking.SearchQuery("transcribe"))[0].candidates
    ] == ["asr"]


def test_index_search_validates_the_query(tmp_path: Path) -> None:
    seed_index = SeedIndex(SeedStore(tmp_path / "capabilities"))
    with pytest.raises(errors.InvalidIdentifier, match=r"in capability$"):
        seed_index.search(ranking.SearchQuery("Text To Speech"))
    with pytest.raises(errors.InvalidIdentifier, match=r"in domain$"):
        seed_index.search(ranking.SearchQuery("speech", domain="../x"))


# --- refresh ------------------------------------------------------------------------------------


# Texts and terms over two letters: every text shares bigrams with many others, so a term's
# rarest bigram, its bucket and the haystack of all texts are each shared and each go stale.
two_letter_texts = st.text(alphabet="ab", min_size=1, max_size=6)


# Slow: each example writes and re-reads seed files between its searches.
@pytest.mark.slow
@settings(max_examples=40)
@given(
    first=st.lists(st.lists(two_letter_texts, max_size=3), min_size=1, max_size=4),
    steps=st.lists(
        st.tuples(st.integers(0, 3), st.lists(two_letter_texts, max_size=3), st.lists(two_letter_texts)),
        max_size=6,
    ),
)
def test_search_by_substring_follows_every_text_change(
    first: list[list[str]], steps: list[tuple[int, list[str], list[str]]]
) -> None:
    """Searches (which build haystacks and bigram counts) between writes that add and drop texts."""
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp) / "capabilities"
        paths = [root / "voice" / f"s{number}.yml" for number in range(len(first))]
        for number, aliases in enumerate(first):
            write(paths[number], dump_seed(make_seed(id=f"s{number}", aliases=tuple(aliases))))
        seed_store = SeedStore(root)
        seed_index = SeedIndex(seed_store)
        seed_index.refresh()
        for target, aliases, terms in steps:
            for term in [*terms, "a", "ab"]:
                query = ranking.SearchQuery(term)
                assert seed_index.search(query) == reference(seed_store, query)
            number = target % len(paths)
            write(paths[number], dump_seed(make_seed(id=f"s{number}", aliases=tuple(aliases))))
            seed_index.refresh_paths([str(paths[number])])
        for term in ["a", "b", "aa", "ab", "ba", "bb", "aab", "abab", "bbbb"]:
            query = ranking.SearchQuery(term)
            assert seed_index.search(query) == reference(seed_store, query)


def make_seed(**changes: object) -> Seed:
    base = Seed("say", "voice", "cli", command="say", provides=("text_to_speech",))
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def write(path: Path, content: str) -> None:
    """Edit a file the way another program (an editor, the SkillSpec CLI) would: in place, no lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)


def age(path: Path, seconds: float = 60) -> None:
    """Move the file's mtime into the past, out of the racy window, as if written long ago."""
    past = time.time_ns() - int(seconds * 1e9)
    os.utime(path, ns=(past, past))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "capabilities"


def test_refresh_reports_adds_updates_verdicts_malformed_files_and_removals(root: Path) -> None:
    seed_index = SeedIndex(SeedStore(root))
    assert seed_index.refresh() == []

    path = root / "voice" / "say.yml"
    write(path, dump_seed(make_seed()))
    assert seed_index.refresh() == [
        ChangeEvent("added", str(path), "say", "voice", revision_of(path.read_bytes()), make_seed(), None)
    ]
    assert seed_index.refresh() == []

    updated = make_seed(aliases=("speak",))
    write(path, dump_seed(updated))
    assert seed_index.refresh() == [
        ChangeEvent("updated", str(path), "say", "voice", revision_of(path.read_bytes()), updated, None)
    ]

    verified = dataclasses.replace(
        updated, verification=Verification(VerificationStatus.VERIFIED, 9, (Outcome("evidence", True, "ok"),))
    )
    write(path, dump_seed(verified))
    assert [event.kind for event in seed_index.refresh()] == ["verified"]

    write(path, dump_seed(verified) + "surprise: 1\n")
    (event,) = seed_index.refresh()
    assert (event.kind, event.id, event.domain, event.seed) == ("malformed", "say", "voice", None)
    assert event.problem is not None
    assert (event.problem.path, event.problem.line) == (str(path), len(path.read_text().splitlines()))
    assert event.revision == revision_of(path.read_bytes())

    write(path, dump_seed(verified))
    assert [event.kind for event in seed_index.refresh()] == ["added"]

    path.unlink()
    assert seed_index.refresh() == [ChangeEvent("removed", str(path), "say", "voice", "", None, None)]
    assert seed_index.scope(None).seeds == ()


@pytest.mark.slow
def test_refresh_sees_writes_made_through_the_store(root: Path) -> None:
    seed_store = SeedStore(root)
    seed_index = SeedIndex(seed_store)
    put = root / "voice" / "say.yml"
    write(put, dump_seed(make_seed()))
    seed_index.refresh()

    stored, _ = seed_store.update(
        "say", None, UpdatePatch(add_aliases=("tts",)), expected_revision=None, now_unix=1
    )
    (event,) = seed_index.refresh()

    assert (event.kind, event.revision, event.seed) == ("updated", stored.revision, stored.seed)
    result, _ = seed_index.search(ranking.SearchQuery("tts"))
    assert [candidate.id for candidate in result.candidates] == ["say"]


def test_refresh_reports_a_file_that_now_holds_another_seed_as_removed_and_added(root: Path) -> None:
    path = root / "voice" / "say.yml"
    write(path, dump_seed(make_seed()))
    seed_index = SeedIndex(SeedStore(root))
    seed_index.refresh()

    write(path, dump_seed(make_seed(id="espeak")))

    assert [(event.kind, event.id) for event in seed_index.refresh()] == [
        ("removed", "say"),
        ("added", "espeak"),
    ]


def test_removed_malformed_file_is_named_by_its_file(root: Path) -> None:
    path = root / "audio" / "broken.yaml"
    write(path, "id: [unclosed\n")
    seed_index = SeedIndex(SeedStore(root))
    assert [(event.kind, event.id, event.domain) for event in seed_index.refresh()] == [
        ("malformed", "broken", "audio")
    ]
    path.unlink()
    assert seed_index.refresh() == [ChangeEvent("removed", str(path), "broken", "audio", "", None, None)]


def test_refresh_rereads_only_changed_files(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [root / "voice" / f"seed{number}.yml" for number in range(5)]
    for number, path in enumerate(paths):
        write(path, dump_seed(make_seed(id=f"seed{number}", aliases=(f"speech synthesis {number}",))))
        age(path)
    reads: list[str] = []

    def counting_read(
        path: str, domain_dir: str | None = None, known: StoredSeed | None = None
    ) -> ParsedFile:
        reads.append(path)
        return read_seed_file(path, domain_dir, known)

    def counting_bytes(path: str) -> SeedBytes | ParsedFile:
        reads.append(path)
        return read_seed_bytes(path)

    monkeypatch.setattr("agentsidecar.seedstore_service.index.read_seed_file", counting_read)
    monkeypatch.setattr("agentsidecar.seedstore_service.index.read_seed_bytes", counting_bytes)
    seed_index = SeedIndex(SeedStore(root))
    seed_index.refresh()
    assert len(reads) == 5
    seed_index.search(ranking.SearchQuery("synthesis"))
    haystacks = dict(seed_index._haystacks)
    assert haystacks

    reads.clear()
    assert seed_index.refresh() == []
    assert reads == []
    # Nothing changed, nothing rebuilt.
    assert all(seed_index._haystacks[key] is haystack for key, haystack in haystacks.items())

    write(paths[2], dump_seed(make_seed(id="seed2", aliases=("narrate",))))
    age(paths[2], 30)
    assert [event.kind for event in seed_index.refresh()] == ["updated"]
    assert reads == [str(paths[2])]


def test_a_write_adds_its_texts_to_the_haystacks_made_so_far(root: Path) -> None:
    for number in range(5):
        write(
            root / "voice" / f"seed{number}.yml",
            dump_seed(make_seed(id=f"seed{number}", aliases=(f"speech {number}",))),
        )
    seed_store = SeedStore(root)
    seed_index = SeedIndex(seed_store)
    seed_index.refresh()
    for term in ["speech_2", "h"]:
        seed_index.search(ranking.SearchQuery(term))
    haystacks = dict(seed_index._haystacks)

    added = root / "voice" / "added.yml"
    write(added, dump_seed(make_seed(id="added", aliases=("speech 22", "narrate"))))
    seed_index.refresh_paths([str(added)])

    # Kept, not made again: the write's texts were added to them.
    assert all(seed_index._haystacks[key] is haystack for key, haystack in haystacks.items())
    for term in ["speech_2", "h", "narrat", "speech_22"]:
        query = ranking.SearchQuery(term)
        assert seed_index.search(query) == reference(seed_store, query)


def test_refresh_catches_a_same_size_edit_within_one_mtime_tick(root: Path) -> None:
    path = root / "voice" / "say.yml"
    write(path, dump_seed(make_seed(aliases=("aaaa",))))
    seed_index = SeedIndex(SeedStore(root))
    seed_index.refresh()
    before = os.stat(path)

    # Same inode, same size, and (as on a coarse-clock file system) the same mtime.
    with open(path, "r+b") as handle:
        handle.write(dump_seed(make_seed(aliases=("bbbb",))).encode())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))

    (event,) = seed_index.refresh()
    assert event.kind == "updated"
    assert event.seed is not None
    assert event.seed.aliases == ("bbbb",)


def test_touch_without_change_reports_nothing(root: Path) -> None:
    path = root / "voice" / "say.yml"
    write(path, dump_seed(make_seed()))
    seed_index = SeedIndex(SeedStore(root))
    seed_index.refresh()
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 5_000_000_000))
    assert seed_index.refresh() == []


def test_scope_and_search_report_problems_of_their_scope_only(root: Path) -> None:
    write(root / "voice" / "say.yml", dump_seed(make_seed()))
    write(root / "audio" / "broken.yml", "id: broken\nwhat: 1\n")
    stray = root / "voice" / "mixer.yml"
    write(stray, dump_seed(make_seed(id="mixer", domain="audio")))
    seed_index = SeedIndex(SeedStore(root))
    seed_index.refresh()

    _, voice_problems = seed_index.search(ranking.SearchQuery("text_to_speech", domain="voice"))
    _, audio_problems = seed_index.search(ranking.SearchQuery("text_to_speech", domain="audio"))
    result, all_problems = seed_index.search(ranking.SearchQuery("text_to_speech"))

    assert [problem.path for problem in voice_problems] == [str(stray)]
    assert "declares domain" in voice_problems[0].reason
    assert [problem.path for problem in audio_problems] == [str(root / "audio" / "broken.yml")]
    assert all_problems == audio_problems
    assert sorted(candidate.id for candidate in result.candidates) == ["mixer", "say"]


def test_the_answer_caches_keep_a_bounded_number_of_scopes_whatever_domains_callers_name(
    tmp_path: Path,
) -> None:
    """Every identifier a caller sends as a domain is a scope: the listing, scope and problem
    caches keep at most `_CACHED_SCOPES` of them, and answer as before for each."""
    from agentsidecar.seedstore_service import index as index_module

    root = tmp_path / "capabilities"
    (root / "voice").mkdir(parents=True)
    (root / "voice" / "say.yml").write_text(
        dump_seed(Seed(id="say", domain="voice", kind="cli", command="say", provides=("tts",)))
    )
    index = SeedIndex(SeedStore(root))
    index.refresh()
    named = index_module._CACHED_SCOPES + 50
    for number in range(named):
        assert index.listing(f"nowhere-{number}") == ((), ())
        index.search(ranking.SearchQuery("tts", f"nowhere-{number}"))
        assert index.scope(f"nowhere-{number}").seeds == ()
    for cache in (index._listing_cache, index._scope_cache, index._problem_cache):
        assert len(cache) == index_module._CACHED_SCOPES
    assert [row.id for row in index.listing("voice")[0]] == ["say"]
    assert [row.id for row in index.listing(None)[0]] == ["say"]
