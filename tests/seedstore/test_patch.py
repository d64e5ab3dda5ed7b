"""add, update and prefer: validation, SkillSpec's patch order, canonical and exact-string rules."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from agentsidecar.seedstore_service.errors import InvalidArgument, InvalidIdentifier
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
from agentsidecar.seedstore_service.patch import (
    AddSpec,
    UpdatePatch,
    apply_patch,
    apply_prefer,
    build_seed,
    parse_tie,
    validate_patch,
    validate_prefer,
)

NOW = 1_700_000_000

FULL_ADD = AddSpec(
    id="remote-voice-cli",
    domain="voice",
    kind="cli",
    command="voice-cli",
    provides=("text_to_speech",),
    aliases=("voice message",),
    preferred_for=("text_to_speech",),
    avoid_for=("music",),
    ties=("quality=high", "latency=low"),
    auth_env=("VOICE_PROVIDER_API_KEY",),
    priority=80,
    external_service=True,
    may_cost_money=True,
    evidence_commands=("voice-cli --help",),
    suggested_skill_id="voice.provider",
)

VERIFIED_BLOCK = Verification(
    VerificationStatus.VERIFIED, 100, (Outcome("path_lookup:voice-cli", True, "found"),)
)


def base_seed() -> Seed:
    return dataclasses.replace(build_seed(FULL_ADD), verification=VERIFIED_BLOCK)


# ---------------------------------------------------------------------------
# add
# ---------------------------------------------------------------------------


def test_build_seed_maps_every_flag() -> None:
    assert build_seed(FULL_ADD) == Seed(
        id="remote-voice-cli",
        domain="voice",
        kind="cli",
        command="voice-cli",
        provides=("text_to_speech",),
        aliases=("voice message",),
        rank=Rank(
            default_priority=80,
            preferred_for=("text_to_speech",),
            avoid_for=("music",),
            tie_breakers=MappingProxyType({"latency": "low", "quality": "high"}),
        ),
        evidence=(Evidence(source="cli_help", command="voice-cli --help"),),
        auth_env=("VOICE_PROVIDER_API_KEY",),
        risk=Risk(external_service=True, may_cost_money=True),
        promotion=Promotion("voice.provider"),
        verification=None,
    )


def test_build_seed_does_not_deduplicate_or_validate_free_lists() -> None:
    spec = AddSpec(
        id="a",
        domain="d",
        kind="",
        provides=("tts", "tts"),
        preferred_for=("Not An Identifier", "Not An Identifier"),
        aliases=("x", "X"),
        auth_env=("K", "K"),
        evidence_commands=("a --help", "a --help"),
    )
    seed = build_seed(spec)
    assert seed.provides == ("tts", "tts")
    assert seed.rank.preferred_for == ("Not An Identifier", "Not An Identifier")
    assert seed.aliases == ("x", "X")
    assert len(seed.evidence) == 2


@pytest.mark.parametrize(
    ("raw", "key", "value"),
    [("quality=high", "quality", "high"), ("a=b=c", "a", "b=c"), ("k=", "k", "")],
)
def test_tie_splits_at_the_first_equals(raw: str, key: str, value: str) -> None:
    assert parse_tie(raw) == (key, value)


def test_repeated_tie_key_keeps_the_last_value() -> None:
    seed = build_seed(AddSpec(id="a", domain="d", kind="k", provides=("x",), ties=("q=1", "q=2")))
    assert dict(seed.rank.tie_breakers) == {"q": "2"}


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"id": "Bad"}, InvalidIdentifier, 'invalid identifier "Bad" in capability id'),
        ({"domain": "../up"}, InvalidIdentifier, 'invalid identifier "../up" in domain'),
        ({"provides": ()}, InvalidArgument, "spec is missing required field provides"),
        ({"provides": ("ok", "no way")}, InvalidIdentifier, 'invalid identifier "no way" in provides'),
        ({"priority": 101}, InvalidArgument, "priority must be between 0 and 100"),
        ({"ties": ("quality",)}, InvalidArgument, 'tie breaker "quality" must use key=value'),
        ({"ties": ("Q=1",)}, InvalidIdentifier, 'invalid identifier "Q" in tie key'),
        ({"ties": ("=1",)}, InvalidIdentifier, 'invalid identifier "" in tie key'),
        ({"aliases": ("--",)}, InvalidArgument, 'alias "--" has no letters or digits'),
    ],
)
def test_build_seed_refusals(changes: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as caught:
        build_seed(dataclasses.replace(FULL_ADD, **changes))  # type: ignore[arg-type]
    assert type(caught.value) is error
    assert str(caught.value).startswith(message)


def test_priority_bounds_are_inclusive() -> None:
    assert build_seed(dataclasses.replace(FULL_ADD, priority=100)).rank.default_priority == 100
    assert build_seed(dataclasses.replace(FULL_ADD, priority=0)).rank.default_priority == 0


# ---------------------------------------------------------------------------
# update: order and rules
# ---------------------------------------------------------------------------


def test_empty_patch_changes_nothing() -> None:
    seed = base_seed()
    assert apply_patch(seed, UpdatePatch(), NOW) == seed


@pytest.mark.parametrize(
    ("patch", "field", "expected"),
    [
        (UpdatePatch(kind="adapter"), "kind", "adapter"),
        (UpdatePatch(command="x", clear_command=True), "command", "x"),  # clear first, then set
        (UpdatePatch(clear_command=True), "command", None),
        (UpdatePatch(adapter="a", clear_adapter=True), "adapter", "a"),
        (UpdatePatch(script="s"), "script", "s"),
        (UpdatePatch(clear_script=True), "script", None),
    ],
)
def test_scalar_fields(patch: UpdatePatch, field: str, expected: object) -> None:
    assert getattr(apply_patch(base_seed(), patch, NOW), field) == expected


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (UpdatePatch(add_provides=("speech_synthesis",)), ("text_to_speech", "speech_synthesis")),
        (UpdatePatch(add_provides=("text-to-speech",)), ("text_to_speech",)),  # canonical duplicate
        (UpdatePatch(add_provides=("a", "a", "A_")), ("text_to_speech", "a")),  # within one patch too
        (UpdatePatch(add_provides=("x",), remove_provides=("x",)), ("text_to_speech",)),  # add then remove
        (UpdatePatch(remove_provides=("text.to.speech",)), ()),  # may leave provides empty
    ],
)
def test_provides_add_then_remove(patch: UpdatePatch, expected: tuple[str, ...]) -> None:
    assert apply_patch(base_seed(), patch, NOW).provides == expected


def test_aliases_compare_canonically() -> None:
    seed = apply_patch(base_seed(), UpdatePatch(add_aliases=("Voice-Message", "say it")), NOW)
    assert seed.aliases == ("voice message", "say it")
    seed = apply_patch(seed, UpdatePatch(remove_aliases=("VOICE message",)), NOW)
    assert seed.aliases == ("say it",)


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (UpdatePatch(priority=35), 35),
        (UpdatePatch(clear_priority=True), None),
        (UpdatePatch(clear_priority=True, priority=5), 5),  # clear first, then set
        (UpdatePatch(priority=0), 0),
    ],
)
def test_priority(patch: UpdatePatch, expected: int | None) -> None:
    assert apply_patch(base_seed(), patch, NOW).rank.default_priority == expected


def test_preferred_and_avoid_lists() -> None:
    patch = UpdatePatch(
        add_preferred_for=("realistic_voice",),
        remove_preferred_for=("text-to-speech",),
        add_avoid_for=("text_to_speech", "music"),
        remove_avoid_for=("music",),
    )
    rank = apply_patch(base_seed(), patch, NOW).rank
    assert rank.preferred_for == ("realistic_voice",)
    assert rank.avoid_for == ("text_to_speech",)


def test_ties_add_replace_then_remove() -> None:
    patch = UpdatePatch(add_ties=("quality=best", "size=small", "gone=x"), remove_ties=("gone", "latency"))
    assert dict(apply_patch(base_seed(), patch, NOW).rank.tie_breakers) == {
        "quality": "best",
        "size": "small",
    }


def test_auth_env_compares_canonically() -> None:
    seed = apply_patch(base_seed(), UpdatePatch(add_auth_env=("voice_provider_api_key", "OTHER")), NOW)
    assert seed.auth_env == ("VOICE_PROVIDER_API_KEY", "OTHER")
    seed = apply_patch(seed, UpdatePatch(remove_auth_env=("voice-provider-api-key",)), NOW)
    assert seed.auth_env == ("OTHER",)


def test_risk_flags_take_values() -> None:
    seed = apply_patch(base_seed(), UpdatePatch(external_service=False), NOW)
    assert seed.risk == Risk(external_service=False, may_cost_money=True)
    seed = apply_patch(seed, UpdatePatch(may_cost_money=False, external_service=True), NOW)
    assert seed.risk == Risk(external_service=True, may_cost_money=False)


def test_evidence_uses_exact_command_strings() -> None:
    seed = dataclasses.replace(
        base_seed(),
        evidence=(
            Evidence("cli_help", command="voice-cli --help"),
            Evidence("note", detail="voice-cli --help"),
            Evidence("manual", command="voice-cli --help"),
        ),
    )
    added = apply_patch(
        seed, UpdatePatch(add_evidence_commands=("voice-cli --help", "voice-cli  --help")), NOW
    )
    assert added.evidence[3:] == (Evidence("cli_help", command="voice-cli  --help"),)  # not equal: two spaces
    removed = apply_patch(added, UpdatePatch(remove_evidence_commands=("voice-cli --help",)), NOW)
    # Every entry with that exact command goes; detail-only entries never do.
    assert removed.evidence == (
        Evidence("note", detail="voice-cli --help"),
        Evidence("cli_help", command="voice-cli  --help"),
    )


def test_evidence_add_then_remove_same_command_leaves_it_removed() -> None:
    patch = UpdatePatch(add_evidence_commands=("x --version",), remove_evidence_commands=("x --version",))
    assert apply_patch(base_seed(), patch, NOW).evidence == base_seed().evidence


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (UpdatePatch(suggested_skill_id="voice.v2"), Promotion("voice.v2")),
        (UpdatePatch(clear_suggested_skill_id=True), None),
        (UpdatePatch(clear_suggested_skill_id=True, suggested_skill_id="again"), Promotion("again")),
    ],
)
def test_promotion(patch: UpdatePatch, expected: Promotion | None) -> None:
    assert apply_patch(base_seed(), patch, NOW).promotion == expected


@pytest.mark.parametrize("mark", [VerificationStatus.FAILED, VerificationStatus.UNVERIFIED])
def test_mark_sets_status_and_time_and_clears_outcomes(mark: VerificationStatus) -> None:
    seed = apply_patch(base_seed(), UpdatePatch(mark=mark), NOW)
    assert seed.verification == Verification(status=mark, verified_at_unix=NOW, outcomes=())


def test_other_edits_keep_an_old_verification() -> None:
    seed = apply_patch(base_seed(), UpdatePatch(command="new-voice-cli", add_provides=("tts",)), NOW)
    assert seed.verification == VERIFIED_BLOCK
    assert seed.command == "new-voice-cli"


def test_seed_001_degrading_update_keeps_history() -> None:
    seed = dataclasses.replace(base_seed(), verification=None)
    patch = UpdatePatch(
        remove_preferred_for=("text_to_speech",),
        add_avoid_for=("text_to_speech",),
        priority=0,
        mark=VerificationStatus.FAILED,
    )
    updated = apply_patch(seed, patch, NOW)
    assert updated.rank.preferred_for == ()
    assert updated.rank.avoid_for == ("music", "text_to_speech")
    assert updated.rank.default_priority == 0
    assert updated.verification_status is VerificationStatus.FAILED
    for kept in ("command", "auth_env", "aliases", "evidence", "promotion", "provides", "risk"):
        assert getattr(updated, kept) == getattr(seed, kept), kept


def test_skillspec_update_sequence_keeps_old_values_and_adds_new() -> None:
    patch = UpdatePatch(
        add_provides=("voice_generation",),
        add_aliases=("spoken reply",),
        add_preferred_for=("realistic_voice",),
        add_avoid_for=("whisper",),
        priority=35,
        add_ties=("cost=medium",),
        mark=VerificationStatus.UNVERIFIED,
    )
    updated = apply_patch(base_seed(), patch, NOW)
    assert updated.provides == ("text_to_speech", "voice_generation")
    assert updated.aliases == ("voice message", "spoken reply")
    assert updated.rank.preferred_for == ("text_to_speech", "realistic_voice")
    assert updated.rank.avoid_for == ("music", "whisper")
    assert updated.rank.default_priority == 35
    assert dict(updated.rank.tie_breakers) == {"cost": "medium", "latency": "low", "quality": "high"}
    assert updated.verification_status is VerificationStatus.UNVERIFIED


# ---------------------------------------------------------------------------
# update: validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "label"),
    [
        (UpdatePatch(add_provides=("Bad",)), "add-provides"),
        (UpdatePatch(remove_provides=("Bad",)), "remove-provides"),
        (UpdatePatch(add_preferred_for=("Bad",)), "add-preferred-for"),
        (UpdatePatch(remove_preferred_for=("Bad",)), "remove-preferred-for"),
        (UpdatePatch(add_avoid_for=("Bad",)), "add-avoid-for"),
        (UpdatePatch(remove_avoid_for=("Bad",)), "remove-avoid-for"),
        (UpdatePatch(remove_ties=("Bad",)), "remove-tie"),
        (UpdatePatch(add_ties=("Bad=1",)), "tie key"),
    ],
)
def test_validate_patch_identifier_labels(patch: UpdatePatch, label: str) -> None:
    with pytest.raises(InvalidIdentifier) as caught:
        validate_patch(patch)
    assert str(caught.value) == f'invalid identifier "Bad" in {label}'


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (UpdatePatch(priority=101), "priority must be between 0 and 100"),
        (UpdatePatch(add_ties=("nokey",)), 'tie breaker "nokey" must use key=value'),
        (UpdatePatch(add_aliases=("!!",)), 'alias "!!" has no letters or digits'),
        (UpdatePatch(mark=VerificationStatus.VERIFIED), "a seed can only be marked failed or unverified"),
    ],
)
def test_validate_patch_other_refusals(patch: UpdatePatch, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate_patch(patch)
    assert not isinstance(caught.value, InvalidIdentifier)
    assert str(caught.value).startswith(message)


def test_validate_patch_leaves_free_text_alone() -> None:
    validate_patch(
        UpdatePatch(
            add_aliases=("Voice Message",),
            remove_aliases=("--",),  # removing needs no letters
            add_auth_env=("Any Thing",),
            command="anything at all",
            kind="",
            priority=100,
            mark=VerificationStatus.FAILED,
        )
    )


# ---------------------------------------------------------------------------
# prefer
# ---------------------------------------------------------------------------


def test_prefer_appends_and_sets_priority() -> None:
    seed = apply_prefer(base_seed(), "realistic_voice", 90)
    assert seed.rank.preferred_for == ("text_to_speech", "realistic_voice")
    assert seed.rank.default_priority == 90
    assert seed.verification == VERIFIED_BLOCK


def test_prefer_skips_a_canonical_duplicate_and_keeps_priority_when_absent() -> None:
    seed = apply_prefer(base_seed(), "text-to-speech", None)
    assert seed.rank.preferred_for == ("text_to_speech",)
    assert seed.rank.default_priority == 80


def test_prefer_leaves_a_conflicting_avoid_for() -> None:
    seed = apply_prefer(base_seed(), "music", None)
    assert seed.rank.preferred_for == ("text_to_speech", "music")
    assert seed.rank.avoid_for == ("music",)


def test_validate_prefer() -> None:
    validate_prefer("realistic_voice", 100)
    with pytest.raises(InvalidIdentifier) as caught:
        validate_prefer("Realistic Voice", None)
    assert str(caught.value) == 'invalid identifier "Realistic Voice" in for'
    with pytest.raises(InvalidArgument, match="priority must be between 0 and 100"):
        validate_prefer("ok", 101)
