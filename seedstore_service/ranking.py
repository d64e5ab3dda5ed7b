"""Deterministic seed ranking, the ask policy and the gate rule (docs/ranking-and-gates.md).

Pure: seeds and a query in, ranked candidates with reasons out. `search` is the
plain linear reference; the index keeps a `PreparedSeed` per file (canonical
forms computed once) and calls `score_prepared` and `finish_search` only on the
seeds its lookups narrowed down, so its results must equal `search`'s.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from agentsidecar.seedstore_service.model import Seed
from agentsidecar.seedstore_service.names import canonical
from agentsidecar.seedstore_service.scoring import (
    ASK_REASON,
    ASK_WITHIN_POINTS,
    SELECTION_POLICY,
    could_match,
    rank_key,
    score,
    select,
)
from agentsidecar.seedstore_service.seedtext import validate_identifier
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
    "rank_keys",
    "score_prepared",
    "score_seed",
    "search",
    "seed_gates",
    "seed_risks",
    "validate_query",
]


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


def rank_keys(seed: Seed) -> tuple[frozenset[str], frozenset[str]]:
    """The canonical `rank.preferred_for` and `rank.avoid_for` entries a search compares."""
    return _canonical_set(seed.rank.preferred_for), _canonical_set(seed.rank.avoid_for)


def prepare_seed(seed: Seed, path: str) -> PreparedSeed:
    provides, texts = match_keys(seed)
    preferred_for, avoid_for = rank_keys(seed)
    return PreparedSeed(
        seed=seed,
        path=path,
        provides=provides,
        texts=texts,
        preferred_for=preferred_for,
        avoid_for=avoid_for,
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
    return score_inputs(
        requested,
        query,
        ScoreInputs(
            seed_id=seed.id,
            domain=seed.domain,
            path=prepared.path,
            status=seed.verification_status.value,
            provides=prepared.provides,
            texts=prepared.texts,
            preferred_for=prepared.preferred_for,
            avoid_for=prepared.avoid_for,
            priority=seed.rank.default_priority,
            external_service=seed.risk.external_service,
            may_cost_money=seed.risk.may_cost_money,
            risks=prepared.risks,
            required_gates=prepared.required_gates,
        ),
    )


class ScoreInputs(NamedTuple):
    """What scoring reads of one seed: a `PreparedSeed`'s forms, or the persisted index's
    columns for it (its search keys, rank inputs and `list` row), which hold the same values."""

    seed_id: str
    domain: str
    path: str
    status: str
    provides: Collection[str]
    texts: Collection[str]
    preferred_for: Collection[str]
    avoid_for: Collection[str]
    priority: int | None
    external_service: bool
    may_cost_money: bool
    risks: Sequence[str]
    required_gates: Sequence[str]


def score_inputs(requested: str, query: SearchQuery, inputs: ScoreInputs) -> RankedCandidate | None:
    """`score_prepared` of a seed known by its `ScoreInputs` alone."""
    scored = score(
        requested,
        query.capability,
        seed_id=inputs.seed_id,
        status=inputs.status,
        provides=inputs.provides,
        texts=inputs.texts,
        preferred_for=inputs.preferred_for,
        avoid_for=inputs.avoid_for,
        priority=inputs.priority,
        external_service=inputs.external_service,
        may_cost_money=inputs.may_cost_money,
        preferred_seed=query.preferred_seed,
        local_only=query.local_only,
    )
    if scored is None:
        return None
    points, reasons = scored
    return RankedCandidate(
        id=inputs.seed_id,
        domain=inputs.domain,
        path=inputs.path,
        score=points,
        reasons=tuple(reasons),
        risks=tuple(inputs.risks),
        required_gates=tuple(inputs.required_gates),
    )


def _rank_key(candidate: RankedCandidate) -> tuple[int, str, str, str]:
    return rank_key(candidate.score, candidate.id, candidate.domain, candidate.path)


def finish_search(candidates: Iterable[RankedCandidate], query: SearchQuery) -> SearchResult:
    """Order candidates (score desc, id, domain, then path) and apply the selection and ask policy."""
    ordered = tuple(sorted(candidates, key=_rank_key))
    selected, ask_policy = select([(candidate.id, candidate.score) for candidate in ordered])
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
