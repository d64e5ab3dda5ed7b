"""Seed mutations: `add` builds a whole seed, `update` patches one in a fixed order, `prefer`.

Pure: values in, a new Seed out; `now_unix` comes from the shell. The flow the
shell follows is SkillSpec's: validate, load, patch, write; any error aborts first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from agentsidecar.seedstore_service.errors import InvalidArgument
from agentsidecar.seedstore_service.model import (
    Evidence,
    Promotion,
    Rank,
    Risk,
    Seed,
    Verification,
    VerificationStatus,
)
from agentsidecar.seedstore_service.names import canonical
from agentsidecar.seedstore_service.seedtext import (
    MAX_PRIORITY,
    empty_alias_message,
    validate_identifier,
)

__all__ = [
    "EVIDENCE_SOURCE_CLI_HELP",
    "AddSpec",
    "UpdatePatch",
    "apply_patch",
    "apply_prefer",
    "build_seed",
    "parse_tie",
    "validate_patch",
    "validate_patch_before_load",
    "validate_prefer",
]

EVIDENCE_SOURCE_CLI_HELP = "cli_help"
PRIORITY_RANGE_MESSAGE = "priority must be between 0 and 100"
MISSING_PROVIDES_MESSAGE = "spec is missing required field provides"


@dataclass(frozen=True, slots=True)
class AddSpec:
    """Every flag of `capability add`; ties are the raw `KEY=VALUE` strings."""

    id: str
    domain: str
    kind: str
    command: str | None = None
    adapter: str | None = None
    script: str | None = None
    provides: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    preferred_for: tuple[str, ...] = ()
    avoid_for: tuple[str, ...] = ()
    ties: tuple[str, ...] = ()
    auth_env: tuple[str, ...] = ()
    priority: int | None = None
    external_service: bool = False
    may_cost_money: bool = False
    evidence_commands: tuple[str, ...] = ()
    suggested_skill_id: str | None = None


@dataclass(frozen=True, slots=True)
class UpdatePatch:
    """Every flag of `capability update` (except `--domain`, which only finds the seed)."""

    kind: str | None = None
    command: str | None = None
    clear_command: bool = False
    adapter: str | None = None
    clear_adapter: bool = False
    script: str | None = None
    clear_script: bool = False
    add_provides: tuple[str, ...] = ()
    remove_provides: tuple[str, ...] = ()
    add_aliases: tuple[str, ...] = ()
    remove_aliases: tuple[str, ...] = ()
    priority: int | None = None
    clear_priority: bool = False
    add_preferred_for: tuple[str, ...] = ()
    remove_preferred_for: tuple[str, ...] = ()
    add_avoid_for: tuple[str, ...] = ()
    remove_avoid_for: tuple[str, ...] = ()
    add_ties: tuple[str, ...] = ()  # raw KEY=VALUE
    remove_ties: tuple[str, ...] = ()  # keys
    add_auth_env: tuple[str, ...] = ()
    remove_auth_env: tuple[str, ...] = ()
    external_service: bool | None = None
    may_cost_money: bool | None = None
    add_evidence_commands: tuple[str, ...] = ()
    remove_evidence_commands: tuple[str, ...] = ()
    suggested_skill_id: str | None = None
    clear_suggested_skill_id: bool = False
    mark: VerificationStatus | None = None  # FAILED or UNVERIFIED; there is no --mark-verified


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def _validate_all(values: Iterable[str], label: str) -> None:
    for value in values:
        validate_identifier(value, label)


def _validate_priority(priority: int | None) -> None:
    if priority is not None and not 0 <= priority <= MAX_PRIORITY:
        raise InvalidArgument(PRIORITY_RANGE_MESSAGE, "priority")


def _validate_aliases(aliases: Iterable[str]) -> None:
    # Refused here although SkillSpec stores it: an alias with no letters or digits would match every search.
    for alias in aliases:
        if not canonical(alias):
            raise InvalidArgument(empty_alias_message(alias), "alias")


def _validate_no_nul(values: Iterable[str | None], label: str) -> None:
    # A NUL cannot be part of a program argument or a path (execve and open end
    # strings at it), so such a command could never run as written.
    for value in values:
        if value is not None and "\x00" in value:
            raise InvalidArgument(f"{label.replace('_', ' ')} must not contain a NUL byte", label)


def parse_tie(raw: str) -> tuple[str, str]:
    """`KEY=VALUE` split at the first `=` (`a=b=c` is key `a`, value `b=c`); the key is an identifier.

    Raises:
        InvalidArgument: no `=`.
        InvalidIdentifier: the key breaks the identifier rule ("tie key").
    """
    key, separator, value = raw.partition("=")
    if not separator:
        raise InvalidArgument(f'tie breaker "{raw}" must use key=value', "tie")
    return validate_identifier(key, "tie key"), value


def _ties(raws: Iterable[str]) -> dict[str, str]:
    ties: dict[str, str] = {}
    for raw in raws:
        key, value = parse_tie(raw)
        ties[key] = value  # a repeated key keeps the last value
    return ties


def validate_patch_before_load(patch: UpdatePatch) -> None:
    """What SkillSpec's update checks before it looks for the seed: the priority, then the added ties.

    The rest of `validate_patch` runs once the seed is found, so an unknown seed is
    reported first, as SkillSpec reports it.

    Raises:
        InvalidArgument: priority over 100, a tie without `=`.
        InvalidIdentifier: an added tie's key ("tie key").
    """
    _validate_priority(patch.priority)
    _ties(patch.add_ties)


def validate_patch(patch: UpdatePatch) -> None:
    """Check every value an update would write or compare, before anything is loaded.

    Raises:
        InvalidIdentifier: labelled with the flag (`add-provides`, `remove-tie`, `tie key`, ...).
        InvalidArgument: priority over 100, a tie without `=`, an alias with no letters or
            digits, a NUL byte in the command, adapter, script or an added evidence command,
            or a mark other than failed/unverified.
    """
    _validate_all(patch.add_provides, "add-provides")
    _validate_all(patch.remove_provides, "remove-provides")
    _validate_all(patch.add_preferred_for, "add-preferred-for")
    _validate_all(patch.remove_preferred_for, "remove-preferred-for")
    _validate_all(patch.add_avoid_for, "add-avoid-for")
    _validate_all(patch.remove_avoid_for, "remove-avoid-for")
    _ties(patch.add_ties)
    _validate_all(patch.remove_ties, "remove-tie")
    _validate_priority(patch.priority)
    _validate_aliases(patch.add_aliases)
    _validate_no_nul((patch.command,), "command")
    _validate_no_nul((patch.adapter,), "adapter")
    _validate_no_nul((patch.script,), "script")
    _validate_no_nul(patch.add_evidence_commands, "add_evidence_commands")
    if patch.mark is VerificationStatus.VERIFIED:
        raise InvalidArgument("a seed can only be marked failed or unverified; run verify instead", "mark")


def validate_prefer(for_capability: str, priority: int | None) -> None:
    """Raises InvalidIdentifier ("for") or InvalidArgument (priority over 100)."""
    validate_identifier(for_capability, "for")
    _validate_priority(priority)


# ---------------------------------------------------------------------------
# add
# ---------------------------------------------------------------------------


def build_seed(spec: AddSpec) -> Seed:
    """The complete seed `add` writes. Nothing is deduplicated, as in SkillSpec.

    Raises:
        InvalidIdentifier: id ("capability id"), domain, a provides entry, a tie key.
        InvalidArgument: no provides, priority over 100, a tie without `=`, an empty alias,
            a NUL byte in the command, adapter, script or an evidence command.
    """
    validate_identifier(spec.id, "capability id")
    validate_identifier(spec.domain, "domain")
    if not spec.provides:
        raise InvalidArgument(MISSING_PROVIDES_MESSAGE, "provides")
    _validate_all(spec.provides, "provides")
    _validate_priority(spec.priority)
    ties = _ties(spec.ties)
    _validate_aliases(spec.aliases)
    _validate_no_nul((spec.command,), "command")
    _validate_no_nul((spec.adapter,), "adapter")
    _validate_no_nul((spec.script,), "script")
    _validate_no_nul(spec.evidence_commands, "evidence_commands")
    return Seed(
        id=spec.id,
        domain=spec.domain,
        kind=spec.kind,
        command=spec.command,
        adapter=spec.adapter,
        script=spec.script,
        provides=tuple(spec.provides),
        aliases=tuple(spec.aliases),
        rank=Rank(
            default_priority=spec.priority,
            preferred_for=tuple(spec.preferred_for),
            avoid_for=tuple(spec.avoid_for),
            tie_breakers=_frozen_ties(ties),
        ),
        evidence=tuple(Evidence(source=EVIDENCE_SOURCE_CLI_HELP, command=c) for c in spec.evidence_commands),
        auth_env=tuple(spec.auth_env),
        risk=Risk(external_service=spec.external_service, may_cost_money=spec.may_cost_money),
        promotion=None if spec.suggested_skill_id is None else Promotion(spec.suggested_skill_id),
        verification=None,
    )


def _frozen_ties(ties: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(sorted(ties.items())))


# ---------------------------------------------------------------------------
# update
# ---------------------------------------------------------------------------


def _add_canonical(values: tuple[str, ...], additions: Iterable[str]) -> tuple[str, ...]:
    """Append each addition unless a canonical equal is already there (including earlier additions)."""
    result = list(values)
    present = {canonical(value) for value in result}
    for addition in additions:
        if canonical(addition) not in present:
            result.append(addition)
            present.add(canonical(addition))
    return tuple(result)


def _remove_canonical(values: tuple[str, ...], removals: Iterable[str]) -> tuple[str, ...]:
    doomed = {canonical(removal) for removal in removals}
    return tuple(value for value in values if canonical(value) not in doomed)


def _edit_list(values: tuple[str, ...], add: Iterable[str], remove: Iterable[str]) -> tuple[str, ...]:
    return _remove_canonical(_add_canonical(values, add), remove)


def _set_or_clear(current: str | None, clear: bool, value: str | None) -> str | None:
    # Clear runs first and the set second, so `--command x --clear-command` leaves x.
    if clear:
        current = None
    return value if value is not None else current


def apply_patch(seed: Seed, patch: UpdatePatch, now_unix: int) -> Seed:
    """Apply an update in SkillSpec's fixed order; a later step wins over an earlier one.

    1 kind; 2 clear then set command, adapter, script; 3 provides add then remove;
    4 aliases; 5 clear-priority then priority; 6 preferred_for, avoid_for; 7 ties add
    then remove; 8 auth env; 9 risk; 10 evidence add then remove; 11 clear-suggested
    then suggested; 12 verification. List edits compare canonical forms; evidence
    compares the exact command string. Only a mark touches verification, and it
    clears the outcomes. Call `validate_patch` first.
    """
    kind = patch.kind if patch.kind is not None else seed.kind
    command = _set_or_clear(seed.command, patch.clear_command, patch.command)
    adapter = _set_or_clear(seed.adapter, patch.clear_adapter, patch.adapter)
    script = _set_or_clear(seed.script, patch.clear_script, patch.script)
    provides = _edit_list(seed.provides, patch.add_provides, patch.remove_provides)
    aliases = _edit_list(seed.aliases, patch.add_aliases, patch.remove_aliases)

    priority = None if patch.clear_priority else seed.rank.default_priority
    if patch.priority is not None:
        priority = patch.priority
    preferred_for = _edit_list(seed.rank.preferred_for, patch.add_preferred_for, patch.remove_preferred_for)
    avoid_for = _edit_list(seed.rank.avoid_for, patch.add_avoid_for, patch.remove_avoid_for)
    ties = dict(seed.rank.tie_breakers)
    ties.update(_ties(patch.add_ties))
    for key in patch.remove_ties:
        ties.pop(key, None)

    auth_env = _edit_list(seed.auth_env, patch.add_auth_env, patch.remove_auth_env)
    risk = Risk(
        external_service=seed.risk.external_service
        if patch.external_service is None
        else patch.external_service,
        may_cost_money=seed.risk.may_cost_money if patch.may_cost_money is None else patch.may_cost_money,
    )

    evidence = list(seed.evidence)
    for new_command in patch.add_evidence_commands:
        if all(entry.command != new_command for entry in evidence):
            evidence.append(Evidence(source=EVIDENCE_SOURCE_CLI_HELP, command=new_command))
    doomed_commands = set(patch.remove_evidence_commands)
    # Entries without a command (detail only) are never removed.
    evidence = [entry for entry in evidence if entry.command is None or entry.command not in doomed_commands]

    promotion = None if patch.clear_suggested_skill_id else seed.promotion
    if patch.suggested_skill_id is not None:
        promotion = Promotion(patch.suggested_skill_id)

    verification = seed.verification
    if patch.mark is not None:
        verification = Verification(status=patch.mark, verified_at_unix=now_unix, outcomes=())

    return replace(
        seed,
        kind=kind,
        command=command,
        adapter=adapter,
        script=script,
        provides=provides,
        aliases=aliases,
        rank=Rank(
            default_priority=priority,
            preferred_for=preferred_for,
            avoid_for=avoid_for,
            tie_breakers=_frozen_ties(ties),
        ),
        evidence=tuple(evidence),
        auth_env=auth_env,
        risk=risk,
        promotion=promotion,
        verification=verification,
    )


def apply_prefer(seed: Seed, for_capability: str, priority: int | None) -> Seed:
    """Append `for_capability` to preferred_for unless a canonical equal exists; set priority if given.

    Like SkillSpec, a conflicting avoid_for entry stays. Call `validate_prefer` first.
    """
    rank = replace(
        seed.rank,
        preferred_for=_add_canonical(seed.rank.preferred_for, (for_capability,)),
        default_priority=seed.rank.default_priority if priority is None else priority,
    )
    return replace(seed, rank=rank)
