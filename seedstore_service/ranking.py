"""Deterministic seed ranking, the ask policy and the gate rule (docs/ranking-and-gates.md).

Pure: seeds and a query in, ranked candidates with reasons out. `search` is the
plain linear reference; the index keeps a `PreparedSeed` per file (canonical
forms computed once) and calls `score_prepared` and `finish_search` only on the
seeds its lookups narrowed down, so its results must equal `search`'s.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from agentsidecar.seedstore_service.model import Seed, VerificationStatus
from agentsidecar.seedstore_service.seedtext import canonical, validate_identifier
from agentsidecar.sidecar_runtime.wire_names import Gate, Risk

__all__ = [
    "ASK_REASON",
    "ASK_WITHIN_POINTS",
    "SELECTION_POLICY",
    "PreparedSeed",
    "RankedCandidate",
    "SearchQuery",
    "SearchResult",
    "could_match",
    "finish_search",
    "match_keys",
    "prepare_seed",
    "score_prepared",
    "score_seed",
    "search",
    "seed_gates",
    "seed_risks",
    "validate_query",
]

SELECTION_POLICY = "highest_score_after_constraints"
# The ask policy: when the top two candidates score within ASK_WITHIN_POINTS of each
# other nothing is selected and the caller chooses. Searches send the window
# (`ask_window_points`) so that no caller keeps a copy of it.
ASK_WITHIN_POINTS = 10
ASK_REASON = f"top_candidates_within_{ASK_WITHIN_POINTS}_points"

DIRECT_MATCH_POINTS = 40
TEXT_MATCH_POINTS = 15
VERIFIED_POINTS = 25
UNVERIFIED_POINTS = -20
PREFERRED_FOR_POINTS = 10
AVOID_FOR_POINTS = -30
PREFERRED_SEED_POINTS = 100
LOCAL_ONLY_POINTS = 20
RISK_POINTS = -10


@dataclass(frozen=True, slots=True)
class SearchQuery:
    capability: str
    domain: str | None = None
    local_only: bool = False
    preferred_seed: str | None = None


@dataclass(frozen=True, slots=True)
class RankedCandidate:
    id: str
    domain: str
    path: str
    score: int
    reasons: tuple[str, ...]
    risks: tuple[str, ...]
    required_gates: tuple[str, ...]
    # Set only by broadening: the related term and domain whose search found this seed.
    matched_capability: str = ""
    matched_domain: str = ""


@dataclass(frozen=True, slots=True)
class SearchResult:
    capability: str  # the caller's raw text, echoed
    domain: str | None
    selected: str | None
    ask_policy: str | None  # the reason, when the caller must choose
    candidates: tuple[RankedCandidate, ...]


def validate_query(query: SearchQuery) -> None:
    """SkillSpec step 1: capability, domain and preferred seed follow the identifier rule.

    Raises:
        InvalidIdentifier: labelled "capability", "domain" or "preferred seed".
    """
    validate_identifier(query.capability, "capability")
    if query.domain is not None:
        validate_identifier(query.domain, "domain")
    if query.preferred_seed is not None:
        validate_identifier(query.preferred_seed, "preferred seed")


def seed_risks(seed: Seed) -> tuple[str, ...]:
    """The seed's risk names (`Risk` values), external service first."""
    risks = []
    if seed.risk.external_service:
        risks.append(Risk.EXTERNAL_SERVICE.value)
    if seed.risk.may_cost_money:
        risks.append(Risk.MAY_COST_MONEY.value)
    return tuple(risks)


def seed_gates(seed: Seed) -> tuple[str, ...]:
    """The gates (`Gate` values) a caller approves before using the seed, whatever the search's flags.

    The one gate rule of the pair (docs/ranking-and-gates.md): paid use needs
    provider_cost_approval, an outside service external_service_approval, and
    any `auth_env` secret_use_approval; listed in `Gate`'s order. Search
    candidates and InspectSeed both carry its result, and the negotiator
    gates a run on what they carry.
    """
    gates = []
    if seed.risk.may_cost_money:
        gates.append(Gate.PROVIDER_COST_APPROVAL.value)
    if seed.risk.external_service:
        gates.append(Gate.EXTERNAL_SERVICE_APPROVAL.value)
    if seed.auth_env:
        gates.append(Gate.SECRET_USE_APPROVAL.value)
    return tuple(gates)


def score_seed(seed: Seed, path: str, query: SearchQuery) -> RankedCandidate | None:
    """Score one seed for the query, or None when SkillSpec would exclude it.

    Excluded: verification failed; no provides, alias or evidence match; external
    under local-only. Components are added, and their reasons appended, in SkillSpec's order.
    """
    return score_prepared(prepare_seed(seed, path), canonical(query.capability), query)


@dataclass(frozen=True, slots=True)
class PreparedSeed:
    """A seed with everything scoring compares computed once: canonical forms, risks, gates."""

    seed: Seed
    path: str
    provides: frozenset[str]
    # Canonical aliases and evidence command/detail texts.
    texts: frozenset[str]
    preferred_for: frozenset[str]
    avoid_for: frozenset[str]
    risks: tuple[str, ...]
    required_gates: tuple[str, ...]


_NOTHING: frozenset[str] = frozenset()


