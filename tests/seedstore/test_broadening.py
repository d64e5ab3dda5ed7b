"""Broadening an empty search through equivalent terms and domains."""

from __future__ import annotations

import pytest

from agentsidecar.seedstore_service.broadening import (
    NOTHING_FOUND_POLICY,
    RELATED_FOUND_POLICY,
    Broadening,
    BroadeningAttempt,
    EquivalenceGroup,
    EquivalenceTable,
    broaden,
    builtin_table,
    merge_tables,
    parse_user_table,
    plan_attempts,
)
from agentsidecar.seedstore_service.errors import InvalidArgument
from agentsidecar.seedstore_service.model import Rank, Risk, Seed, Verification, VerificationStatus
from agentsidecar.seedstore_service.ranking import SearchQuery, SearchResult, search
from agentsidecar.seedstore_service.seedfile import canonical, validate_identifier

SEED_001_TERMS = (
    "voice",
    "text_to_speech",
    "voice_generation",
    "speech_synthesis",
    "audio_generation",
    "voice_message",
)


def make_seed(
    seed_id: str,
    domain: str,
    provides: tuple[str, ...] = (),
    aliases: tuple[str, ...] = (),
    *,
    external: bool = False,
    priority: int | None = None,
) -> Seed:
    return Seed(
        id=seed_id,
        domain=domain,
        kind="cli",
        provides=provides,
        aliases=aliases,
        rank=Rank(default_priority=priority),
        risk=Risk(external_service=external),
        verification=Verification(VerificationStatus.VERIFIED, 1),
    )


class Store:
    """A store as the shell sees it: a domain filter, then the reference search; records every query."""

    def __init__(self, *seeds: Seed) -> None:
        self.seeds = seeds
        self.queries: list[SearchQuery] = []

    def run(self, query: SearchQuery) -> SearchResult:
        self.queries.append(query)
        scope = [(s, f"/s/{s.domain}/{s.id}.yml") for s in self.seeds if query.domain in (None, s.domain)]
        return search(scope, query)


# ---------------------------------------------------------------------------
# the built-in table
# ---------------------------------------------------------------------------


def test_builtin_table_holds_seed_001_voice_set() -> None:
    table = builtin_table()
    assert table.sources == ("builtin",)
    voice = next(group for group in table.groups if "text_to_speech" in group.capabilities)
    assert voice.capabilities == SEED_001_TERMS
    assert voice.domains == ("voice", "audio")


def test_builtin_terms_are_canonical_identifiers_in_one_group_each() -> None:
    seen: set[str] = set()
    for group in builtin_table().groups:
        validate_identifier(group.name, "group")
        for term in group.capabilities:
            assert canonical(term) == term
            assert term not in seen, term
            seen.add(term)
        for domain in group.domains:
            validate_identifier(domain, "domain")


# ---------------------------------------------------------------------------
# planning
# ---------------------------------------------------------------------------


def test_plan_with_domain_crosses_every_term_with_every_plausible_domain() -> None:
    attempts = plan_attempts(builtin_table(), "text_to_speech", "voice")
    terms = ("text_to_speech", *(t for t in SEED_001_TERMS if t != "text_to_speech"))
    expected = [(term, domain) for term in terms for domain in ("voice", "audio")]
    expected.remove(("text_to_speech", "voice"))  # the first search, already run
    assert list(attempts) == expected


def test_plan_without_domain_searches_each_term_store_wide_once() -> None:
    attempts = plan_attempts(builtin_table(), "voice_generation", None)
    assert attempts == tuple((term, None) for term in SEED_001_TERMS if term != "voice_generation")


def test_plan_never_repeats_the_canonical_form_of_the_first_search() -> None:
    attempts = plan_attempts(builtin_table(), "text-to-speech", None)
    assert ("text_to_speech", None) not in attempts
    assert ("voice", None) in attempts


def test_plan_for_an_unknown_capability_store_wide_is_empty() -> None:
    assert plan_attempts(builtin_table(), "podcast-intro", None) == ()
    assert plan_attempts(builtin_table(), "--", "voice") == ()


def test_plan_for_an_unknown_capability_uses_domain_equivalents() -> None:
    assert plan_attempts(builtin_table(), "podcast_intro", "audio") == (("podcast_intro", "voice"),)


def test_plan_is_deterministic() -> None:
    table = builtin_table()
    assert plan_attempts(table, "speech_to_text", "voice") == plan_attempts(table, "speech_to_text", "voice")


