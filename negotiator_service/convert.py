"""Protos to negotiator values and back. No logic beyond shape: the core judges.

(A declaration arriving as a proto comes only from a remote adapter, so
`adapters/remote.py` converts and validates it there.)

Conventions:
- An unset `optional` field is None; a set one keeps its value, even "" (the
  core reports an empty value as a field violation rather than ignoring it).
- `settings` (a google.protobuf.Struct) becomes a plain dict. Struct has only
  doubles, so integral numbers come back as ints: `{"seed": 7}` reaches the
  adapter as 7, not 7.0.
- Enum values outside the model (UNSPECIFIED or a number this build does not
  know) are InvalidRequest field violations, never silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2
from google.protobuf import struct_pb2

from negotiator_service.errors import InvalidRequest, NotImplementedYet
from negotiator_service.model import (
    AdapterKind,
    AdapterReply,
    CallKind,
    CallOptions,
    CallRequest,
    Capability,
    CapabilityState,
    Decision,
    Declaration,
    JsonValue,
    MaxDepth,
    McpServer,
    Requirement,
    StreamEvent,
    ToolFilter,
    TypedSet,
    Verdict,
)
from negotiator_service.registry import Change, RegisteredAdapter

# Doubles hold every integer up to 2**53 exactly; beyond that a "whole"
# double is already rounded, so it stays a float rather than pretend precision.
_MAX_EXACT_INT = 2**53

CAPABILITY_TO_PROTO: Mapping[Capability, common_pb2.Capability.ValueType] = MappingProxyType(
    {c: common_pb2.Capability.Value(f"CAPABILITY_{c.name}") for c in Capability}
)
CAPABILITY_FROM_PROTO: Mapping[int, Capability] = MappingProxyType(
    {int(v): c for c, v in CAPABILITY_TO_PROTO.items()}
)
STATE_TO_PROTO: Mapping[CapabilityState, common_pb2.CapabilityState.ValueType] = MappingProxyType(
    {s: common_pb2.CapabilityState.Value(f"CAPABILITY_STATE_{s.name}") for s in CapabilityState}
)
TYPED_SET_TO_PROTO: Mapping[TypedSet, common_pb2.TypedSet.ValueType] = MappingProxyType(
    {s: common_pb2.TypedSet.Value(f"TYPED_SET_{s.name}") for s in TypedSet}
)
KIND_TO_PROTO: Mapping[AdapterKind, common_pb2.AdapterKind.ValueType] = MappingProxyType(
    {
        AdapterKind.FRAMEWORK: common_pb2.ADAPTER_KIND_AGENT_FRAMEWORK,
        AdapterKind.HARNESS: common_pb2.ADAPTER_KIND_AGENT_HARNESS,
    }
)
SOURCE_TO_PROTO: Mapping[str, negotiator_pb2.AdapterSource.ValueType] = MappingProxyType(
    {"config": negotiator_pb2.ADAPTER_SOURCE_CONFIG, "runtime": negotiator_pb2.ADAPTER_SOURCE_RUNTIME}
)
CHANGE_TO_PROTO: Mapping[Change, negotiator_pb2.AdapterChange.ValueType] = MappingProxyType(
    {
        "existing": negotiator_pb2.ADAPTER_CHANGE_EXISTING,
        "registered": negotiator_pb2.ADAPTER_CHANGE_REGISTERED,
        "deregistered": negotiator_pb2.ADAPTER_CHANGE_DEREGISTERED,
    }
)


# --- requests -----------------------------------------------------------------


def produce_request(message: negotiator_pb2.ProduceRequest) -> CallRequest:
    adapter, agent = _target(message)
    return CallRequest(
        kind=CallKind.PRODUCE,
        prompt=message.prompt,
        adapter=adapter,
        agent=agent,
        output_schema=message.output_schema or None,
        options=call_options(message.options) if message.HasField("options") else CallOptions(),
    )


def invoke_request(message: negotiator_pb2.InvokeRequest) -> CallRequest:
    adapter, agent = _target(message)
    return CallRequest(
        kind=CallKind.INVOKE,
        prompt=message.prompt,
        adapter=adapter,
        agent=agent,
        options=call_options(message.options) if message.HasField("options") else CallOptions(),
    )


def negotiate_request(message: negotiator_pb2.NegotiateRequest) -> CallRequest:
    """The call a dry run judges. Field paths in errors are relative to the call."""
    which = message.WhichOneof("call")
    if which == "produce":
        return produce_request(message.produce)
    if which == "invoke":
        return invoke_request(message.invoke)
    raise InvalidRequest([("call", "exactly one of produce or invoke is required")])


def _target(
    message: negotiator_pb2.ProduceRequest | negotiator_pb2.InvokeRequest,
) -> tuple[str | None, str | None]:
    which = message.WhichOneof("target")
    if which == "adapter":
        return message.adapter, None
    if which == "agent":
        return None, message.agent
    return None, None  # validate_request names the missing target


def call_options(message: negotiator_pb2.CallOptions) -> CallOptions:
    if message.conversation_id or message.no_wait or message.new_conversation:
        # Refused until conversations are built: a conversation id that were
        # silently ignored would promise transactions nobody keeps.
        raise NotImplementedYet("options.conversation_id (conversations)")
    problems: list[tuple[str, str]] = []
    allow_unknown: set[Capability] = set()
    for index, value in enumerate(message.allow_unknown):
        capability = CAPABILITY_FROM_PROTO.get(int(value))
        if capability is None:
            problems.append(
                (f"options.allow_unknown[{index}]", f"is not a capability (enum value {int(value)})")
            )
        else:
            allow_unknown.add(capability)
    settings: Mapping[str, JsonValue] = MappingProxyType({})
    if message.HasField("settings"):
        try:
            settings = MappingProxyType(struct_to_dict(message.settings))
        except ValueError as exc:
            problems.append(("options.settings", str(exc)))
    if problems:
        raise InvalidRequest(problems)
    return CallOptions(
        model=message.model if message.HasField("model") else None,
        effort=message.effort if message.HasField("effort") else None,
        settings=settings,
        profile=message.profile if message.HasField("profile") else None,
        mcp_servers=tuple(mcp_server(s) for s in message.mcp_servers),
        max_depth=max_depth(message.max_depth) if message.HasField("max_depth") else None,
        tool_filter=(
            ToolFilter(allow=tuple(message.tool_filter.allow), deny=tuple(message.tool_filter.deny))
            if message.HasField("tool_filter")
            else None
        ),
        persona=message.persona if message.HasField("persona") else None,
        stream_events=message.stream_events,
        allow_unknown=frozenset(allow_unknown),
    )


def mcp_server(message: negotiator_pb2.McpServer) -> McpServer:
    return McpServer(
        name=message.name,
        transport=message.transport,
        command=message.command,
        args=tuple(message.args),
        env=MappingProxyType(dict(message.env)),
        url=message.url,
        headers=MappingProxyType(dict(message.headers)),
    )


def max_depth(message: negotiator_pb2.MaxDepth) -> MaxDepth:
    which = message.WhichOneof("limit")
    if which == "depth":
        return MaxDepth(depth=message.depth)
    if which == "provider_managed":
        return MaxDepth(provider_managed=message.provider_managed)
    return MaxDepth()  # neither: validate_request reports it


def struct_to_dict(message: struct_pb2.Struct) -> dict[str, JsonValue]:
    """A Struct as plain JSON values, integral numbers as ints.

    Raises ValueError for a number JSON cannot carry (NaN, infinity).
    """
    converted: dict[str, JsonValue] = {key: _plain(message.fields[key]) for key in message.fields}
    return converted


def _plain(value: struct_pb2.Value) -> JsonValue:
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return struct_to_dict(value.struct_value)
    if kind == "list_value":
        return [_plain(item) for item in value.list_value.values]
    if kind == "number_value":
        number = value.number_value
        if not math.isfinite(number):
            raise ValueError(f"holds {number}, which is not a JSON number")
        if number.is_integer() and abs(number) <= _MAX_EXACT_INT:
            return int(number)
        return number
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    return None  # null_value, or a Value with nothing set


# --- declarations ---------------------------------------------------------------


def declaration_to_proto(declaration: Declaration) -> common_pb2.Declaration:
    return common_pb2.Declaration(
        shortname=declaration.shortname,
        kind=KIND_TO_PROTO[declaration.kind],
        capabilities=[
            common_pb2.CapabilityDeclaration(capability=CAPABILITY_TO_PROTO[c], state=STATE_TO_PROTO[s])
            for c, s in sorted(declaration.capabilities.items(), key=lambda kv: CAPABILITY_TO_PROTO[kv[0]])
        ],
        mcp_transports=sorted(declaration.mcp_transports),
        accepted_settings=sorted(declaration.accepted_settings),
        string_formats=sorted(declaration.string_formats),
        hook_events=sorted(declaration.hook_events),
        version=declaration.version,
        scripted=declaration.scripted,
    )


def adapter_to_proto(entry: RegisteredAdapter) -> negotiator_pb2.Adapter:
    return negotiator_pb2.Adapter(
        declaration=declaration_to_proto(entry.adapter.declaration),
        implementation=entry.adapter.implementation,
        source=SOURCE_TO_PROTO.get(entry.source, negotiator_pb2.ADAPTER_SOURCE_UNSPECIFIED),
        target=entry.target,
    )


def adapters_to_proto(entries: Iterable[RegisteredAdapter]) -> list[negotiator_pb2.Adapter]:
    return [adapter_to_proto(e) for e in entries]


def watch_response(change: Change, entry: RegisteredAdapter) -> negotiator_pb2.WatchAdaptersResponse:
    return negotiator_pb2.WatchAdaptersResponse(
        change=CHANGE_TO_PROTO[change], adapter=adapter_to_proto(entry)
    )


# --- decisions and replies --------------------------------------------------------


def requirement_to_proto(requirement: Requirement) -> negotiator_pb2.Requirement:
    return negotiator_pb2.Requirement(
        capability=CAPABILITY_TO_PROTO[requirement.capability],
        set=(
            TYPED_SET_TO_PROTO[requirement.typed_set]
            if requirement.typed_set is not None
            else common_pb2.TYPED_SET_UNSPECIFIED
        ),
        member=requirement.member,
        request_field=requirement.request_field,
    )


def verdict_to_proto(verdict: Verdict) -> negotiator_pb2.Verdict:
    return negotiator_pb2.Verdict(
        requirement=requirement_to_proto(verdict.requirement),
        state=STATE_TO_PROTO[verdict.state],
        allowed_unknown=verdict.allowed_unknown,
    )


def decision_to_proto(decision: Decision) -> negotiator_pb2.Decision:
    return negotiator_pb2.Decision(
        adapter=decision.adapter,
        declaration_version=decision.declaration_version,
        accepted=decision.accepted,
        verdicts=[verdict_to_proto(v) for v in decision.verdicts],
        gaps=[verdict_to_proto(v) for v in decision.gaps],
    )


def events_to_proto(events: Sequence[StreamEvent]) -> list[negotiator_pb2.StreamEvent]:
    return [negotiator_pb2.StreamEvent(type=e.type, text=e.text) for e in events]


def produce_response(reply: AdapterReply, decision: Decision) -> negotiator_pb2.ProduceResponse:
    return negotiator_pb2.ProduceResponse(
        output_json=reply.text, decision=decision_to_proto(decision), events=events_to_proto(reply.events)
    )


def invoke_response(reply: AdapterReply, decision: Decision) -> negotiator_pb2.InvokeResponse:
    return negotiator_pb2.InvokeResponse(
        text=reply.text, decision=decision_to_proto(decision), events=events_to_proto(reply.events)
    )
