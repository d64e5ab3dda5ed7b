"""Seed files: identifiers, canonical text, strict parsing, serde_yaml-identical writing, JSON."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from types import MappingProxyType

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from agentsidecar.seedstore_service import seedfile
from agentsidecar.seedstore_service.errors import InvalidIdentifier, SeedMalformed
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
from agentsidecar.seedstore_service.patch import AddSpec, build_seed
from agentsidecar.seedstore_service.seedfile import (
    canonical,
    dump_seed,
    parse_seed,
    revision_of,
    seed_to_json,
    text_matches,
    validate_identifier,
)

# The example seed as SkillSpec's `add` writes it, byte for byte.
ADD_EXAMPLE_YAML = """\
id: remote-voice-cli
domain: voice
kind: cli
command: voice-cli
provides:
- text_to_speech
rank:
  default_priority: 80
  tie_breakers:
    quality: high
evidence:
- source: cli_help
  command: voice-cli --help
"""

# A hand-written seed: other key order, indented list items; still valid.
SEED_001_EXAMPLE_YAML = """\
id: preferred-voice-cli
domain: voice
kind: cli
command: voice-cli
provides:
  - text_to_speech
aliases:
  - voice message
rank:
  default_priority: 80
  preferred_for:
    - text_to_speech
  tie_breakers:
    quality: high
auth:
  env:
    - VOICE_PROVIDER_API_KEY
risk:
  external_service: true
  may_cost_money: true
evidence:
  - source: cli_help
    command: voice-cli --help
promotion:
  suggested_skill_id: voice.provider
"""

MINIMAL = "id: a\ndomain: d\nkind: cli\n"


def ties(**values: str) -> MappingProxyType[str, str]:
    return MappingProxyType(dict(sorted(values.items())))


# ---------------------------------------------------------------------------
# identifiers, canonical, text_matches, revision
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["voice", "text_to_speech", "a.b", "x-1_2", "a..b", "-a", "0", "voice.provider"]
)
def test_valid_identifiers_are_returned_unchanged(value: str) -> None:
    assert validate_identifier(value, "domain") == value


@pytest.mark.parametrize("value", ["", ".hidden", "..", "../x", "a/b", "a\\b", "Voice", "a b", "é", "a:b"])
def test_invalid_identifiers_name_value_and_field(value: str) -> None:
    with pytest.raises(InvalidIdentifier) as caught:
        validate_identifier(value, "capability id")
    assert str(caught.value) == f'invalid identifier "{value}" in capability id'
    assert caught.value.field == "capability id"
    assert caught.value.value == value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Voice  Message!", "voice_message"),
        ("text-to-speech", "text_to_speech"),
        ("text.to.speech", "text_to_speech"),
        ("TEXT_TO_SPEECH", "text_to_speech"),
        ("__a__b__", "a_b"),
        ("--", ""),
        ("", ""),
        ("Élan vital", "lan_vital"),  # non-ASCII letters are separators, not letters
        ("voice-cli --help", "voice_cli_help"),
        ("\u212aelvin", "elvin"),  # the Kelvin sign lowers to an ASCII "k": still a separator
        ("\u0130stanbul", "stanbul"),  # so does the dotted capital I ("i" + a combining dot)
    ],
)
def test_canonical_form(text: str, expected: str) -> None:
    assert canonical(text) == expected


def _canonical_by_definition(text: str) -> str:
    """SkillSpec's rule spelled out char by char, as the reference for the fast form."""
    mapped = "".join(char.lower() if char.isascii() and char.isalnum() else "_" for char in text)
    return "_".join(part for part in mapped.split("_") if part)


@pytest.mark.slow
@given(st.text(alphabet=st.one_of(st.characters(), st.sampled_from("aZ09_-. \u212a\u0130ß"))))
def test_canonical_form_matches_its_definition(text: str) -> None:
    assert canonical(text) == _canonical_by_definition(text)