# ---------------------------------------------------------------------------
# broaden
# ---------------------------------------------------------------------------


def test_a_non_empty_first_search_is_returned_untouched() -> None:
    store = Store(make_seed("say", "voice", ("text_to_speech",)))
    query = SearchQuery("text_to_speech", domain="voice")
    first = store.run(query)
    result, broadening = broaden(first, query, builtin_table(), store.run)
    assert result is first
    assert broadening.first_search_empty is False
    assert broadening.attempts == ()
    assert "no related terms were searched" in broadening.fallback_policy
    assert len(store.queries) == 1


def test_related_terms_and_domains_find_seeds_with_provenance() -> None:
    store = Store(
        make_seed("synth", "audio", ("speech_synthesis",)),
        make_seed("gen", "voice", ("voice_generation",), priority=100),
        make_seed("unrelated", "audio", ("music",)),
    )
    query = SearchQuery("text_to_speech", domain="voice")
    first = store.run(query)
    assert first.candidates == ()
    result, broadening = broaden(first, query, builtin_table(), store.run)

    assert (result.capability, result.domain) == ("text_to_speech", "voice")  # the caller's own query
    assert [(c.domain, c.id, c.matched_capability, c.matched_domain) for c in result.candidates] == [
        ("voice", "gen", "voice_generation", "voice"),
        ("audio", "synth", "speech_synthesis", "audio"),
    ]
    assert result.candidates[0].reasons[0] == "direct provides match: voice_generation"
    assert result.selected is None  # 75 vs 65: the caller chooses
    assert result.ask_policy == "top_candidates_within_10_points"
    assert broadening.first_search_empty is True
    assert broadening.fallback_policy == RELATED_FOUND_POLICY
    assert broadening.attempts[0] == BroadeningAttempt("text_to_speech", "voice", ())
    found = {(a.capability, a.domain): a.found for a in broadening.attempts}
    assert found[("speech_synthesis", "audio")] == ("audio/synth",)
    assert found[("voice_generation", "voice")] == ("voice/gen",)
    assert found[("voice_generation", "audio")] == ()
    assert len(broadening.attempts) == 1 + len(plan_attempts(builtin_table(), "text_to_speech", "voice"))
    assert broadening.table_sources == ("builtin",)


def test_nothing_found_lists_every_attempt_and_requires_approval() -> None:
    store = Store(make_seed("unrelated", "audio", ("music",)))
    query = SearchQuery("text_to_speech")
    result, broadening = broaden(store.run(query), query, builtin_table(), store.run)
    assert result == SearchResult("text_to_speech", None, None, None, ())
    assert broadening.fallback_policy == NOTHING_FOUND_POLICY
    assert "explicit approval" in broadening.fallback_policy
    assert "verified first" in broadening.fallback_policy
    assert [(a.capability, a.domain) for a in broadening.attempts] == [
        ("text_to_speech", None),
        *((term, None) for term in SEED_001_TERMS if term != "text_to_speech"),
    ]
    assert all(a.found == () for a in broadening.attempts)


def test_a_seed_found_twice_keeps_its_best_score_and_that_provenance() -> None:
    # Found store-wide by "voice" through its alias (+15) and by "voice_message" directly (+40).
    store = Store(make_seed("msg", "chat", ("voice_message",), aliases=("voice",)))
    query = SearchQuery("speech_synthesis")
    result, broadening = broaden(store.run(query), query, builtin_table(), store.run)
    assert len(result.candidates) == 1
    only = result.candidates[0]
    assert (only.score, only.matched_capability, only.matched_domain) == (65, "voice_message", "")
    # "voice" and "voice_generation" hold the alias "voice"; "voice_message" is provided.
    assert sum(1 for a in broadening.attempts if a.found == ("chat/msg",)) == 3
    assert result.selected == "msg"


def test_attempts_keep_the_callers_flags() -> None:
    store = Store(
        make_seed("remote", "audio", ("speech_synthesis",), external=True),
        make_seed("local", "audio", ("speech_synthesis",)),
    )
    query = SearchQuery("text_to_speech", domain="voice", local_only=True, preferred_seed="local")
    result, _ = broaden(store.run(query), query, builtin_table(), store.run)
    assert [c.id for c in result.candidates] == ["local"]
    assert "explicit preferred seed" in result.candidates[0].reasons
    assert all(q.local_only and q.preferred_seed == "local" for q in store.queries)


