"""The JSON objects the CLI prints, key for key in SkillSpec's order.

The shapes: docs/skillspec-compatibility.md, "CLI output shapes".

Pure: core values in, plain dicts out (the CLI prints them with
`json.dumps(indent=2, ensure_ascii=False)`). Additions to SkillSpec's shapes are
appended so its readers keep working: `revision` (list rows, inspect), `problems`
(only when a file in scope could not be used) and `broadening` (only when asked for).
"""

from __future__ import annotations

from operator import attrgetter

from agentsidecar.seedstore_service.scoring import SELECTION_POLICY

# Nothing else at run time: the read commands answer from the persisted index one process per
# call (quickread.py) and build their objects here, so this module imports no model class.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any

    from agentsidecar.seedstore_service.broadening import Broadening
    from agentsidecar.seedstore_service.model import (
        ListedSeed,
        Outcome,
        ProblemLike,
        Seed,
        VerificationStatus,
    )
    from agentsidecar.seedstore_service.ranking import RankedCandidate, SearchResult

__all__ = [
    "SCAN_MESSAGE",
    "candidate_json",
    "inspect_json",
    "list_json",
    "list_row_json",
    "listing_json",
    "remove_json",
    "scan_json",
    "search_json",
    "search_result_json",
    "store_json",
    "verify_json",
    "written_json",
]

SCAN_MESSAGE = (
    "no scan providers are configured; use `skillspec capability add` to seed an installed CLI or adapter"
)
STATUS_WRITTEN = "written"
STATUS_UPDATED = "updated"


def _with_problems(result: dict[str, Any], problems: Sequence[ProblemLike]) -> dict[str, Any]:
    if problems:
        result["problems"] = [
            {"path": problem.path, "line": problem.line, "reason": problem.reason} for problem in problems
        ]
    return result


def store_json(seed_store: str) -> dict[str, Any]:
    return {"seed_store": seed_store}


def written_json(
    seed_store: str, seed: Seed, path: str, status: str, *, problems: Sequence[ProblemLike] = ()
) -> dict[str, Any]:
    """add (`status="written"`), update and prefer (`"updated"`)."""
    from agentsidecar.seedstore_service.seedtext import seed_to_json

    result = {
        "seed_store": seed_store,
        "id": seed.id,
        "domain": seed.domain,
        "path": path,
        "status": status,
        "seed": seed_to_json(seed),
    }
    return _with_problems(result, problems)


def list_row_json(
    seed_id: str,
    domain: str,
    kind: str,
    path: str,
    provides: Iterable[str],
    status: str,
    risks: Iterable[str],
    revision: str,
) -> dict[str, Any]:
    """One row of `list`; `status` is the `VerificationStatus` value."""
    return {
        "id": seed_id,
        "domain": domain,
        "kind": kind,
        "path": path,
        "provides": list(provides),
        "verification_status": status,
        "risk": list(risks),
        "revision": revision,
    }


def listing_json(
    seed_store: str, domain: str | None, rows: list[dict[str, Any]], problems: Sequence[ProblemLike]
) -> dict[str, Any]:
    """The `list` object of rows already in its order (domain, then id, then path)."""
    return _with_problems({"seed_store": seed_store, "domain": domain, "seeds": rows}, problems)


def list_json(
    seed_store: str, domain: str | None, entries: Iterable[ListedSeed], problems: Sequence[ProblemLike]
) -> dict[str, Any]:
    """Rows sorted by domain, then id (then path, so two files holding one id keep a fixed order)."""
    rows = [
        list_row_json(
            entry.id,
            entry.domain,
            entry.kind,
            entry.path,
            entry.provides,
            entry.verification_status.value,
            entry.risks,
            entry.revision,
        )
        for entry in sorted(entries, key=attrgetter("domain", "id", "path"))
    ]
    return listing_json(seed_store, domain, rows, problems)


def inspect_json(
    seed_store: str, path: str, revision: str, seed: dict[str, Any], problems: Sequence[ProblemLike]
) -> dict[str, Any]:
    """`seed`: the seed's JSON object (`seedtext.seed_to_json`)."""
    result = {"seed_store": seed_store, "path": path, "revision": revision, "seed": seed}
    return _with_problems(result, problems)


def candidate_json(
    seed_id: str,
    domain: str,
    path: str,
    points: int,
    reasons: Iterable[str],
    risks: Iterable[str],
    required_gates: Iterable[str],
) -> dict[str, Any]:
    """One search candidate, without broadening's provenance keys."""
    return {
        "id": seed_id,
        "domain": domain,
        "path": path,
        "score": points,
        "status": "candidate",
        "reasons": list(reasons),
        "risk": list(risks),
        "required_gates": list(required_gates),
    }


def _candidate_json(candidate: RankedCandidate, with_provenance: bool) -> dict[str, Any]:
    result = candidate_json(
        candidate.id,
        candidate.domain,
        candidate.path,
        candidate.score,
        candidate.reasons,
        candidate.risks,
        candidate.required_gates,
    )
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


def search_result_json(
    seed_store: str,
    capability: str,
    domain: str | None,
    selected: str | None,
    ask_policy: str | None,
    candidates: list[dict[str, Any]],
    problems: Sequence[ProblemLike],
) -> dict[str, Any]:
    """SkillSpec's search object of candidates already in rank order; `ask_policy` only when it applies."""
    output: dict[str, Any] = {
        "domain": domain,
        "capability": capability,
        "seed_store": seed_store,
        "selected": selected,
        "selection_policy": SELECTION_POLICY,
    }
    if ask_policy is not None:
        output["ask_policy"] = {"reason": ask_policy}
    output["candidates"] = candidates
    return _with_problems(output, problems)


def search_json(
    seed_store: str, result: SearchResult, broadening: Broadening | None, problems: Sequence[ProblemLike]
) -> dict[str, Any]:
    """SkillSpec's search object; `broadening` (when asked for) before `problems`."""
    candidates = [
        _candidate_json(candidate, with_provenance=broadening is not None) for candidate in result.candidates
    ]
    output = search_result_json(
        seed_store, result.capability, result.domain, result.selected, result.ask_policy, candidates, ()
    )
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
    problems: Sequence[ProblemLike] = (),
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
    problems: Sequence[ProblemLike] = (),
) -> dict[str, Any]:
    """No `domain` key, as in SkillSpec."""
    return _with_problems({"seed_store": seed_store, "id": id, "path": path, "removed": True}, problems)


def scan_json(seed_store: str) -> dict[str, Any]:
    return {"seed_store": seed_store, "proposals": [], "message": SCAN_MESSAGE}


# The keys of a `list` row, in the order `list_json` writes them.
