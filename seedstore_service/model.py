"""Seed values: the SkillSpec capability-seed schema as frozen dataclasses.

Field order is the SkillSpec (serde) struct order; it decides the key order of
both the YAML files and the JSON output. Empty fields are represented by
None / () / empty mappings and are omitted on output (see `seedfile.py`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol


class VerificationStatus(enum.Enum):
    """A seed's verification state; a seed with no block is UNVERIFIED."""

    VERIFIED = "verified"
    FAILED = "failed"
    UNVERIFIED = "unverified"


@dataclass(frozen=True, slots=True)
class Rank:
    default_priority: int | None = None
    preferred_for: tuple[str, ...] = ()
    avoid_for: tuple[str, ...] = ()
    # Written sorted by key (serde BTreeMap); never read by ranking.
    tie_breakers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def is_empty(self) -> bool:
        return (
            self.default_priority is None
            and not self.preferred_for
            and not self.avoid_for
            and not self.tie_breakers
        )


@dataclass(frozen=True, slots=True)
class Evidence:
    source: str
    command: str | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Risk:
    external_service: bool = False
    may_cost_money: bool = False


@dataclass(frozen=True, slots=True)
class Promotion:
    suggested_skill_id: str


@dataclass(frozen=True, slots=True)
class Outcome:
    check: str
    ok: bool
    message: str


@dataclass(frozen=True, slots=True)
class Verification:
    status: VerificationStatus
    verified_at_unix: int
    outcomes: tuple[Outcome, ...] = ()


@dataclass(frozen=True, slots=True)
class Seed:
    id: str
    domain: str
    kind: str
    command: str | None = None
    adapter: str | None = None
    script: str | None = None
    provides: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    rank: Rank = field(default_factory=Rank)
    evidence: tuple[Evidence, ...] = ()
    auth_env: tuple[str, ...] = ()  # YAML: auth.env
    risk: Risk = field(default_factory=Risk)
    promotion: Promotion | None = None
    verification: Verification | None = None

    @property
    def verification_status(self) -> VerificationStatus:
        if self.verification is None:
            return VerificationStatus.UNVERIFIED
        return self.verification.status


@dataclass(frozen=True, slots=True)
class Problem:
    """A file that could not be used; reported, never fatal, never overwritten."""

    path: str
    line: int  # 1-based; 0 when unknown
    reason: str


class ProblemLike(Protocol):
    """What render and the warnings read of a problem: a Problem, its proto (common.v1.Problem),
    or quickread's, made without this module."""

    @property
    def path(self) -> str: ...
    @property
    def line(self) -> int: ...
    @property
    def reason(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ListedSeed:
    """One row of `list`: SkillSpec's summary fields plus the file's revision."""

    id: str
    domain: str
    kind: str
    path: str
    provides: tuple[str, ...]
    verification_status: VerificationStatus
    risks: tuple[str, ...]  # subset of ("external_service", "may_cost_money"), in that order
    revision: str
