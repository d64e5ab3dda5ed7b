"""JSON output shapes: exact keys, exact order, documented additions (docs/skillspec-compatibility.md)."""

from __future__ import annotations

import json

from agentsidecar.seedstore_service.broadening import Broadening, BroadeningAttempt, broaden, builtin_table
from agentsidecar.seedstore_service.model import (
    Evidence,
    ListedSeed,
    Outcome,
    Problem,
    Rank,
    Risk,
    Seed,
    Verification,
    VerificationStatus,
)
from agentsidecar.seedstore_service.ranking import SearchQuery, SearchResult, search
from agentsidecar.seedstore_service.render import (
    inspect_json,
    list_json,
    remove_json,
    scan_json,
    search_json,
    store_json,
    verify_json,
    written_json,
)
from agentsidecar.seedstore_service.seedfile import seed_to_json
from agentsidecar.seedstore_service.store import listed_seed

STORE = "/home/u/.skillspec/capabilities"
PROBLEM = Problem(path=f"{STORE}/voice/bad.yml", line=3, reason='unknown field "colour" at colour (line 3)')

REMOTE = Seed(
    id="remote-voice-cli",
    domain="voice",
    kind="cli",
    command="voice-cli",
    provides=("text_to_speech",),
    rank=Rank(default_priority=80),
    evidence=(Evidence("cli_help", command="voice-cli --help"),),
    auth_env=("VOICE_PROVIDER_API_KEY",),
    risk=Risk(external_service=True, may_cost_money=True),
    verification=Verification(VerificationStatus.VERIFIED, 1),
)
MACOS_SAY = Seed(
    id="macos-say",
    domain="voice",
    kind="cli",
    command="say",
    provides=("text_to_speech",),
    rank=Rank(default_priority=75),
    verification=Verification(VerificationStatus.VERIFIED, 1),
)


def path_of(seed: Seed) -> str:
    return f"{STORE}/{seed.domain}/{seed.id}.yml"


def printed(value: dict[str, object]) -> str:
    """What the CLI prints; also proves the object is JSON-serialisable."""
    return json.dumps(value, indent=2, ensure_ascii=False)


def test_store_and_scan() -> None:
    assert store_json(STORE) == {"seed_store": STORE}
    assert scan_json(STORE) == {
        "seed_store": STORE,
        "proposals": [],
        "message": "no scan providers are configured; "
        "use `skillspec capability add` to seed an installed CLI or adapter",
    }


def test_written_json() -> None:
    result = written_json(STORE, REMOTE, path_of(REMOTE), "written")
    assert list(result) == ["seed_store", "id", "domain", "path", "status", "seed"]
    assert result["status"] == "written"
    assert result["seed"] == seed_to_json(REMOTE)
    assert "problems" not in result
    assert written_json(STORE, REMOTE, path_of(REMOTE), "updated", problems=[PROBLEM])["problems"] == [
        {"path": PROBLEM.path, "line": 3, "reason": PROBLEM.reason}
    ]


def test_list_json_rows_are_sorted_and_end_with_revision() -> None:
    other = Seed(id="zeta", domain="audio", kind="script", risk=Risk(may_cost_money=True))
    entries = [
        listed_seed(REMOTE, path_of(REMOTE), "aaaa"),
        listed_seed(MACOS_SAY, path_of(MACOS_SAY), "bbbb"),
        listed_seed(other, path_of(other), "cccc"),
    ]
    result = list_json(STORE, None, entries, [])
    assert list(result) == ["seed_store", "domain", "seeds"]
    assert result["domain"] is None
    assert result["seeds"] == [
        {
            "id": "zeta",
            "domain": "audio",
            "kind": "script",
            "path": f"{STORE}/audio/zeta.yml",
            "provides": [],
            "verification_status": "unverified",
            "risk": ["may_cost_money"],
            "revision": "cccc",
        },
        {
            "id": "macos-say",
            "domain": "voice",
            "kind": "cli",
            "path": f"{STORE}/voice/macos-say.yml",
            "provides": ["text_to_speech"],
            "verification_status": "verified",
            "risk": [],
            "revision": "bbbb",
        },
        {
            "id": "remote-voice-cli",
            "domain": "voice",
            "kind": "cli",
            "path": f"{STORE}/voice/remote-voice-cli.yml",
            "provides": ["text_to_speech"],
            "verification_status": "verified",
            "risk": ["external_service", "may_cost_money"],
            "revision": "aaaa",
        },
    ]
    assert list(result["seeds"][0]) == [
        "id",
        "domain",
        "kind",
        "path",
        "provides",
        "verification_status",
        "risk",
        "revision",
    ]