@pytest.mark.parametrize(
    ("text", "capability", "expected"),
    [
        ("speech", "text_to_speech", True),  # short text inside the capability
        ("voice message", "voice", True),  # capability inside the text
        ("voice-cli --help", "help", True),
        ("voice-cli --help", "cli", True),
        ("--", "anything", True),  # empty canonical text matches every capability
        ("voice message", "text_to_speech", False),
        ("texttospeech", "text_to_speech", False),  # characters, not tokens
    ],
)
def test_text_matches_is_substring_either_way(text: str, capability: str, expected: bool) -> None:
    assert text_matches(text, capability) is expected


def test_revision_is_a_sha256_prefix_that_tracks_content() -> None:
    data = ADD_EXAMPLE_YAML.encode()
    assert revision_of(data) == hashlib.sha256(data).hexdigest()[:16]
    assert len(revision_of(data)) == 16
    assert revision_of(data + b"\n") != revision_of(data)


# ---------------------------------------------------------------------------
# parsing what SkillSpec writes and documents
# ---------------------------------------------------------------------------


@pytest.mark.usefixtures("loader")
def test_parses_the_add_example() -> None:
    assert parse_seed(ADD_EXAMPLE_YAML, "/s/voice/remote-voice-cli.yml") == Seed(
        id="remote-voice-cli",
        domain="voice",
        kind="cli",
        command="voice-cli",
        provides=("text_to_speech",),
        rank=Rank(default_priority=80, tie_breakers=ties(quality="high")),
        evidence=(Evidence(source="cli_help", command="voice-cli --help"),),
    )


@pytest.mark.usefixtures("loader")
def test_parses_the_seed_001_example_in_any_key_order() -> None:
    seed = parse_seed(SEED_001_EXAMPLE_YAML, "x.yml")
    assert seed == Seed(
        id="preferred-voice-cli",
        domain="voice",
        kind="cli",
        command="voice-cli",
        provides=("text_to_speech",),
        aliases=("voice message",),
        rank=Rank(default_priority=80, preferred_for=("text_to_speech",), tie_breakers=ties(quality="high")),
        evidence=(Evidence(source="cli_help", command="voice-cli --help"),),
        auth_env=("VOICE_PROVIDER_API_KEY",),
        risk=Risk(external_service=True, may_cost_money=True),
        promotion=Promotion("voice.provider"),
    )
    assert seed.verification_status is VerificationStatus.UNVERIFIED


def test_parses_verification_with_outcomes() -> None:
    text = MINIMAL + (
        "verification:\n"
        "  status: failed\n"
        "  verified_at_unix: 1700000000\n"
        "  outcomes:\n"
        "  - check: path_lookup:voice-cli\n"
        "    ok: false\n"
        "    message: voice-cli not found on PATH\n"
    )
    assert parse_seed(text, "x.yml").verification == Verification(
        status=VerificationStatus.FAILED,
        verified_at_unix=1700000000,
        outcomes=(Outcome("path_lookup:voice-cli", False, "voice-cli not found on PATH"),),
    )


@pytest.mark.usefixtures("loader")
@pytest.mark.parametrize(
    ("yaml_text", "field", "expected"),
    [
        # serde_yaml hands any scalar's text to a String field.
        (MINIMAL.replace("id: a", "id: 123"), "id", "123"),
        (MINIMAL.replace("kind: cli", "kind: true"), "kind", "true"),
        (MINIMAL.replace("kind: cli", "kind: ''"), "kind", ""),
        (MINIMAL + "command: ~\n", "command", None),
        (MINIMAL + "command: null\n", "command", None),
        (MINIMAL + "command:\n", "command", None),
        (MINIMAL + "command: ''\n", "command", ""),
        (MINIMAL + "command: 'null'\n", "command", "null"),
        (MINIMAL + "provides:\n", "provides", ()),
        (MINIMAL + "provides: []\n", "provides", ()),
        (MINIMAL + "provides: [a, b]\n", "provides", ("a", "b")),
        (MINIMAL + "aliases: [007]\n", "aliases", ("007",)),
    ],
)
def test_scalar_rules_follow_serde_yaml(yaml_text: str, field: str, expected: object) -> None:
    assert getattr(parse_seed(yaml_text, "x.yml"), field) == expected


