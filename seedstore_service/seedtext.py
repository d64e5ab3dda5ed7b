"""Seed values as text, without YAML: identifiers, canonical forms, revisions, the JSON seed object.

Pure and cheap to import (no YAML library): the CLI's read commands, ranking and
the persisted index use these; `seedfile` re-exports them beside the YAML reader
and writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from agentsidecar.seedstore_service.errors import InvalidIdentifier, excerpt
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
from agentsidecar.seedstore_service.names import MAX_IDENTIFIER_LENGTH, canonical, identifier_chars_ok

MAX_PRIORITY = 100
# The largest seed file read, and the most a file's YAML may expand to once
# aliases are followed (characters of every scalar plus one per node).
# SkillSpec seeds are a few hundred bytes; a bigger file is a Problem, never parsed.
MAX_SEED_FILE_BYTES = 1024 * 1024

# ---------------------------------------------------------------------------
# Identifiers and canonical text (docs/skillspec-compatibility.md)
# ---------------------------------------------------------------------------
# The rules themselves are names.py's (`canonical` is re-exported from here).


def validate_identifier(value: str, field: str) -> str:
    """Apply SkillSpec's only path-traversal guard, plus a length limit; return the value unchanged.

    Raises:
        InvalidIdentifier: empty, starts with `.`, holds `/` or `\\`, uses a char outside `[a-z0-9_.-]`,
            or is longer than MAX_IDENTIFIER_LENGTH.
    """
    if not identifier_chars_ok(value):
        raise InvalidIdentifier(value, field)
    if len(value) > MAX_IDENTIFIER_LENGTH:
        raise InvalidIdentifier(value, field, f"longer than {MAX_IDENTIFIER_LENGTH} characters")
    return value


def text_matches(text: str, capability: str) -> bool:
    """SkillSpec's alias/evidence test: plain substring containment, either way, on canonical forms."""
    text_form = canonical(text)
    capability_form = canonical(capability)
    return capability_form in text_form or text_form in capability_form


def revision_of(data: bytes) -> str:
    """A seed file's revision: the first 16 hex digits of the SHA-256 of its bytes."""
    import hashlib  # here: loading OpenSSL is a cost a read that parses nothing need not pay

    return hashlib.sha256(data).hexdigest()[:16]


def inert_alias_message(alias: str) -> str:
    """Why a stored alias with no letters or digits never matches (SkillSpec lets it match every search)."""
    return f'alias "{excerpt(alias)}" has no letters or digits, so it never matches'


def empty_alias_message(alias: str) -> str:
    """Why an alias with no letters or digits is refused (SkillSpec lets it match every search)."""
    return f'alias "{excerpt(alias)}" has no letters or digits, so it would match every capability'


# ---------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------


def _tie_breakers_json(ties: Mapping[str, str]) -> dict[str, str]:
    return dict(sorted(ties.items()))


def seed_to_json(seed: Seed) -> dict[str, Any]:
    """The seed object SkillSpec prints (add, update, prefer, inspect): serde order, empty fields absent."""
    result: dict[str, Any] = {"id": seed.id, "domain": seed.domain, "kind": seed.kind}
    for name, optional in (("command", seed.command), ("adapter", seed.adapter), ("script", seed.script)):
        if optional is not None:
            result[name] = optional
    if seed.provides:
        result["provides"] = list(seed.provides)
    if seed.aliases:
        result["aliases"] = list(seed.aliases)
    if not seed.rank.is_empty():
        rank: dict[str, Any] = {}
        if seed.rank.default_priority is not None:
            rank["default_priority"] = seed.rank.default_priority
        if seed.rank.preferred_for:
            rank["preferred_for"] = list(seed.rank.preferred_for)
        if seed.rank.avoid_for:
            rank["avoid_for"] = list(seed.rank.avoid_for)
        if seed.rank.tie_breakers:
            rank["tie_breakers"] = _tie_breakers_json(seed.rank.tie_breakers)
        result["rank"] = rank
    if seed.evidence:
        evidence = []
        for entry in seed.evidence:
            item: dict[str, Any] = {"source": entry.source}
            if entry.command is not None:
                item["command"] = entry.command
            if entry.detail is not None:
                item["detail"] = entry.detail
            evidence.append(item)
        result["evidence"] = evidence
    if seed.auth_env:
        result["auth"] = {"env": list(seed.auth_env)}
    if seed.risk.external_service or seed.risk.may_cost_money:
        risk: dict[str, Any] = {}
        if seed.risk.external_service:
            risk["external_service"] = True
        if seed.risk.may_cost_money:
            risk["may_cost_money"] = True
        result["risk"] = risk
    if seed.promotion is not None:
        result["promotion"] = {"suggested_skill_id": seed.promotion.suggested_skill_id}
    if seed.verification is not None:
        verification: dict[str, Any] = {
            "status": seed.verification.status.value,
            "verified_at_unix": seed.verification.verified_at_unix,
        }
        if seed.verification.outcomes:
            verification["outcomes"] = [
                {"check": outcome.check, "ok": outcome.ok, "message": outcome.message}
                for outcome in seed.verification.outcomes
            ]
        result["verification"] = verification
    return result


def _strings(values: Any) -> tuple[str, ...]:
    return tuple(values) if values else ()


def seed_from_json(value: Mapping[str, Any]) -> Seed:
    """The Seed `seed_to_json` printed as `value`: its exact inverse, for objects it produced.

    No validation: the persisted index stores only objects made by `seed_to_json` from
    seeds that passed the loader's checks (see `persisted.py` for how a stored object is checked).
    """
    rank = value.get("rank")
    risk = value.get("risk")
    promotion = value.get("promotion")
    verification = value.get("verification")
    return Seed(
        id=value["id"],
        domain=value["domain"],
        kind=value["kind"],
        command=value.get("command"),
        adapter=value.get("adapter"),
        script=value.get("script"),
        provides=_strings(value.get("provides")),
        aliases=_strings(value.get("aliases")),
        rank=Rank(
            default_priority=rank.get("default_priority"),
            preferred_for=_strings(rank.get("preferred_for")),
            avoid_for=_strings(rank.get("avoid_for")),
            tie_breakers=MappingProxyType(dict(rank.get("tie_breakers") or {})),
        )
        if rank
        else Rank(),
        evidence=tuple(
            Evidence(source=item["source"], command=item.get("command"), detail=item.get("detail"))
            for item in value.get("evidence") or ()
        ),
        auth_env=_strings((value.get("auth") or {}).get("env")),
        risk=Risk(
            external_service=bool(risk.get("external_service")),
            may_cost_money=bool(risk.get("may_cost_money")),
        )
        if risk
        else Risk(),
        promotion=Promotion(promotion["suggested_skill_id"]) if promotion is not None else None,
        verification=Verification(
            status=VerificationStatus(verification["status"]),
            verified_at_unix=verification["verified_at_unix"],
            outcomes=tuple(
                Outcome(check=item["check"], ok=item["ok"], message=item["message"])
                for item in verification.get("outcomes") or ()
            ),
        )
        if verification is not None
        else None,
    )