def test_list_json_problems_come_last_and_only_when_present() -> None:
    entry = ListedSeed("a", "voice", "cli", "/p", (), VerificationStatus.FAILED, (), "r")
    result = list_json(STORE, "voice", [entry], [PROBLEM])
    assert list(result) == ["seed_store", "domain", "seeds", "problems"]
    assert result["domain"] == "voice"
    assert result["seeds"][0]["verification_status"] == "failed"
    assert result["problems"] == [{"path": PROBLEM.path, "line": 3, "reason": PROBLEM.reason}]


def test_inspect_json() -> None:
    result = inspect_json(STORE, path_of(REMOTE), "0123456789abcdef", seed_to_json(REMOTE), [])
    assert result == {
        "seed_store": STORE,
        "path": path_of(REMOTE),
        "revision": "0123456789abcdef",
        "seed": seed_to_json(REMOTE),
    }
    assert list(result) == ["seed_store", "path", "revision", "seed"]
    assert list(inspect_json(STORE, "/p", "r", seed_to_json(REMOTE), [PROBLEM]))[-1] == "problems"


def two_seed_result(local_only: bool = False) -> SearchResult:
    seeds = [(REMOTE, path_of(REMOTE)), (MACOS_SAY, path_of(MACOS_SAY))]
    return search(seeds, SearchQuery("text_to_speech", domain="voice", local_only=local_only))


def test_search_json_is_skillspecs_shape_exactly() -> None:
    assert printed(search_json(STORE, two_seed_result(), None, [])) == printed(
        {
            "domain": "voice",
            "capability": "text_to_speech",
            "seed_store": STORE,
            "selected": None,
            "selection_policy": "highest_score_after_constraints",
            "ask_policy": {"reason": "top_candidates_within_10_points"},
            "candidates": [
                {
                    "id": "macos-say",
                    "domain": "voice",
                    "path": f"{STORE}/voice/macos-say.yml",
                    "score": 72,
                    "status": "candidate",
                    "reasons": [
                        "direct provides match: text_to_speech",
                        "verified evidence",
                        "rank.default_priority 75 -> +7",
                    ],
                    "risk": [],
                    "required_gates": [],
                },
                {
                    "id": "remote-voice-cli",
                    "domain": "voice",
                    "path": f"{STORE}/voice/remote-voice-cli.yml",
                    "score": 63,
                    "status": "candidate",
                    "reasons": [
                        "direct provides match: text_to_speech",
                        "verified evidence",
                        "rank.default_priority 80 -> +8",
                        "external or paid risk requires gate",
                    ],
                    "risk": ["external_service", "may_cost_money"],
                    "required_gates": [
                        "provider_cost_approval",
                        "external_service_approval",
                        "secret_use_approval",
                    ],
                },
            ],
        }
    )


def test_search_json_without_ask_policy_omits_the_key() -> None:
    result = search_json(STORE, two_seed_result(local_only=True), None, [])
    assert list(result) == [
        "domain",
        "capability",
        "seed_store",
        "selected",
        "selection_policy",
        "candidates",
    ]
    assert result["selected"] == "macos-say"


