"""Ranking arithmetic, exclusions, gates, order and ask policy (docs/ranking-and-gates.md)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentsidecar.seedstore_service.errors import InvalidIdentifier
from agentsidecar.seedstore_service.model import Evidence, Rank, Risk, Seed, Verification, VerificationStatus
from agentsidecar.seedstore_service.ranking import (
    RankedCandidate,
    SearchQuery,
    SearchResult,
    finish_search,
    score_seed,
    search,
    validate_query,
)

VERIFIED = VerificationStatus.VERIFIED
FAILED = VerificationStatus.FAILED
UNVERIFIED = VerificationStatus.UNVERIFIED


def make_seed(
    seed_id: str = "tool",
    *,
    domain: str = "voice",
    provides: tuple[str, ...] = (),
    aliases: tuple[str, ...] = (),
    evidence: tuple[Evidence, ...] = (),
    status: VerificationStatus | None = None,
    preferred_for: tuple[str, ...] = (),
    avoid_for: tuple[str, ...] = (),
    priority: int | None = None,
    external: bool = False,
    paid: bool = False,
    auth_env: tuple[str, ...] = (),
    command: str | None = None,
) -> Seed:
    return Seed(
        id=seed_id,
        domain=domain,
        kind="cli",
        command=command,
        provides=provides,
        aliases=aliases,
        rank=Rank(default_priority=priority, preferred_for=preferred_for, avoid_for=avoid_for),
        evidence=evidence,
        auth_env=auth_env,
        risk=Risk(external_service=external, may_cost_money=paid),
        verification=None if status is None else Verification(status, 1),
    )


def score(
    seed: Seed,
    capability: str = "text_to_speech",
    *,
    domain: str | None = None,
    local_only: bool = False,
    preferred_seed: str | None = None,
) -> RankedCandidate | None:
    query = SearchQuery(capability, domain=domain, local_only=local_only, preferred_seed=preferred_seed)
    return score_seed(seed, f"/s/{seed.domain}/{seed.id}.yml", query)


TTS = ("text_to_speech",)

# (name, seed, query kwargs, expected score, expected reasons)
SCORING = [
    (
        "direct, unverified",
        make_seed(provides=TTS),
        {},
        20,
        ["direct provides match: text_to_speech", "missing verification"],
    ),
    (
        "direct, verified",
        make_seed(provides=TTS, status=VERIFIED),
        {},
        65,
        ["direct provides match: text_to_speech", "verified evidence"],
    ),
    (
        "explicit unverified block",
        make_seed(provides=TTS, status=UNVERIFIED),
        {},
        20,
        ["direct provides match: text_to_speech", "missing verification"],
    ),
    (
        "alias only, negative total",
        make_seed(aliases=("speech",)),
        {},
        -5,
        ["alias or evidence text match", "missing verification"],
    ),
    (
        "evidence command",
        make_seed(evidence=(Evidence("cli_help", command="voice-cli --help"),), status=VERIFIED),
        {"capability": "help"},
        40,
        ["alias or evidence text match", "verified evidence"],
    ),
    (
        "evidence detail",
        make_seed(evidence=(Evidence("note", detail="Text to speech engine"),), status=VERIFIED),
        {},
        40,
        ["alias or evidence text match", "verified evidence"],
    ),
    (
        "direct wins over alias, never both",
        make_seed(provides=TTS, aliases=("text to speech",), status=VERIFIED),
        {},
        65,
        ["direct provides match: text_to_speech", "verified evidence"],
    ),
    (
        "direct match compares canonical forms, reason echoes the raw query",
        make_seed(provides=("text-to-speech",), status=VERIFIED),
        {"capability": "text.to.speech"},
        65,
        ["direct provides match: text.to.speech", "verified evidence"],
    ),
    (
        "preferred_for",
        make_seed(provides=TTS, status=VERIFIED, preferred_for=("text-to-speech",)),
        {},
        75,
        ["direct provides match: text_to_speech", "verified evidence", "preferred_for text_to_speech"],
    ),
    (
        "avoid_for",
        make_seed(provides=TTS, status=VERIFIED, avoid_for=TTS),
        {},
        35,
        ["direct provides match: text_to_speech", "verified evidence", "avoid_for text_to_speech"],
    ),
    (
        "preferred_for and avoid_for both apply",
        make_seed(provides=TTS, status=VERIFIED, preferred_for=TTS, avoid_for=TTS),
        {},
        45,
        [
            "direct provides match: text_to_speech",
            "verified evidence",
            "preferred_for text_to_speech",
            "avoid_for text_to_speech",
        ],
    ),
    (
        "priority 0 gives a +0 reason",
        make_seed(provides=TTS, status=VERIFIED, priority=0),
        {},
        65,
        ["direct provides match: text_to_speech", "verified evidence", "rank.default_priority 0 -> +0"],
    ),
    (
        "priority 9 floors to 0",
        make_seed(provides=TTS, status=VERIFIED, priority=9),
        {},
        65,
        ["direct provides match: text_to_speech", "verified evidence", "rank.default_priority 9 -> +0"],
    ),
    (
        "priority 75 floors to 7",
        make_seed(provides=TTS, status=VERIFIED, priority=75),
        {},
        72,
        ["direct provides match: text_to_speech", "verified evidence", "rank.default_priority 75 -> +7"],
    ),
    (
        "priority 100 is +10",
        make_seed(provides=TTS, status=VERIFIED, priority=100),
        {},
        75,
        ["direct provides match: text_to_speech", "verified evidence", "rank.default_priority 100 -> +10"],
    ),
    (
        "preferred seed",
        make_seed(provides=TTS, status=VERIFIED),
        {"preferred_seed": "tool"},
        165,
        ["direct provides match: text_to_speech", "verified evidence", "explicit preferred seed"],
    ),
    (
        "other preferred seed is ignored",
        make_seed(provides=TTS, status=VERIFIED),
        {"preferred_seed": "other"},
        65,
        ["direct provides match: text_to_speech", "verified evidence"],
    ),
    (
        "local-only, local seed",
        make_seed(provides=TTS, status=VERIFIED),
        {"local_only": True},
        85,
        ["direct provides match: text_to_speech", "verified evidence", "local-only constraint satisfied"],
    ),
    (
        "local-only, paid but local",
        make_seed(provides=TTS, status=VERIFIED, paid=True),
        {"local_only": True},
        85,
        ["direct provides match: text_to_speech", "verified evidence", "local-only constraint satisfied"],
    ),
    (
        "external",
        make_seed(provides=TTS, status=VERIFIED, external=True),
        {},
        55,
        ["direct provides match: text_to_speech", "verified evidence", "external or paid risk requires gate"],
    ),
    (
        "paid",
        make_seed(provides=TTS, status=VERIFIED, paid=True),
        {},
        55,
        ["direct provides match: text_to_speech", "verified evidence", "external or paid risk requires gate"],
    ),
    (
        "external and paid: -10 once",
        make_seed(provides=TTS, status=VERIFIED, external=True, paid=True),
        {},
        55,
        ["direct provides match: text_to_speech", "verified evidence", "external or paid risk requires gate"],
    ),
    (
        "secrets gate costs nothing",
        make_seed(provides=TTS, status=VERIFIED, auth_env=("KEY",)),
        {},
        65,
        ["direct provides match: text_to_speech", "verified evidence"],
    ),
    (
        "every component, in order",
        make_seed(
            provides=TTS, status=VERIFIED, preferred_for=TTS, avoid_for=TTS, priority=55, external=True
        ),
        {"preferred_seed": "tool"},
        40 + 25 + 10 - 30 + 5 + 100 - 10,
        [
            "direct provides match: text_to_speech",
            "verified evidence",
            "preferred_for text_to_speech",
            "avoid_for text_to_speech",
            "rank.default_priority 55 -> +5",
            "explicit preferred seed",
            "external or paid risk requires gate",
        ],
    ),
]


@pytest.mark.parametrize(("name", "seed", "query", "expected_score", "expected_reasons"), SCORING)
def test_scoring_components(
    name: str, seed: Seed, query: dict[str, Any], expected_score: int, expected_reasons: list[str]
) -> None:
    candidate = score(seed, **query)
    assert candidate is not None, name
    assert candidate.score == expected_score, name
    assert list(candidate.reasons) == expected_reasons, name


EXCLUSIONS = [
    ("failed verification", make_seed(provides=TTS, status=FAILED), {}),
    (
        "failed, even as the preferred seed",
        make_seed(provides=TTS, status=FAILED),
        {"preferred_seed": "tool"},
    ),
    ("no match at all", make_seed(provides=("speech_to_text",), aliases=("transcribe",)), {}),
    (
        "external under local-only",
        make_seed(provides=TTS, status=VERIFIED, external=True),
        {"local_only": True},
    ),
    (
        "external under local-only, even as the preferred seed",
        make_seed(provides=TTS, status=VERIFIED, external=True),
        {"local_only": True, "preferred_seed": "tool"},
    ),
    (
        "id, command, kind, domain and preferred_for are not match sources",
        make_seed("text_to_speech", domain="text_to_speech", command="text_to_speech", preferred_for=TTS),
        {},
    ),
    (
        "a provides entry is never partially matched",
        make_seed(provides=TTS, status=VERIFIED),
        {"capability": "speech"},
    ),
    ("evidence source is not checked", make_seed(evidence=(Evidence("text_to_speech"),)), {}),
]


@pytest.mark.parametrize(("name", "seed", "query"), EXCLUSIONS)
def test_exclusions(name: str, seed: Seed, query: dict[str, Any]) -> None:
    assert score(seed, **query) is None, name


@pytest.mark.parametrize(
    ("seed", "risks", "gates"),
    [
        (make_seed(provides=TTS), (), ()),
        (make_seed(provides=TTS, external=True), ("external_service",), ("external_service_approval",)),
        (make_seed(provides=TTS, paid=True), ("may_cost_money",), ("provider_cost_approval",)),
        (make_seed(provides=TTS, auth_env=("K",)), (), ("secret_use_approval",)),
        (
            make_seed(provides=TTS, external=True, paid=True, auth_env=("K",)),
            ("external_service", "may_cost_money"),
            ("provider_cost_approval", "external_service_approval", "secret_use_approval"),
        ),
    ],
)
def test_risks_and_gates_in_skillspec_order(
    seed: Seed, risks: tuple[str, ...], gates: tuple[str, ...]
) -> None:
    candidate = score(seed)
    assert candidate is not None
    assert candidate.risks == risks
    assert candidate.required_gates == gates


def test_paid_local_seed_keeps_its_cost_gate_under_local_only() -> None:
    candidate = score(make_seed(provides=TTS, status=VERIFIED, paid=True), local_only=True)
    assert candidate is not None
    assert candidate.required_gates == ("provider_cost_approval",)
    assert "external or paid risk requires gate" not in candidate.reasons


@pytest.mark.parametrize(
    ("alias", "capability", "matches"),
    [
        ("speech", "text_to_speech", True),  # a short alias matches inside a longer capability
        ("voice message", "voice", True),
        ("VOICE Message", "voice_message", True),
        ("--", "anything_at_all", False),  # no letters or digits: inert (SkillSpec matches everything)
        ("日本語", "anything_at_all", False),
        ("voice message", "text_to_speech", False),
    ],
)
def test_alias_substring_quirks(alias: str, capability: str, matches: bool) -> None:
    assert (score(make_seed(aliases=(alias,)), capability) is not None) is matches


@pytest.mark.parametrize("capability", ["help", "voice", "cli", "voice_cli_help"])
def test_evidence_command_tokens_match(capability: str) -> None:
    seed = make_seed(evidence=(Evidence("cli_help", command="voice-cli --help"),))
    candidate = score(seed, capability)
    assert candidate is not None
    assert candidate.reasons[0] == "alias or evidence text match"


def test_candidate_carries_identity_and_path() -> None:
    candidate = score(make_seed("say", domain="audio", provides=TTS))
    assert candidate is not None
    assert (candidate.id, candidate.domain, candidate.path) == ("say", "audio", "/s/audio/say.yml")
    assert (candidate.matched_capability, candidate.matched_domain) == ("", "")


# ---------------------------------------------------------------------------
# the two-seed case from SkillSpec's own test, and the bootstrap documentation's example seed
# ---------------------------------------------------------------------------

REMOTE = make_seed("remote-voice-cli", provides=TTS, status=VERIFIED, priority=80, external=True, paid=True)
MACOS_SAY = make_seed("macos-say", provides=TTS, status=VERIFIED, priority=75)


def pairs(*seeds: Seed) -> list[tuple[Seed, str]]:
    return [(seed, f"/s/{seed.domain}/{seed.id}.yml") for seed in seeds]


def test_close_candidates_ask_instead_of_selecting() -> None:
    result = search(pairs(REMOTE, MACOS_SAY), SearchQuery("text_to_speech", domain="voice"))
    assert [(c.id, c.score) for c in result.candidates] == [("macos-say", 72), ("remote-voice-cli", 63)]
    assert result.selected is None
    assert result.ask_policy == "top_candidates_within_10_points"
    assert (result.capability, result.domain) == ("text_to_speech", "voice")
    assert result.candidates[1].reasons == (
        "direct provides match: text_to_speech",
        "verified evidence",
        "rank.default_priority 80 -> +8",
        "external or paid risk requires gate",
    )


def test_local_only_keeps_only_the_local_seed_and_selects_it() -> None:
    result = search(pairs(REMOTE, MACOS_SAY), SearchQuery("text_to_speech", local_only=True))
    assert [(c.id, c.score) for c in result.candidates] == [("macos-say", 92)]
    assert result.selected == "macos-say"
    assert result.ask_policy is None


def test_seed_001_example_scores_28_with_three_gates() -> None:
    seed = make_seed(
        "preferred-voice-cli",
        provides=TTS,
        aliases=("voice message",),
        preferred_for=TTS,
        priority=80,
        external=True,
        paid=True,
        auth_env=("VOICE_PROVIDER_API_KEY",),
    )
    candidate = score(seed)
    assert candidate is not None
    assert candidate.score == 40 - 20 + 10 + 8 - 10
    assert candidate.required_gates == (
        "provider_cost_approval",
        "external_service_approval",
        "secret_use_approval",
    )


def test_seed_001_degraded_seed_drops_out() -> None:
    degraded = make_seed("preferred-voice-cli", provides=TTS, avoid_for=TTS, priority=0, status=FAILED)
    result = search(pairs(degraded, MACOS_SAY), SearchQuery("text_to_speech"))
    assert [c.id for c in result.candidates] == ["macos-say"]
    assert result.selected == "macos-say"


# ---------------------------------------------------------------------------
# order and ask policy
# ---------------------------------------------------------------------------


def candidate(seed_id: str, score_value: int, domain: str = "voice") -> RankedCandidate:
    return RankedCandidate(seed_id, domain, f"/s/{domain}/{seed_id}.yml", score_value, (), (), ())


def test_empty_result_shape() -> None:
    result = search([], SearchQuery("text_to_speech", domain="voice"))
    assert result == SearchResult("text_to_speech", "voice", None, None, ())


def test_same_id_and_domain_in_two_files_orders_by_path() -> None:
    yaml_file = RankedCandidate("x", "voice", "/s/voice/x.yaml", 50, (), (), ())
    yml_file = RankedCandidate("x", "voice", "/s/voice/x.yml", 50, (), (), ())
    for given_order in ([yml_file, yaml_file], [yaml_file, yml_file]):
        assert finish_search(given_order, SearchQuery("x")).candidates == (yaml_file, yml_file)


def test_ties_order_by_id_bytes_then_domain() -> None:
    shuffled = [
        candidate("b", 50, "voice"),
        candidate("a_b", 50),
        candidate("a.b", 50),
        candidate("a-b", 50),
        candidate("b", 50, "audio"),
        candidate("z", 90),
    ]
    random.Random(7).shuffle(shuffled)
    result = finish_search(shuffled, SearchQuery("x"))
    assert [(c.id, c.domain) for c in result.candidates] == [
        ("z", "voice"),
        ("a-b", "voice"),  # '-' 0x2d < '.' 0x2e < '_' 0x5f
        ("a.b", "voice"),
        ("a_b", "voice"),
        ("b", "audio"),
        ("b", "voice"),
    ]


@pytest.mark.parametrize(
    ("scores", "selected", "ask"),
    [
        ([72], "first", None),
        ([72, 62], None, "top_candidates_within_10_points"),  # exactly 10 apart still asks
        ([72, 61], "first", None),
        ([72, 72], None, "top_candidates_within_10_points"),
        ([-5, -40], "first", None),  # negative scores still select
        ([100, 20, 95], None, "top_candidates_within_10_points"),  # compares the top two after sorting
    ],
)
def test_ask_policy_compares_the_top_two(scores: list[int], selected: str | None, ask: str | None) -> None:
    candidates = [candidate(f"s{index}", value) for index, value in enumerate(scores)]
    result = finish_search(candidates, SearchQuery("x"))
    best = max(candidates, key=lambda c: c.score)
    assert result.selected == (best.id if selected == "first" else None)
    assert result.ask_policy == ask


def test_search_does_not_validate_identifiers() -> None:
    result = search(pairs(MACOS_SAY), SearchQuery("Text To Speech"))
    assert [c.id for c in result.candidates] == ["macos-say"]
    assert result.candidates[0].reasons[0] == "direct provides match: Text To Speech"


@pytest.mark.parametrize(
    ("query", "label", "value"),
    [
        (SearchQuery("Text"), "capability", "Text"),
        (SearchQuery("tts", domain="../x"), "domain", "../x"),
        (SearchQuery("tts", preferred_seed="a/b"), "preferred seed", "a/b"),
    ],
)
def test_validate_query_labels(query: SearchQuery, label: str, value: str) -> None:
    with pytest.raises(InvalidIdentifier) as caught:
        validate_query(query)
    assert str(caught.value) == f'invalid identifier "{value}" in {label}'


def test_validate_query_accepts_a_valid_query() -> None:
    validate_query(SearchQuery("text_to_speech", domain="voice", preferred_seed="macos-say"))


# ---------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------

seed_strategy = st.builds(
    make_seed,
    st.sampled_from(["a", "b", "c", "a-1", "b_2"]),
    domain=st.sampled_from(["voice", "audio"]),
    provides=st.lists(st.sampled_from(["text_to_speech", "voice", "speech"]), max_size=2).map(tuple),
    aliases=st.lists(st.sampled_from(["speech", "voice message", "say"]), max_size=2).map(tuple),
    status=st.none() | st.sampled_from(VerificationStatus),
    preferred_for=st.lists(st.sampled_from(["text_to_speech", "voice"]), max_size=1).map(tuple),
    avoid_for=st.lists(st.sampled_from(["text_to_speech", "voice"]), max_size=1).map(tuple),
    priority=st.none() | st.integers(0, 100),
    external=st.booleans(),
    paid=st.booleans(),
)


@pytest.mark.slow
@given(
    st.lists(seed_strategy, max_size=8),
    st.sampled_from(["text_to_speech", "voice", "speech"]),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_search_is_order_independent_and_sorted(
    seeds: list[Seed], capability: str, local_only: bool, rng: random.Random
) -> None:
    query = SearchQuery(capability, local_only=local_only, preferred_seed="a")
    # Distinct files, even when two declare the same id in one domain (x.yml and x.yaml).
    scope = [(seed, f"/s/{seed.domain}/{seed.id}.{index}.yml") for index, seed in enumerate(seeds)]
    forward = search(scope, query)
    rng.shuffle(scope)
    assert search(scope, query) == forward
    keys = [(-c.score, c.id, c.domain, c.path) for c in forward.candidates]
    assert keys == sorted(keys)
    usable = {(seed.domain, seed.id) for seed in seeds if seed.verification_status is not FAILED}
    assert all((c.domain, c.id) in usable for c in forward.candidates)
    if forward.selected is not None:
        assert forward.selected == forward.candidates[0].id
        assert len(forward.candidates) == 1 or forward.candidates[0].score - forward.candidates[1].score > 10
