"""The JSON objects the CLI prints, key for key in SkillSpec's order.

The shapes: docs/skillspec-compatibility.md, "CLI output shapes".

Pure: core values in, plain dicts out (the CLI prints them with
`json.dumps(indent=2, ensure_ascii=False)`). Additions to SkillSpec's shapes are
appended so its readers keep working: `revision` (list rows, inspect), `problems`
(only when a file in scope could not be used) and `broadening` (only when asked for).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from agentsidecar.seedstore_service.model import ListedSeed, Outcome, Problem, Seed, VerificationStatus
from agentsidecar.seedstore_service.ranking import SELECTION_POLICY, RankedCandidate, SearchResult, seed_risks
from agentsidecar.seedstore_service.seedtext import seed_to_json

if TYPE_CHECKING:
    from agentsidecar.seedstore_service.broadening import Broadening

__all__ = [
    "SCAN_MESSAGE",
    "inspect_json",
    "list_json",
    "listed_seed",
    "remove_json",
    "scan_json",
    "search_json",
    "store_json",
    "verify_json",
    "written_json",
]

SCAN_MESSAGE = (
    "no scan providers are configured; use `skillspec capability add` to seed an installed CLI or adapter"
)
STATUS_WRITTEN = "written"
STATUS_UPDATED = "updated"


def _with_problems(result: dict[str, Any], problems: Sequence[Problem]) -> dict[str, Any]:
    if problems:
        result["problems"] = [
            {"path": problem.path, "line": problem.line, "reason": problem.reason} for problem in problems
        ]
    return result


def store_json(seed_store: str) -> dict[str, Any]:
    return {"seed_store": seed_store}


def written_json(
    seed_store: str, seed: Seed, path: str, status: str, *, problems: Sequence[Problem] = ()
) -> dict[str, Any]:
    """add (`status="written"`), update and prefer (`"updated"`)."""
    result = {
        "seed_store": seed_store,
        "id": seed.id,
        "domain": seed.domain,
        "path": path,
        "status": status,
        "seed": seed_to_json(seed),
    }
    return _with_problems(result, problems)


def listed_seed(seed: Seed, path: str, revision: str) -> ListedSeed:
    return ListedSeed(
        id=seed.id,
        domain=seed.domain,
        kind=seed.kind,
        path=path,
        provides=seed.provides,
        verification_status=seed.verification_status,
        risks=seed_risks(seed),
        revision=revision,
    )


def list_json(
    seed_store: str, domain: str | None, entries: Iterable[ListedSeed], problems: Sequence[Problem]
) -> dict[str, Any]:
    """Rows sorted by domain, then id (then path, so two files holding one id keep a fixed order)."""
    rows = sorted(entries, key=attrgetter("domain", "id", "path"))
    result = {
        "seed_store": seed_store,
        "domain": domain,
        "seeds": [
            {
                "id": entry.id,
                "domain": entry.domain,
                "kind": entry.kind,
                "path": entry.path,
                "provides": list(entry.provides),
                "verification_status": entry.verification_status.value,
                "risk": list(entry.risks),
                "revision": entry.revision,
            }
            for entry in rows
        ],
    }
    return _with_problems(result, problems)


def inspect_json(
    seed_store: str, path: str, revision: str, seed: Seed, problems: Sequence[Problem]
) -> dict[str, Any]:
    result = {"seed_store": seed_store, "path": path, "revision": revision, "seed": seed_to_json(seed)}
    return _with_problems(result, problems)


def _candidate_json(candidate: RankedCandidate, with_provenance: bool) -> dict[str, Any]:
    result: dict[str, Any] = {
        "id": candidate.id,
        "domain": candidate.domain,
        "path": candidate.path,
        "score": candidate.score,
        "status": "candidate",
        "reasons": list(candidate.reasons),
        "risk": list(candidate.risks),
        "required_gates": list(candidate.required_gates),
    }
    if with_provenance:
        if candidate.matched_capability:
            result["matched_capability"] = candidate.matched_capability
        if candidate.matched_domain:
            result["matched_domain"] = candidate.matched_domain
    return result


def _broadening_json(broadening: Broadening) -> dict[str, Any]:
    return {
        "first_search_empty": broadening.first_search_empty,
        "attempts": [
            {"capability": attempt.capability, "domain": attempt.domain, "found": list(attempt.found)}
            for attempt in broadening.attempts
        ],
        "fallback_policy": broadening.fallback_policy,
        "table_sources": list(broadening.table_sources),
    }


def search_json(
    seed_store: str, result: SearchResult, broadening: Broadening | None, problems: Sequence[Problem]
) -> dict[str, Any]:
    """SkillSpec's search object; `ask_policy` only when it applies."""
    output: dict[str, Any] = {
        "domain": result.domain,
        "capability": result.capability,
        "seed_store": seed_store,
        "selected": result.selected,
        "selection_policy": SELECTION_POLICY,
    }
    if result.ask_policy is not None:
        output["ask_policy"] = {"reason": result.ask_policy}
    output["candidates"] = [
        _candidate_json(candidate, with_provenance=broadening is not None) for candidate in result.candidates
    ]
    if broadening is not None:
        output["broadening"] = _broadening_json(broadening)
    return _with_problems(output, problems)


def verify_json(
    seed_store: str,
    id: str,
    domain: str,
    path: str,
    status: VerificationStatus,
    outcomes: Iterable[Outcome],
    *,
    problems: Sequence[Problem] = (),
) -> dict[str, Any]:
    result = {
        "seed_store": seed_store,
        "id": id,
        "domain": domain,
        "path": path,
        "status": status.value,
        "outcomes": [
            {"check": outcome.check, "ok": outcome.ok, "message": outcome.message} for outcome in outcomes
        ],
    }
    return _with_problems(result, problems)


def remove_json(
    seed_store: str,
    id: str,
    path: str,
    *,
    problems: Sequence[Problem] = (),
) -> dict[str, Any]:
    """No `domain` key, as in SkillSpec."""
    return _with_problems({"seed_store": seed_store, "id": id, "path": path, "removed": True}, problems)


def scan_json(seed_store: str) -> dict[str, Any]:
    return {"seed_store": seed_store, "proposals": [], "message": SCAN_MESSAGE}


# The keys of a `list` row, in the order `list_json` writes them.