# ---------------------------------------------------------------------------
# the user's table
# ---------------------------------------------------------------------------

USER_TABLE = """\
groups:
- name: voice_extra
  capabilities: [text_to_speech, narration]
  domains: [tts]
- name: translation
  capabilities:
  - translate
  - machine_translation
"""


def test_parse_user_table() -> None:
    table = parse_user_table(USER_TABLE, "/home/u/.skillspec/equivalents.yml")
    assert table == EquivalenceTable(
        groups=(
            EquivalenceGroup("voice_extra", ("text_to_speech", "narration"), ("tts",)),
            EquivalenceGroup("translation", ("translate", "machine_translation"), ()),
        ),
        sources=("/home/u/.skillspec/equivalents.yml",),
    )


@pytest.mark.parametrize("text", ["", "groups: []\n", "{}\n"])
def test_empty_user_tables(text: str) -> None:
    assert parse_user_table(text, "t.yml").groups == ()


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        (
            "groups:\n- name: a\n  capabilities: [x]\n  colour: red\n",
            'unknown field "colour" at groups[0].colour (line 4)',
        ),
        ("extra: 1\n", 'unknown field "extra" at extra (line 1)'),
        (
            "groups:\n- name: a\n  name: b\n  capabilities: [x]\n",
            'duplicate field "name" at groups[0].name (line 3)',
        ),
        ("groups:\n- name: a\n", 'missing field "capabilities" at groups[0].capabilities (line 2)'),
        ("groups:\n- capabilities: [x]\n", 'missing field "name"'),
        ("groups:\n- name: a\n  capabilities: []\n", "a group needs at least one capability"),
        (
            "groups:\n- name: a\n  capabilities: [Text]\n",
            'invalid identifier "Text" in equivalent capability',
        ),
        (
            "groups:\n- name: a\n  capabilities: [x]\n  domains: [../up]\n",
            'invalid identifier "../up" in domain',
        ),
        ("groups:\n- name: a\n  capabilities: ['--']\n", "has no letters or digits"),
        ("groups:\n- name: a\n  capabilities: x\n", "expected a list at groups[0].capabilities (line 3)"),
        ("groups: {}\n", "expected a list at groups (line 1)"),
        ("- a\n", "expected a mapping at the top level (line 1)"),
        ("groups: [\n", "(line 2)"),
    ],
)
def test_user_table_refusals_name_file_field_and_line(text: str, detail: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_user_table(text, "/etc/eq.yml")
    assert str(caught.value).startswith("invalid equivalence table /etc/eq.yml: ")
    assert detail in str(caught.value)


# ---------------------------------------------------------------------------
# merging
# ---------------------------------------------------------------------------


def test_merge_unions_groups_sharing_a_term_and_appends_the_rest() -> None:
    merged = merge_tables(builtin_table(), parse_user_table(USER_TABLE, "u.yml"))
    assert merged.sources == ("builtin", "u.yml")
    voice = merged.groups[0]
    assert voice.name == "voice"
    assert voice.capabilities == (*SEED_001_TERMS, "narration")
    assert voice.domains == ("voice", "audio", "tts")
    assert merged.groups[-1].name == "translation"
    assert len(merged.groups) == len(builtin_table().groups) + 1


def test_merge_compares_terms_canonically_and_bridges_groups() -> None:
    left = EquivalenceTable(
        (EquivalenceGroup("a", ("x_1",), ("d1",)), EquivalenceGroup("b", ("y_1",), ("d2",))), ("l",)
    )
    bridge = EquivalenceTable((EquivalenceGroup("c", ("x-1", "y.1", "z_1"), ("d3",)),), ("r",))
    merged = merge_tables(left, bridge)
    assert merged.groups == (EquivalenceGroup("a", ("x_1", "y_1", "z_1"), ("d1", "d2", "d3")),)
    assert merged.sources == ("l", "r")


def test_a_merged_user_term_is_searched() -> None:
    table = merge_tables(builtin_table(), parse_user_table(USER_TABLE, "u.yml"))
    store = Store(make_seed("narrator", "tts", ("narration",)))
    query = SearchQuery("voice_message", domain="voice")
    result, broadening = broaden(store.run(query), query, table, store.run)
    assert [(c.id, c.matched_capability, c.matched_domain) for c in result.candidates] == [
        ("narrator", "narration", "tts")
    ]
    assert broadening.table_sources == ("builtin", "u.yml")
    assert isinstance(broadening, Broadening)