@pytest.mark.parametrize(
    ("rank_yaml", "expected"),
    [
        ("rank:\n", Rank()),
        ("rank:\n  default_priority: 0x50\n", Rank(default_priority=80)),
        ("rank:\n  default_priority: +7\n", Rank(default_priority=7)),
        ("rank:\n  default_priority: ~\n", Rank()),
        ("rank:\n  tie_breakers:\n    quality: '007'\n", Rank(tie_breakers=ties(quality="007"))),
        ("rank:\n  tie_breakers:\n    b: 2\n    a: x\n", Rank(tie_breakers=ties(a="x", b="2"))),
    ],
)
def test_rank_variants(rank_yaml: str, expected: Rank) -> None:
    assert parse_seed(MINIMAL + rank_yaml, "x.yml").rank == expected


def test_quoted_status_and_anchors_are_accepted() -> None:
    text = (
        "id: a\ndomain: d\nkind: cli\nprovides: &caps [tts]\nrank:\n  preferred_for: *caps\n"
        "verification:\n  status: 'verified'\n  verified_at_unix: 5\n"
    )
    seed = parse_seed(text, "x.yml")
    assert seed.rank.preferred_for == ("tts",)
    assert seed.verification_status is VerificationStatus.VERIFIED


# ---------------------------------------------------------------------------
# refusals: every one names the field path and the line
# ---------------------------------------------------------------------------

REFUSALS = [
    ("a\n" + "x: 1\n", "mapping values are not allowed"),
    (MINIMAL + "colour: red\n", 'unknown field "colour" at colour (line 4, column'),
    (
        MINIMAL + "rank:\n  default_priority: 5\n  colour: red\n",
        'unknown field "colour" at rank.colour (line 6, column',
    ),
    (
        MINIMAL + "evidence:\n- source: s\n  colour: red\n",
        'unknown field "colour" at evidence[0].colour (line 6, column',
    ),
    (MINIMAL + "auth:\n  env: [A]\n  vars: [B]\n", 'unknown field "vars" at auth.vars (line 6, column'),
    (MINIMAL + "risk:\n  cheap: true\n", 'unknown field "cheap" at risk.cheap (line 5, column'),
    (
        MINIMAL + "promotion:\n  suggested_skill_id: x\n  y: 1\n",
        'unknown field "y" at promotion.y (line 6, column',
    ),
    (
        MINIMAL + "verification:\n  status: verified\n  verified_at_unix: 1\n  outcomes:\n"
        "  - check: c\n    ok: true\n    message: m\n    exit: 0\n",
        'unknown field "exit" at verification.outcomes[0].exit (line 11, column',
    ),
    ("id: a\nid: b\ndomain: d\nkind: k\n", 'duplicate field "id" at id (line 2, column'),
    (
        MINIMAL + "rank:\n  tie_breakers:\n    q: a\n    q: b\n",
        'duplicate key "q" at rank.tie_breakers.q (line 7, column',
    ),
    ("domain: d\nkind: k\n", 'missing field "id" at id (line 1, column'),
    ("id: a\ndomain: d\n", 'missing field "kind" at kind (line 1, column'),
    (MINIMAL + "evidence:\n- command: x\n", 'missing field "source" at evidence[0].source (line 5, column'),
    (MINIMAL + "verification:\n  status: verified\n", 'missing field "verified_at_unix"'),
    (
        MINIMAL + "promotion: {}\n",
        'missing field "suggested_skill_id" at promotion.suggested_skill_id (line 4, column',
    ),
    ("", 'missing field "id" at id (line 1, column'),
    (
        MINIMAL + "provides: text_to_speech\n",
        'expected a sequence at provides, found the scalar "text_to_speech"',
    ),
    ("id: [a]\ndomain: d\nkind: k\n", "expected a string at id, found a sequence (line 1, column"),
    (MINIMAL + "rank: [1]\n", "expected a mapping at rank, found a sequence (line 4, column"),
    (MINIMAL + "rank: ~\n", "expected a mapping at rank, found null (line 4, column"),
    (
        MINIMAL + "risk:\n  external_service: yes\n",
        "expected a boolean (true or false) at risk.external_service",
    ),
    (MINIMAL + "risk:\n  may_cost_money: 'true'\n", 'found the quoted string "true" (line 5, column'),
    (
        MINIMAL + "rank:\n  default_priority: 101\n",
        "priority must be between 0 and 100 at rank.default_priority (line 5, column",
    ),
    (
        MINIMAL + "rank:\n  default_priority: 256\n",
        "expected an integer from 0 to 255 at rank.default_priority",
    ),
    (MINIMAL + "rank:\n  default_priority: -1\n", "expected an integer from 0 to 255"),
    (MINIMAL + "rank:\n  default_priority: '80'\n", 'found the quoted string "80"'),
    (MINIMAL + "rank:\n  default_priority: 80.5\n", "expected an integer from 0 to 255"),
    (MINIMAL + "rank:\n  default_priority: 080\n", "expected an integer from 0 to 255"),
    (
        MINIMAL + "verification:\n  status: ok\n  verified_at_unix: 1\n",
        'unknown verification status "ok" at verification.status, '
        "expected verified, failed or unverified (line 5, column",
    ),
    (MINIMAL + "verification:\n  status: verified\n  verified_at_unix: -5\n", "a non-negative integer"),
    (MINIMAL + "---\n" + MINIMAL, "expected a single YAML document, found more than one (line 4, column"),
    ("- id: a\n", "expected a mapping at the top level, found a sequence (line 1, column"),
    ("just text\n", "expected a mapping at the top level, found a scalar (line 1, column 1)"),
    ("id: Voice\ndomain: d\nkind: k\n", 'invalid identifier "Voice" in capability id at id (line 1, column'),
    ("id: a\ndomain: ../x\nkind: k\n", 'invalid identifier "../x" in domain at domain (line 2, column'),
    (
        MINIMAL + "provides:\n- ok\n- Not OK\n",
        'invalid identifier "Not OK" in provides at provides[1] (line 6, column',
    ),
    (
        MINIMAL + "rank:\n  tie_breakers:\n    Q: x\n",
        'invalid identifier "Q" in tie key at rank.tie_breakers.Q (line 6, column',
    ),
]


