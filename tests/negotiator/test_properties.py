"""Properties of declare-and-refuse over random declarations and random calls.

1. A refused call never reaches adapter code.
2. An accepted call needs nothing the declaration of the model it selects
   (options.model, else the default model; a model without an entry of its
   own gets the adapter-level declaration) does not support, except UNKNOWN
   capabilities the caller allowed; and every verdict of the decision says
   so, naming that model.
3. Conversely, a call whose every need is met is accepted.

Needs, the selected model and the set-member rule are re-stated here from
the request itself, independently of `derive_requirements` and `judge`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass, replace
from typing import Any

import pytest
from fakes import FakeAdapter
from hypothesis import given
from hypothesis import strategies as st

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.broker import Broker
from agentsidecar.negotiator_service.mcp_policy import McpPolicy
from agentsidecar.negotiator_service.model import (
    SET_CAPABILITY,
    AdapterKind,
    CallKind,
    CallOptions,
    CallRequest,
    Capability,
    CapabilityState,
    Decision,
    Declaration,
    MaxDepth,
    McpServer,
    ToolFilter,
    TypedSet,
)
from agentsidecar.negotiator_service.registry import AdapterRegistry, RegisteredAdapter

FORMATS = ("email", "date", "uuid", "uri")
SETTING_KEYS = ("temperature", "seed", "top_k")
TRANSPORTS = ("stdio", "sse", "http", "streamable-http")
HOOK_EVENTS = ("user_prompt_submit", "pre_tool_use")
EFFORT_LEVELS = ("low", "high")
MODEL_NAMES = ("model-x", "model-y")


def subset(members: tuple[str, ...]) -> st.SearchStrategy[frozenset[str]]:
    return st.frozensets(st.sampled_from(members))


# Strategies are built once: building them inside each draw dominates the run time.
# States lean to SUPPORTED and options to absent, so that accepted calls are common.
_STATE_OR_OMITTED = st.sampled_from(
    [*[CapabilityState.SUPPORTED] * 5, CapabilityState.UNKNOWN, CapabilityState.UNSUPPORTED, None]
)
_KINDS = st.sampled_from(list(AdapterKind))
_DECLARED_TRANSPORTS = subset(("stdio", "sse", "http"))
_DECLARED_SETTINGS = subset(SETTING_KEYS)
_DECLARED_FORMATS = subset(FORMATS)
_DECLARED_HOOKS = subset(HOOK_EVENTS)
_DECLARED_LEVELS = subset(EFFORT_LEVELS)
_DEFAULT_MODELS = st.sampled_from(["", "", *MODEL_NAMES])
_MODEL_ENTRIES = st.frozensets(st.sampled_from(MODEL_NAMES))


def flat_declaration(draw: st.DrawFn, kind: AdapterKind) -> Declaration:
    states = {capability: draw(_STATE_OR_OMITTED) for capability in Capability}
    return Declaration(
        shortname="target",
        kind=kind,
        capabilities={c: state for c, state in states.items() if state is not None},
        mcp_transports=draw(_DECLARED_TRANSPORTS),
        accepted_settings=draw(_DECLARED_SETTINGS),
        string_formats=draw(_DECLARED_FORMATS),
        hook_events=draw(_DECLARED_HOOKS),
        effort_levels=draw(_DECLARED_LEVELS),
    )


@st.composite
def declarations(draw: st.DrawFn) -> Declaration:
    """An adapter-level declaration, maybe a default model, and entries for some models."""
    kind = draw(_KINDS)
    adapter_level = flat_declaration(draw, kind)
    models = {name: flat_declaration(draw, kind) for name in sorted(draw(_MODEL_ENTRIES))}
    return dataclasses.replace(adapter_level, default_model=draw(_DEFAULT_MODELS), models=models)


_FORMAT_LISTS = st.lists(st.sampled_from(FORMATS), max_size=3)
_PLACES = st.sampled_from(["property", "items", "defs", "anyOf", "enum-data"])


@st.composite
def schemas(draw: st.DrawFn) -> dict[str, Any]:
    """Object schemas that `{}` satisfies, with `format` placed in assorted keywords."""
    properties: dict[str, Any] = {}
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    for index, string_format in enumerate(draw(_FORMAT_LISTS)):
        where = draw(_PLACES)
        leaf = {"type": "string", "format": string_format}
        if where == "property":
            properties[f"p{index}"] = leaf
        elif where == "items":
            properties[f"p{index}"] = {"type": "array", "items": leaf}
        elif where == "defs":
            schema.setdefault("$defs", {})[f"d{index}"] = leaf
        elif where == "anyOf":
            properties[f"p{index}"] = {"anyOf": [{"type": "integer"}, leaf]}
        else:  # data, not a keyword: requires nothing
            properties[f"p{index}"] = {"enum": [{"format": string_format}]}
    return schema


def maybe(value: Any) -> st.SearchStrategy[Any]:
    """`value` one time in four, else None."""
    return st.sampled_from([None, None, None, value])


_CALL_KINDS = st.sampled_from(list(CallKind))
_TRANSPORT_LISTS = st.lists(st.sampled_from(TRANSPORTS), max_size=3)
_MAX_DEPTHS = (
    st.none() | st.builds(MaxDepth, depth=st.integers(0, 5)) | st.just(MaxDepth(provider_managed=True))
)
_SETTINGS = st.dictionaries(st.sampled_from(SETTING_KEYS), st.integers(0, 3))
# Random subsets rarely name the one capability that matters, so "allow everything" is drawn often too.
_ALLOW_UNKNOWN = st.frozensets(st.sampled_from(list(Capability))) | st.just(frozenset(Capability))
_MODELS = st.sampled_from([None, None, None, *MODEL_NAMES, "model-z"])
_EFFORTS = st.sampled_from([None, None, "high", "medium"])
_PROFILES, _PERSONAS = maybe("profile-x"), maybe("critic")
_TOOL_FILTERS = maybe(ToolFilter(allow=("read",)))
_SCHEMAS = schemas()


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Declaration, CallRequest]:
    """A declaration and a call to it, which usually selects it by the right kind."""
    declaration = draw(declarations())
    kind = draw(_CALL_KINDS)
    servers = tuple(
        McpServer(name=f"s{i}", transport=t, command="run", url="http://127.0.0.1:9/")
        for i, t in enumerate(draw(_TRANSPORT_LISTS))
    )
    options = CallOptions(
        model=draw(_MODELS),
        effort=draw(_EFFORTS),
        settings=draw(_SETTINGS),
        profile=draw(_PROFILES),
        mcp_servers=servers,
        max_depth=draw(_MAX_DEPTHS),
        tool_filter=draw(_TOOL_FILTERS),
        persona=draw(_PERSONAS),
        stream_events=draw(maybe(True)) is True,
        allow_unknown=draw(_ALLOW_UNKNOWN),
    )
    right_kind = draw(maybe(False)) is None
    by_agent = (declaration.kind is AdapterKind.HARNESS) is right_kind
    request = CallRequest(
        kind=kind,
        prompt="do it",
        adapter=None if by_agent else "target",
        agent="target" if by_agent else None,
        output_schema=json.dumps(draw(_SCHEMAS)) if kind is CallKind.PRODUCE else None,
        options=options,
    )
    return declaration, request


@dataclass(frozen=True)
class Need:
    capability: Capability
    typed_set: TypedSet | None = None
    member: str = ""


def needs_of(request: CallRequest) -> list[Need]:
    """What the call asks of the adapter, re-stated from the request."""
    options = request.options
    needs: list[Need] = []
    if request.output_schema is not None:
        needs.append(Need(Capability.STRUCTURED_OUTPUT))
        needs.extend(
            Need(Capability.STRUCTURED_OUTPUT, TypedSet.STRING_FORMATS, f) for f in keyword_formats(request)
        )
    if options.effort is not None:
        needs.append(Need(Capability.EFFORT))
        needs.append(Need(Capability.EFFORT, TypedSet.EFFORT_LEVELS, options.effort))
    for value, capability in (
        (options.model, Capability.MODEL_OVERRIDE),
        (options.profile, Capability.PROFILE_OVERRIDE),
        (options.max_depth, Capability.DEPTH_LIMIT),
        (options.tool_filter, Capability.TOOL_FILTER),
        (options.persona, Capability.PERSONA),
    ):
        if value is not None:
            needs.append(Need(capability))
    if options.max_depth is not None and options.max_depth.provider_managed:
        needs.append(Need(Capability.SUBAGENTS))
    if options.stream_events:
        needs.append(Need(Capability.STREAM_EVENTS))
    if options.settings:
        needs.append(Need(Capability.SETTINGS))
        needs.extend(Need(Capability.SETTINGS, TypedSet.ACCEPTED_SETTINGS, k) for k in options.settings)
    if options.mcp_servers:
        needs.append(Need(Capability.MCP))
        needs.extend(
            Need(
                Capability.MCP,
                TypedSet.MCP_TRANSPORTS,
                "http" if s.transport == "streamable-http" else s.transport,
            )
            for s in options.mcp_servers
        )
    return needs


def keyword_formats(request: CallRequest) -> set[str]:
    """The formats `schemas()` placed as keywords (everything but the enum data)."""
    assert request.output_schema is not None
    found: set[str] = set()

    def visit(node: Any, in_data: bool) -> None:
        if isinstance(node, dict):
            if not in_data and isinstance(node.get("format"), str):
                found.add(node["format"])
            for key, value in node.items():
                visit(value, in_data or key == "enum")
        elif isinstance(node, list):
            for item in node:
                visit(item, in_data)

    visit(json.loads(request.output_schema), False)
    return found


def selected(request: CallRequest, declaration: Declaration) -> tuple[str, Declaration]:
    """The model a call goes to, if it has an entry of its own, and the declaration that applies."""
    model = request.options.model if request.options.model is not None else declaration.default_model
    if model in declaration.models:
        return model, declaration.models[model]
    return "", declaration


def state_of(need: Need, declaration: Declaration) -> CapabilityState:
    declared = dict(declaration.capabilities)
    if need.typed_set is None:
        return declared.get(need.capability, CapabilityState.UNKNOWN)
    members = declaration.members(need.typed_set)
    if need.member in members or (need.typed_set is TypedSet.EFFORT_LEVELS and not members):
        return CapabilityState.SUPPORTED
    owner_declared = SET_CAPABILITY[need.typed_set] in declared
    return CapabilityState.UNSUPPORTED if owner_declared else CapabilityState.UNKNOWN


def met(need: Need, declaration: Declaration, allow: frozenset[Capability]) -> bool:
    state = state_of(need, declaration)
    return state is CapabilityState.SUPPORTED or (
        state is CapabilityState.UNKNOWN and need.capability in allow
    )


def kind_fits(request: CallRequest, declaration: Declaration) -> bool:
    expected = AdapterKind.FRAMEWORK if request.adapter is not None else AdapterKind.HARNESS
    return declaration.kind is expected


async def run(declaration: Declaration, request: CallRequest) -> tuple[FakeAdapter, Exception | None]:
    adapter, outcome = await run_for_decision(declaration, request)
    return adapter, outcome if isinstance(outcome, Exception) else None


async def run_for_decision(
    declaration: Declaration, request: CallRequest
) -> tuple[FakeAdapter, Exception | Decision]:
    adapter = FakeAdapter(declaration, default="{}")
    registry = AdapterRegistry()
    registry.add(RegisteredAdapter(adapter, "config"))
    try:
        # The scenarios' MCP servers are admitted: these properties are about declarations.
        policy = McpPolicy(caller_stdio_commands=frozenset({"run"}), caller_hosts=frozenset({"127.0.0.1"}))
        _reply, decision = await Broker(registry, mcp_policy=policy).call(request, time_budget=5)
    except errors.NegotiatorError as exc:
        return adapter, exc
    return adapter, decision


@pytest.mark.slow
@given(scenario=scenarios())
def test_refused_calls_never_reach_the_adapter(scenario: tuple[Declaration, CallRequest]) -> None:
    declaration, request = scenario
    adapter, failure = asyncio.run(run(declaration, request))
    if isinstance(failure, errors.UnsupportedCapability | errors.AdapterKindMismatch):
        assert adapter.calls == []
    else:
        assert failure is None
        assert len(adapter.calls) == 1


@pytest.mark.slow
@given(scenario=scenarios())
def test_accepted_calls_need_only_what_is_supported_or_allowed(
    scenario: tuple[Declaration, CallRequest],
) -> None:
    adapter_level, request = scenario
    _model, declaration = selected(request, adapter_level)
    _adapter, failure = asyncio.run(run(adapter_level, request))
    needs = needs_of(request)
    all_met = all(met(need, declaration, request.options.allow_unknown) for need in needs)
    if failure is None:
        assert kind_fits(request, declaration)
        assert all_met, [n for n in needs if not met(n, declaration, request.options.allow_unknown)]
    elif isinstance(failure, errors.UnsupportedCapability):
        assert kind_fits(request, declaration)
        assert not all_met
        refused = {
            Need(v.requirement.capability, v.requirement.typed_set, v.requirement.member)
            for v in failure.decision.gaps
        }
        assert refused == {n for n in needs if not met(n, declaration, request.options.allow_unknown)}
    else:
        assert isinstance(failure, errors.AdapterKindMismatch)
        assert not kind_fits(request, declaration)


# --- caller-stated requirements (options.requires) ----------------------------------

_REQUIRABLE = (
    *(c.value for c in Capability),
    *(f"hook_events:{event}" for event in (*HOOK_EVENTS, "stop")),
    *(f"accepted_settings:{key}" for key in SETTING_KEYS),
    *(f"mcp_transports:{transport}" for transport in TRANSPORTS),
    *(f"string_formats:{string_format}" for string_format in FORMATS),
)
# "streamable-http" and "http" name one transport, so one list holds at most one of them.
_REQUIRES = st.lists(st.sampled_from(_REQUIRABLE), max_size=4, unique=True).filter(
    lambda entries: not {"mcp_transports:http", "mcp_transports:streamable-http"} <= set(entries)
)


@st.composite
def scenarios_with_requires(draw: st.DrawFn) -> tuple[Declaration, CallRequest]:
    """`scenarios()` with a list of caller-stated requirements added to the call."""
    declaration, request = draw(scenarios())
    options = replace(request.options, requires=tuple(draw(_REQUIRES)))
    return declaration, replace(request, options=options)


def required_needs(request: CallRequest) -> list[tuple[int, Need]]:
    """(entry index, need) for each `options.requires` entry, re-stated from its text."""
    needs: list[tuple[int, Need]] = []
    for index, entry in enumerate(request.options.requires):
        name, _, member = entry.partition(":")
        if not member:
            needs.append((index, Need(Capability(name))))
            continue
        typed_set = TypedSet(name)
        member = "http" if member == "streamable-http" else member
        needs.append((index, Need(SET_CAPABILITY[typed_set])))
        needs.append((index, Need(SET_CAPABILITY[typed_set], typed_set, member)))
    return needs


@pytest.mark.slow
@given(scenario=scenarios_with_requires())
def test_every_required_entry_appears_as_its_own_verdict(scenario: tuple[Declaration, CallRequest]) -> None:
    declaration, request = scenario
    registry = AdapterRegistry()
    registry.add(RegisteredAdapter(FakeAdapter(declaration), "config"))
    try:
        # The scenarios' MCP servers are admitted, as in the calls below: this property is about verdicts.
        policy = McpPolicy(caller_stdio_commands=frozenset({"run"}), caller_hosts=frozenset({"127.0.0.1"}))
        decision = Broker(registry, mcp_policy=policy).negotiate(request)
    except errors.AdapterKindMismatch:
        assert not kind_fits(request, declaration)
        return
    stated = [
        (int(v.requirement.request_field.removeprefix("options.requires[").removesuffix("]")), v)
        for v in decision.verdicts
        if v.requirement.request_field.startswith("options.requires[")
    ]
    assert [
        (index, Need(v.requirement.capability, v.requirement.typed_set, v.requirement.member))
        for index, v in stated
    ] == required_needs(request)
    _, judged_by = selected(request, declaration)
    for _, verdict in stated:
        need = Need(verdict.requirement.capability, verdict.requirement.typed_set, verdict.requirement.member)
        assert verdict.accepted == met(need, judged_by, request.options.allow_unknown)


@pytest.mark.slow
@given(scenario=scenarios_with_requires())
def test_accepted_calls_meet_every_required_entry_too(scenario: tuple[Declaration, CallRequest]) -> None:
    declaration, request = scenario
    adapter, failure = asyncio.run(run(declaration, request))
    allow = request.options.allow_unknown
    needs = needs_of(request) + [need for _, need in required_needs(request)]
    _, judged_by = selected(request, declaration)
    unmet = {need for need in needs if not met(need, judged_by, allow)}
    if failure is None:
        assert kind_fits(request, declaration)
        assert not unmet, unmet
        [(_, call)] = adapter.calls
        assert call.options.requires == request.options.requires
    elif isinstance(failure, errors.UnsupportedCapability):
        assert adapter.calls == []
        assert unmet == {
            Need(v.requirement.capability, v.requirement.typed_set, v.requirement.member)
            for v in failure.decision.gaps
        }
    else:
        assert isinstance(failure, errors.AdapterKindMismatch)
        assert not kind_fits(request, declaration)


@pytest.mark.slow
@given(scenario=scenarios())
def test_an_accepted_call_carries_only_requirements_supported_for_its_model(
    scenario: tuple[Declaration, CallRequest],
) -> None:
    adapter_level, request = scenario
    model, declaration = selected(request, adapter_level)
    adapter, outcome = asyncio.run(run_for_decision(adapter_level, request))
    if not isinstance(outcome, Decision):
        assert adapter.calls == []
        return
    assert outcome.model == model
    assert outcome.declaration_version == adapter_level.version
    allow = request.options.allow_unknown
    for verdict in outcome.verdicts:
        need = Need(verdict.requirement.capability, verdict.requirement.typed_set, verdict.requirement.member)
        state = state_of(need, declaration)
        assert verdict.state is state
        assert state is CapabilityState.SUPPORTED or (
            state is CapabilityState.UNKNOWN and verdict.allowed_unknown and need.capability in allow
        )
    assert len(adapter.calls) == 1