def test_empty_search_json() -> None:
    empty = SearchResult("speech", None, None, None, ())
    assert search_json(STORE, empty, None, []) == {
        "domain": None,
        "capability": "speech",
        "seed_store": STORE,
        "selected": None,
        "selection_policy": "highest_score_after_constraints",
        "candidates": [],
    }


def test_search_json_with_broadening_and_problems() -> None:
    audio = Seed(
        id="synth",
        domain="audio",
        kind="cli",
        provides=("speech_synthesis",),
        verification=Verification(VerificationStatus.VERIFIED, 1),
    )

    def run(query: SearchQuery) -> SearchResult:
        scope = [(audio, path_of(audio))] if query.domain in (None, "audio") else []
        return search(scope, query)

    query = SearchQuery("text_to_speech")
    result, broadening = broaden(run(query), query, builtin_table(), run)
    output = search_json(STORE, result, broadening, [PROBLEM])
    assert list(output) == [
        "domain",
        "capability",
        "seed_store",
        "selected",
        "selection_policy",
        "candidates",
        "broadening",
        "problems",
    ]
    candidate = output["candidates"][0]
    assert candidate["matched_capability"] == "speech_synthesis"
    assert "matched_domain" not in candidate  # found by a store-wide attempt
    assert list(candidate)[-1] == "matched_capability"
    assert output["capability"] == "text_to_speech"
    assert output["broadening"]["first_search_empty"] is True
    assert output["broadening"]["attempts"][0] == {
        "capability": "text_to_speech",
        "domain": None,
        "found": [],
    }
    assert {"capability": "speech_synthesis", "domain": None, "found": ["audio/synth"]} in output[
        "broadening"
    ]["attempts"]
    assert output["broadening"]["table_sources"] == ["builtin"]
    assert list(output["broadening"]) == [
        "first_search_empty",
        "attempts",
        "fallback_policy",
        "table_sources",
    ]
    printed(output)


def test_search_json_with_broadening_and_a_domain() -> None:
    result = two_seed_result()
    broadening = Broadening(False, (BroadeningAttempt("x", "voice", ("voice/a",)),), "policy", ("builtin",))
    output = search_json(STORE, result, broadening, [])
    assert "matched_capability" not in output["candidates"][0]  # empty provenance is not printed
    assert output["broadening"] == {
        "first_search_empty": False,
        "attempts": [{"capability": "x", "domain": "voice", "found": ["voice/a"]}],
        "fallback_policy": "policy",
        "table_sources": ["builtin"],
    }


def test_verify_json() -> None:
    outcomes = [
        Outcome("path_lookup:voice-cli", True, "voice-cli found on PATH"),
        Outcome("evidence_command:voice-cli --help", False, "evidence command exited with 2"),
    ]
    result = verify_json(
        STORE, "remote-voice-cli", "voice", path_of(REMOTE), VerificationStatus.VERIFIED, outcomes
    )
    assert result == {
        "seed_store": STORE,
        "id": "remote-voice-cli",
        "domain": "voice",
        "path": path_of(REMOTE),
        "status": "verified",
        "outcomes": [
            {"check": "path_lookup:voice-cli", "ok": True, "message": "voice-cli found on PATH"},
            {
                "check": "evidence_command:voice-cli --help",
                "ok": False,
                "message": "evidence command exited with 2",
            },
        ],
    }
    assert list(result) == ["seed_store", "id", "domain", "path", "status", "outcomes"]


def test_remove_json_has_no_domain() -> None:
    result = remove_json(STORE, "macos-say", path_of(MACOS_SAY))
    assert result == {"seed_store": STORE, "id": "macos-say", "path": path_of(MACOS_SAY), "removed": True}
    assert list(result) == ["seed_store", "id", "path", "removed"]


def test_unicode_is_printed_as_is() -> None:
    seed = Seed(id="a", domain="d", kind="cli", aliases=("voix française",))
    assert "voix française" in printed(inspect_json(STORE, "/p", "r", seed_to_json(seed), []))