@pytest.fixture(params=["libyaml", "pure"])
def loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run a test with the C parser (when PyYAML has it) and with the pure-Python one."""
    if request.param == "libyaml":
        if not yaml.__with_libyaml__:
            pytest.skip("PyYAML was built without libyaml")
        monkeypatch.setattr(seedfile, "_LOADER", seedfile.untyped_loader(yaml.CSafeLoader))
    else:
        monkeypatch.setattr(seedfile, "_LOADER", seedfile.untyped_loader(yaml.SafeLoader))


@pytest.mark.usefixtures("loader")
@pytest.mark.parametrize(("yaml_text", "detail"), REFUSALS)
def test_refusals_name_field_and_line(yaml_text: str, detail: str) -> None:
    with pytest.raises(SeedMalformed) as caught:
        parse_seed(yaml_text, "/store/voice/bad.yml")
    assert detail in caught.value.detail
    assert caught.value.path == "/store/voice/bad.yml"
    assert str(caught.value) == f"failed to parse YAML from /store/voice/bad.yml: {caught.value.detail}"
    assert re.search(rf"\(line {caught.value.line}, column \d+\)$", caught.value.detail)


def test_refusal_line_points_at_the_offending_key() -> None:
    with pytest.raises(SeedMalformed) as caught:
        parse_seed(MINIMAL + "rank:\n  default_priority: 5\n  colour: red\n", "x.yml")
    assert caught.value.line == 6


# ---------------------------------------------------------------------------
# writing exactly like serde_yaml
# ---------------------------------------------------------------------------


def test_add_example_is_written_byte_for_byte() -> None:
    seed = build_seed(
        AddSpec(
            id="remote-voice-cli",
            domain="voice",
            kind="cli",
            command="voice-cli",
            provides=("text_to_speech",),
            priority=80,
            ties=("quality=high",),
            evidence_commands=("voice-cli --help",),
        )
    )
    assert dump_seed(seed) == ADD_EXAMPLE_YAML


def test_full_seed_uses_struct_order_and_omits_false_flags() -> None:
    seed = parse_seed(SEED_001_EXAMPLE_YAML, "x.yml")
    seed = dataclasses.replace(
        seed,
        risk=Risk(external_service=False, may_cost_money=True),
        verification=Verification(
            VerificationStatus.VERIFIED, 1700000000, (Outcome("path_lookup:voice-cli", True, "ok"),)
        ),
    )
    assert dump_seed(seed) == (
        "id: preferred-voice-cli\n"
        "domain: voice\n"
        "kind: cli\n"
        "command: voice-cli\n"
        "provides:\n"
        "- text_to_speech\n"
        "aliases:\n"
        "- voice message\n"
        "rank:\n"
        "  default_priority: 80\n"
        "  preferred_for:\n"
        "  - text_to_speech\n"
        "  tie_breakers:\n"
        "    quality: high\n"
        "evidence:\n"
        "- source: cli_help\n"
        "  command: voice-cli --help\n"
        "auth:\n"
        "  env:\n"
        "  - VOICE_PROVIDER_API_KEY\n"
        "risk:\n"
        "  may_cost_money: true\n"
        "promotion:\n"
        "  suggested_skill_id: voice.provider\n"
        "verification:\n"
        "  status: verified\n"
        "  verified_at_unix: 1700000000\n"
        "  outcomes:\n"
        "  - check: path_lookup:voice-cli\n"
        "    ok: true\n"
        "    message: ok\n"
    )


def test_ties_are_written_sorted_by_key() -> None:
    seed = Seed(
        id="a", domain="d", kind="k", rank=Rank(tie_breakers=MappingProxyType({"z": "1x", "a": "2x"}))
    )
    assert dump_seed(seed) == "id: a\ndomain: d\nkind: k\nrank:\n  tie_breakers:\n    a: 2x\n    z: 1x\n"


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("", "''"),
        ("true", "'true'"),
        ("False", "'False'"),
        ("null", "'null'"),
        ("~", "'~'"),
        ("123", "'123'"),
        ("-5", "'-5'"),
        ("0x1F", "'0x1F'"),
        ("0123", "'0123'"),  # serde_yaml quotes leading-zero digits too
        ("1.5e3", "'1.5e3'"),
        (".inf", "'.inf'"),
        ("yes", "yes"),  # YAML 1.2 (serde_yaml): not a bool, so not quoted
        ("1e999", "1e999"),  # not a finite float to serde_yaml, so plain
        (" padded", "' padded'"),
        ("trailing ", "'trailing '"),
        ("key: value", "'key: value'"),
        ("#hash", "'#hash'"),
        ("- dash", "'- dash'"),
        ("it's", "it's"),
        ("voix française", "voix française"),
        ("a\tb", '"a\\tb"'),
        ("two\nlines", "|-\n  two\n  lines"),
        ("ends\n", "|\n  ends"),
        ("x" * 200 + " y" * 50, "x" * 200 + " y" * 50),  # never folded
    ],
)
def test_string_quoting_matches_serde_yaml(value: str, written: str) -> None:
    text = dump_seed(Seed(id="a", domain="d", kind=value))
    assert text == f"id: a\ndomain: d\nkind: {written}\n"
    assert parse_seed(text, "x.yml").kind == value


def test_written_yaml_reads_back_with_a_plain_yaml_reader() -> None:
    text = dump_seed(parse_seed(SEED_001_EXAMPLE_YAML, "x.yml"))
    loaded = yaml.safe_load(text)
    assert loaded["risk"] == {"external_service": True, "may_cost_money": True}
    assert loaded["rank"]["default_priority"] == 80


# ---------------------------------------------------------------------------
# round trip, for every valid seed
# ---------------------------------------------------------------------------

identifiers = st.from_regex(r"[a-z0-9_-][a-z0-9_.-]{0,12}", fullmatch=True)
texts = st.text(max_size=16) | st.text(alphabet=" \n\t:#-'\"aé😀\x00?|>!%@`,[]{}~\r.0\x85\u2028", max_size=10)
optional_texts = st.none() | texts
aliases = st.tuples(texts, st.sampled_from("aZ9"), texts).map("".join)  # always has a letter or digit
seeds = st.builds(
    Seed,
    id=identifiers,
    domain=identifiers,
    kind=texts,
    command=optional_texts,
    adapter=optional_texts,
    script=optional_texts,
    provides=st.lists(identifiers, max_size=3).map(tuple),
    aliases=st.lists(aliases, max_size=3).map(tuple),
    rank=st.builds(
        Rank,
        default_priority=st.none() | st.integers(0, 100),
        preferred_for=st.lists(texts, max_size=2).map(tuple),
        avoid_for=st.lists(texts, max_size=2).map(tuple),
        tie_breakers=st.dictionaries(identifiers, texts, max_size=3).map(
            lambda values: MappingProxyType(dict(sorted(values.items())))
        ),
    ),
    evidence=st.lists(
        st.builds(Evidence, source=texts, command=optional_texts, detail=optional_texts), max_size=2
    ).map(tuple),
    auth_env=st.lists(texts, max_size=2).map(tuple),
    risk=st.builds(Risk, st.booleans(), st.booleans()),
    promotion=st.none() | st.builds(Promotion, texts),
    verification=st.none()
    | st.builds(
        Verification,
        st.sampled_from(VerificationStatus),
        st.integers(0, 2**64 - 1),
        st.lists(st.builds(Outcome, texts, st.booleans(), texts), max_size=2).map(tuple),
    ),
)


@pytest.mark.slow
@given(seeds)
def test_parse_of_dump_is_identity(seed: Seed) -> None:
    assert parse_seed(dump_seed(seed), "x.yml") == seed


# ---------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------


def test_seed_json_keeps_serde_order_and_omits_empty_fields() -> None:
    seed = parse_seed(SEED_001_EXAMPLE_YAML, "x.yml")
    as_json = seed_to_json(seed)
    assert list(as_json) == [
        "id",
        "domain",
        "kind",
        "command",
        "provides",
        "aliases",
        "rank",
        "evidence",
        "auth",
        "risk",
        "promotion",
    ]
    assert as_json["rank"] == {
        "default_priority": 80,
        "preferred_for": ["text_to_speech"],
        "tie_breakers": {"quality": "high"},
    }
    assert list(as_json["rank"]) == ["default_priority", "preferred_for", "tie_breakers"]
    assert as_json["evidence"] == [{"source": "cli_help", "command": "voice-cli --help"}]
    assert as_json["auth"] == {"env": ["VOICE_PROVIDER_API_KEY"]}
    assert as_json["risk"] == {"external_service": True, "may_cost_money": True}
    assert as_json["promotion"] == {"suggested_skill_id": "voice.provider"}


def test_minimal_seed_json_has_only_required_fields() -> None:
    assert seed_to_json(Seed(id="a", domain="d", kind="")) == {"id": "a", "domain": "d", "kind": ""}


def test_seed_json_verification_and_single_risk_flag() -> None:
    seed = Seed(
        id="a",
        domain="d",
        kind="cli",
        evidence=(Evidence(source="note", detail="manual"),),
        risk=Risk(external_service=True),
        verification=Verification(VerificationStatus.FAILED, 7, (Outcome("evidence", False, "none"),)),
    )
    as_json = seed_to_json(seed)
    assert as_json["evidence"] == [{"source": "note", "detail": "manual"}]
    assert as_json["risk"] == {"external_service": True}
    assert as_json["verification"] == {
        "status": "failed",
        "verified_at_unix": 7,
        "outcomes": [{"check": "evidence", "ok": False, "message": "none"}],
    }
    assert json.loads(json.dumps(as_json)) == as_json
