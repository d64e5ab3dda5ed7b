"""The scoring arithmetic and the selection rule of a seed search (docs/ranking-and-gates.md).

Pure, on plain values, and imports nothing: ranking.py scores `PreparedSeed`s
through `score`, and the read commands that answer from the persisted index
(quickread.py) score its entries through it too, so both rank with one rule.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

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

# `VerificationStatus` values (model.py), compared as text here.
_FAILED = "failed"
_VERIFIED = "verified"


def could_match(provides: Collection[str], texts: Collection[str], requested: str) -> bool:
    """Whether `score` can score a seed with these keys (status and risk aside)."""
    return requested in provides or any(requested in text or text in requested for text in texts)


def score(
    requested: str,
    capability: str,
    *,
    seed_id: str,
    status: str,
    provides: Collection[str],
    texts: Collection[str],
    preferred_for: Collection[str],
    avoid_for: Collection[str],
    priority: int | None,
    external_service: bool,
    may_cost_money: bool,
    preferred_seed: str | None,
    local_only: bool,
) -> tuple[int, list[str]] | None:
    """The score and its reasons of one seed, or None when SkillSpec would exclude it.

    `requested` is `names.canonical(capability)`; `provides`, `texts` (aliases and
    evidence command/detail texts), `preferred_for` and `avoid_for` are canonical
    forms, empty texts left out. Excluded: verification failed; no provides, alias or
    evidence match; an external service under local-only. Components are added, and
    their reasons appended, in SkillSpec's order. An alias or evidence text matches
    by substring containment either way, so short texts match widely (SkillSpec's quirk).
    """
    if status == _FAILED:
        return None
    points = 0
    reasons: list[str] = []

    if requested in provides:
        points += DIRECT_MATCH_POINTS
        reasons.append(f"direct provides match: {capability}")
    elif any(requested in text or text in requested for text in texts):
        points += TEXT_MATCH_POINTS
        reasons.append("alias or evidence text match")
    else:
        return None

    if status == _VERIFIED:
        points += VERIFIED_POINTS
        reasons.append("verified evidence")
    else:
        points += UNVERIFIED_POINTS
        reasons.append("missing verification")

    if requested in preferred_for:
        points += PREFERRED_FOR_POINTS
        reasons.append(f"preferred_for {capability}")
    if requested in avoid_for:
        points += AVOID_FOR_POINTS
        reasons.append(f"avoid_for {capability}")

    if priority is not None:
        bonus = priority // 10
        points += bonus
        reasons.append(f"rank.default_priority {priority} -> +{bonus}")

    if preferred_seed is not None and preferred_seed == seed_id:
        points += PREFERRED_SEED_POINTS
        reasons.append("explicit preferred seed")

    if local_only:
        if external_service:
            return None
        points += LOCAL_ONLY_POINTS
        reasons.append("local-only constraint satisfied")
    elif external_service or may_cost_money:
        points += RISK_POINTS
        reasons.append("external or paid risk requires gate")
    return points, reasons


def rank_key(points: int, seed_id: str, domain: str, path: str) -> tuple[int, str, str, str]:
    """Score descending, then id, domain and path.

    Code-point order of str equals the byte order of its UTF-8, which is what SkillSpec
    sorts by. The path is our addition: `x.yml` and `x.yaml` in one domain would
    otherwise keep the order in which the files happened to be read.
    """
    return (-points, seed_id, domain, path)


def select(ordered: Sequence[tuple[str, int]]) -> tuple[str | None, str | None]:
    """(selected id, ask-policy reason) of candidates' (id, score) in rank order: the top one,
    unless the top two are within ASK_WITHIN_POINTS, when nothing is selected and the caller asks."""
    if len(ordered) >= 2 and ordered[0][1] - ordered[1][1] <= ASK_WITHIN_POINTS:
        return None, ASK_REASON
    if ordered:
        return ordered[0][0], None
    return None, None