def _canonical_set(values: Iterable[str]) -> frozenset[str]:
    # An index holds four of these per seed, and most seeds leave preferred_for and
    # avoid_for empty: share one empty set rather than keep 216 bytes apiece.
    return frozenset(canonical(value) for value in values) or _NOTHING


def match_keys(seed: Seed) -> tuple[frozenset[str], frozenset[str]]:
    """The canonical `provides` entries and alias/evidence texts a search compares."""
    texts = {canonical(alias) for alias in seed.aliases}
    for entry in seed.evidence:
        for text in (entry.command, entry.detail):
            if text is not None:
                texts.add(canonical(text))
    # A text with no letters or digits is inert: SkillSpec's substring test would let it
    # match every capability.
    texts.discard("")
    return _canonical_set(seed.provides), frozenset(texts) or _NOTHING


def could_match(provides: Collection[str], texts: Iterable[str], requested: str) -> bool:
    """Whether `score_prepared` can score a seed with these keys (status and risk aside)."""
    return requested in provides or any(requested in text or text in requested for text in texts)


def prepare_seed(seed: Seed, path: str) -> PreparedSeed:
    provides, texts = match_keys(seed)
    return PreparedSeed(
        seed=seed,
        path=path,
        provides=provides,
        texts=texts,
        preferred_for=_canonical_set(seed.rank.preferred_for),
        avoid_for=_canonical_set(seed.rank.avoid_for),
        risks=seed_risks(seed),
        required_gates=seed_gates(seed),
    )


def score_prepared(prepared: PreparedSeed, requested: str, query: SearchQuery) -> RankedCandidate | None:
    """Score a prepared seed, given `requested = canonical(query.capability)`.

    The one implementation of the scoring arithmetic: `score_seed` prepares and calls
    it, the index calls it with forms prepared once per file. An alias or
    evidence text matches by substring containment either way, so short texts
    match widely (SkillSpec's quirk); empty ones were left out by `prepare_seed`.
    """
    seed = prepared.seed
    status = seed.verification_status
    if status is VerificationStatus.FAILED:
        return None
    score = 0
    reasons: list[str] = []

    if requested in prepared.provides:
        score += DIRECT_MATCH_POINTS
        reasons.append(f"direct provides match: {query.capability}")
    elif any(requested in text or text in requested for text in prepared.texts):
        score += TEXT_MATCH_POINTS
        reasons.append("alias or evidence text match")
    else:
        return None

    if status is VerificationStatus.VERIFIED:
        score += VERIFIED_POINTS
        reasons.append("verified evidence")
    else:
        score += UNVERIFIED_POINTS
        reasons.append("missing verification")

    if requested in prepared.preferred_for:
        score += PREFERRED_FOR_POINTS
        reasons.append(f"preferred_for {query.capability}")
    if requested in prepared.avoid_for:
        score += AVOID_FOR_POINTS
        reasons.append(f"avoid_for {query.capability}")

    priority = seed.rank.default_priority
    if priority is not None:
        bonus = priority // 10
        score += bonus
        reasons.append(f"rank.default_priority {priority} -> +{bonus}")

    if query.preferred_seed is not None and query.preferred_seed == seed.id:
        score += PREFERRED_SEED_POINTS
        reasons.append("explicit preferred seed")

    if query.local_only:
        if seed.risk.external_service:
            return None
        score += LOCAL_ONLY_POINTS
        reasons.append("local-only constraint satisfied")
    elif seed.risk.external_service or seed.risk.may_cost_money:
        score += RISK_POINTS
        reasons.append("external or paid risk requires gate")

    return RankedCandidate(
        id=seed.id,
        domain=seed.domain,
        path=prepared.path,
        score=score,
        reasons=tuple(reasons),
        risks=prepared.risks,
        required_gates=prepared.required_gates,
    )


def _rank_key(candidate: RankedCandidate) -> tuple[int, str, str, str]:
    # Code-point order of str equals the byte order of its UTF-8, which is what SkillSpec sorts by.
    # The path is our addition: `x.yml` and `x.yaml` in one domain would otherwise keep the order
    # in which the files happened to be read.
    return (-candidate.score, candidate.id, candidate.domain, candidate.path)


def finish_search(candidates: Iterable[RankedCandidate], query: SearchQuery) -> SearchResult:
    """Order candidates (score desc, id, domain, then path) and apply the selection and ask policy."""
    ordered = tuple(sorted(candidates, key=_rank_key))
    ask_policy: str | None = None
    selected: str | None = None
    if len(ordered) >= 2 and ordered[0].score - ordered[1].score <= ASK_WITHIN_POINTS:
        ask_policy = ASK_REASON
    elif ordered:
        selected = ordered[0].id
    return SearchResult(
        capability=query.capability,
        domain=query.domain,
        selected=selected,
        ask_policy=ask_policy,
        candidates=ordered,
    )


def search(seeds: Iterable[tuple[Seed, str]], query: SearchQuery) -> SearchResult:
    """The linear reference: score every (seed, path) of the scope, then finish.

    The query is not validated here; the shell calls `validate_query` first.
    """
    scored = (score_seed(seed, path, query) for seed, path in seeds)
    return finish_search((candidate for candidate in scored if candidate is not None), query)
