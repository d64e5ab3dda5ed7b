"""Declarations as code and config see them: shortnames, narrowing, per-model entries.

The declaration rule (protos/README.md, "Declarations"):
- UNSUPPORTED: the adapter's code cannot carry it. Nothing widens it.
- UNKNOWN: the code carries it, but whether the upstream honours it depends
  on the upstream. Refused unless the caller allows it per call.
- SUPPORTED: the code carries it and the operator's config states it for
  that upstream or model (or a probe showed it), or the negotiator enforces
  it itself.

So config may narrow anything, and may raise a capability the code
declares UNKNOWN to SUPPORTED, for the adapter or for one model. A state
the code declares UNSUPPORTED, a capability the code does not declare at
all, and a typed-set member the code does not carry cannot be widened:
that would advertise a surface the code does not enforce, which is the
silent degradation declare-and-refuse exists to prevent, so `narrow`
refuses it as a config error. `resolve_unknown` is where evidence from
a probe of the upstream settles what the code left UNKNOWN, per model.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType

from agentsidecar.negotiator_service.errors import ConfigError
from agentsidecar.negotiator_service.model import (
    MCP_TRANSPORTS,
    Capability,
    CapabilityState,
    Declaration,
    DeclarationOverride,
    TypedSet,
)

SHORTNAME_RE = r"^[a-z][a-z0-9_-]{0,62}$"
_SHORTNAME = re.compile(SHORTNAME_RE)


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
        TypedSet.EFFORT_LEVELS: override.effort_levels,
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


def _allowed(code: Declaration, capability: Capability, state: CapabilityState) -> bool:
    """May config declare `state` for a capability the code declares as it does?"""
    if state is not CapabilityState.SUPPORTED:
        # UNSUPPORTED narrows anything; an explicit UNKNOWN promises no more than the code
        # does, unless the code declares the capability UNSUPPORTED.
        return (
            state is CapabilityState.UNSUPPORTED or code.state(capability) is not CapabilityState.UNSUPPORTED
        )
    # SUPPORTED: the code supports it, or declares it UNKNOWN (it carries it) explicitly.
    return capability in code.capabilities and code.state(capability) is not CapabilityState.UNSUPPORTED


def _apply(
    base: Declaration, override: DeclarationOverride, code: Declaration | None, who: str, where: str
) -> tuple[Declaration, list[str]]:
    """`override` applied on top of `base`; with `code`, each widening past it is a problem."""
    problems: list[str] = []
    capabilities = dict(base.capabilities)
    for capability, state in sorted(override.capabilities.items(), key=lambda kv: kv[0].value):
        if code is not None and not _allowed(code, capability, state):
            declared = code.state(capability).value if capability in code.capabilities else "nothing"
            problems.append(
                f"config declares {where}capabilities.{capability.value}={state.value} "
                f"but {who} declares {declared}"
            )
        capabilities[capability] = state
    sets: dict[TypedSet, frozenset[str]] = {s: base.members(s) for s in TypedSet}
    for typed_set, members in _override_sets(override).items():
        if members is None:
            continue
        problems.extend(f"{where}{problem}" for problem in _member_problems(typed_set, members))
        carried = code.members(typed_set) if code is not None else None
        # Effort levels the code does not list are any level: config may name them.
        if carried is not None and not (typed_set is TypedSet.EFFORT_LEVELS and not carried):
            for extra in sorted(m for m in members - carried if isinstance(m, str) and m):
                problems.append(
                    f'{where}{typed_set.value} contains "{extra}", which {who} does not implement'
                )
        sets[typed_set] = members
    declaration = dataclasses.replace(
        base,
        capabilities=MappingProxyType(capabilities),
        mcp_transports=sets[TypedSet.MCP_TRANSPORTS],
        accepted_settings=sets[TypedSet.ACCEPTED_SETTINGS],
        string_formats=sets[TypedSet.STRING_FORMATS],
        hook_events=sets[TypedSet.HOOK_EVENTS],
        effort_levels=sets[TypedSet.EFFORT_LEVELS],
    )
    return declaration, problems


def _with_models(
    adapter_level: Declaration, override: DeclarationOverride, code: Declaration | None, who: str
) -> tuple[Declaration, list[str]]:
    """The adapter-level declaration with one complete entry per model the override lists."""
    problems: list[str] = []
    models: dict[str, Declaration] = dict(adapter_level.models)
    for name in sorted(override.models):
        if not isinstance(name, str) or not name.strip():
            problems.append("declaration.models contains an empty model name")
            continue
        flat = dataclasses.replace(adapter_level, models=MappingProxyType({}), default_model="")
        entry, entry_problems = _apply(
            models.get(name, flat), override.models[name], code, who, f"models.{name}."
        )
        problems.extend(entry_problems)
        models[name] = entry
    return dataclasses.replace(adapter_level, models=MappingProxyType(models)), problems


def narrow(
    code: Declaration,
    override: DeclarationOverride | None,
    *,
    shortname: str,
    implementation: str | None = None,
) -> Declaration:
    """Apply a config override to a code declaration, refusing what the rule forbids.

    Returns the code declaration with the override applied (adapter level,
    then each model's entry on top of it) and `shortname` set. Every
    widening past the code is reported in one ConfigError, so a config
    author fixes them all in one pass. `implementation` only improves the
    message.
    """
    validate_shortname(shortname)
    who = f"the {implementation} implementation" if implementation else "the code"
    base = dataclasses.replace(code, shortname=shortname)
    if code.models:
        base = dataclasses.replace(
            base,
            models=MappingProxyType(
                {name: dataclasses.replace(entry, shortname=shortname) for name, entry in code.models.items()}
            ),
        )
    if override is None:
        return base

    problems: list[str] = []
    if override.kind is not None and override.kind is not code.kind:
        problems.append(f"config declares kind={override.kind.value} but {who} is an {code.kind.value}")
    adapter_level, level_problems = _apply(base, override, code, who, "")
    problems.extend(level_problems)
    declaration, model_problems = _with_models(adapter_level, override, code, who)
    problems.extend(model_problems)
    if problems:
        raise ConfigError(f'adapter "{shortname}": ' + "; ".join(problems))
    return declaration


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
    adapter_level = Declaration(
        shortname=shortname,
        kind=override.kind,
        capabilities=MappingProxyType(dict(override.capabilities)),
        mcp_transports=override.mcp_transports or frozenset(),
        accepted_settings=override.accepted_settings or frozenset(),
        string_formats=override.string_formats or frozenset(),
        hook_events=override.hook_events or frozenset(),
        effort_levels=override.effort_levels or frozenset(),
        scripted=scripted,
    )
    declaration, model_problems = _with_models(adapter_level, override, None, "the config")
    if model_problems:
        raise ConfigError(f'adapter "{shortname}": ' + "; ".join(model_problems))
    return declaration


def resolve_unknown(
    declaration: Declaration, model: str, evidence: Mapping[Capability, CapabilityState]
) -> Declaration:
    """The declaration with what `evidence` (a probe of `model`) showed settled for that model.

    Only a capability the model's declaration holds UNKNOWN moves, to the
    state the evidence gives it: a probe that passed shows SUPPORTED, one
    that failed UNSUPPORTED. What the code or config declared otherwise
    stays as it is, since a probe can neither widen the code nor overrule
    the operator. The model gets an entry of its own (a copy of the
    adapter-level declaration) when it has none; the version changes with it.
    """
    if not model:
        raise ValueError("evidence is per model: name the model")
    flat = dataclasses.replace(declaration, models=MappingProxyType({}), default_model="")
    entry = declaration.models.get(model, flat)
    capabilities = dict(entry.capabilities)
    for capability, state in evidence.items():
        if entry.state(capability) is CapabilityState.UNKNOWN and state is not CapabilityState.UNKNOWN:
            capabilities[capability] = state
    models = {
        **declaration.models,
        model: dataclasses.replace(entry, capabilities=MappingProxyType(capabilities)),
    }
    return dataclasses.replace(declaration, models=MappingProxyType(models))
