"""Declarations as code and config see them: shortnames and narrowing.

The code of an adapter implementation says what it can honour; a config file
may only say less. Widening a declaration in config would advertise a surface
the code does not enforce, which is the silent degradation declare-and-refuse
exists to prevent, so `narrow` refuses it as a config error.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType

from negotiator_service.errors import ConfigError
from negotiator_service.model import (
    MCP_TRANSPORTS,
    CapabilityState,
    Declaration,
    DeclarationOverride,
    TypedSet,
)

SHORTNAME_RE = r"^[a-z][a-z0-9_-]{0,62}$"
_SHORTNAME = re.compile(SHORTNAME_RE)

# How much a state promises; config may only move a capability down this order.
_STATE_RANK: Mapping[CapabilityState, int] = MappingProxyType(
    {
        CapabilityState.UNSUPPORTED: 0,
        CapabilityState.UNKNOWN: 1,
        CapabilityState.SUPPORTED: 2,
    }
)


def validate_shortname(name: str) -> str:
    """Return `name` if it is a valid shortname, else raise ConfigError naming it."""
    # fullmatch, not match: `$` would accept a trailing newline.
    if not isinstance(name, str) or _SHORTNAME.fullmatch(name) is None:
        raise ConfigError(
            f"invalid adapter shortname {name!r}: must match {SHORTNAME_RE} "
            "(lower-case letter first, then up to 62 of a-z, 0-9, '_', '-')"
        )
    return name


def _override_sets(override: DeclarationOverride) -> dict[TypedSet, frozenset[str] | None]:
    return {
        TypedSet.MCP_TRANSPORTS: override.mcp_transports,
        TypedSet.ACCEPTED_SETTINGS: override.accepted_settings,
        TypedSet.STRING_FORMATS: override.string_formats,
        TypedSet.HOOK_EVENTS: override.hook_events,
    }


def _member_problems(typed_set: TypedSet, members: frozenset[str]) -> list[str]:
    problems = []
    for member in sorted(members):
        if not isinstance(member, str) or not member.strip():
            problems.append(f"{typed_set.value} contains an empty member")
        elif typed_set is TypedSet.MCP_TRANSPORTS and member not in MCP_TRANSPORTS:
            problems.append(
                f'{typed_set.value} contains "{member}", which is not a transport '
                f"(expected one of {', '.join(sorted(MCP_TRANSPORTS))})"
            )
    return problems


def narrow(
    code: Declaration,
    override: DeclarationOverride | None,
    *,
    shortname: str,
    implementation: str | None = None,
) -> Declaration:
    """Apply a config override to a code declaration, refusing anything wider.

    Returns the code declaration with the override applied and `shortname` set.
    Every widening is reported in one ConfigError, so a config author fixes
    them all in one pass. `implementation` only improves the message.
    """
    validate_shortname(shortname)
    who = f"the {implementation} implementation" if implementation else "the code"
    if override is None:
        return dataclasses.replace(code, shortname=shortname)

    problems: list[str] = []
    if override.kind is not None and override.kind is not code.kind:
        problems.append(f"config declares kind={override.kind.value} but {who} is an {code.kind.value}")

    capabilities = dict(code.capabilities)
    for capability, state in sorted(override.capabilities.items(), key=lambda kv: kv[0].value):
        code_state = code.state(capability)
        if _STATE_RANK[state] > _STATE_RANK[code_state]:
            problems.append(
                f"config declares capabilities.{capability.value}={state.value} "
                f"but {who} declares {code_state.value}"
            )
        capabilities[capability] = state

    narrowed_sets: dict[TypedSet, frozenset[str]] = {s: code.members(s) for s in TypedSet}
    for typed_set, members in _override_sets(override).items():
        if members is None:
            continue
        problems.extend(_member_problems(typed_set, members))
        for extra in sorted(m for m in members - code.members(typed_set) if isinstance(m, str) and m):
            problems.append(f'{typed_set.value} contains "{extra}", which {who} does not implement')
        narrowed_sets[typed_set] = members

    if problems:
        raise ConfigError(f'adapter "{shortname}": ' + "; ".join(problems))
    return Declaration(
        shortname=shortname,
        kind=code.kind,
        capabilities=MappingProxyType(capabilities),
        mcp_transports=narrowed_sets[TypedSet.MCP_TRANSPORTS],
        accepted_settings=narrowed_sets[TypedSet.ACCEPTED_SETTINGS],
        string_formats=narrowed_sets[TypedSet.STRING_FORMATS],
        hook_events=narrowed_sets[TypedSet.HOOK_EVENTS],
        scripted=code.scripted,
    )


def declaration_from_override(
    override: DeclarationOverride, *, shortname: str, scripted: bool
) -> Declaration:
    """A declaration written entirely in config (the scripted adapter's)."""
    validate_shortname(shortname)
    problems: list[str] = []
    if override.kind is None:
        problems.append("declaration.kind is required (agent-framework or agent-harness)")
    for typed_set, members in _override_sets(override).items():
        if members is not None:
            problems.extend(_member_problems(typed_set, members))
    if problems or override.kind is None:
        raise ConfigError(f'adapter "{shortname}": ' + "; ".join(problems))
    return Declaration(
        shortname=shortname,
        kind=override.kind,
        capabilities=MappingProxyType(dict(override.capabilities)),
        mcp_transports=override.mcp_transports or frozenset(),
        accepted_settings=override.accepted_settings or frozenset(),
        string_formats=override.string_formats or frozenset(),
        hook_events=override.hook_events or frozenset(),
        scripted=scripted,
    )
