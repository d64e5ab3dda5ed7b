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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2
from agentsidecar.negotiator_service.bootstrap_plan import BootstrapCall, BootstrapResult, Candidate
from agentsidecar.negotiator_service.declarations import validate_shortname
from agentsidecar.negotiator_service.errors import ConfigError, InvalidRequest
from agentsidecar.negotiator_service.model import (
    AdapterKind,
    AdapterReply,
    AuditRecord,
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
    StreamDelta,
    StreamEvent,
    ToolCallRecord,
    ToolFilter,
    ToolRisk,
    TypedSet,
    Usage,
    Verdict,
)
from agentsidecar.negotiator_service.probes import Probeable, ProbeEvidence, ProbeVerdict
from agentsidecar.negotiator_service.registry import Change, RegisteredAdapter
from agentsidecar.negotiator_service.tools import (
    ApprovalDecision,
    ApprovalMessage,
    ApprovalRequestMessage,
    CallerMessage,
    FinalResult,
    SessionMessage,
    StartMessage,
    ToolCallMessage,
    ToolDraft,
    ToolResultMessage,
)
from agentsidecar.sidecar_runtime.addresses import Address, parse_address
from agentsidecar.sidecar_runtime.wire_names import Gate, GateValue, Risk, RiskValue, UnknownGate, UnknownRisk

# Doubles hold every integer up to 2**53 exactly; beyond that a "whole"
# double is already rounded, so it stays a float rather than pretend precision.
_MAX_EXACT_INT = 2**53

# Enum members as module constants: reading one off its class goes through the enum
# metaclass's __getattr__ hook on every call, a module global does not.
_PRODUCE = CallKind.PRODUCE
_INVOKE = CallKind.INVOKE

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
        "updated": negotiator_pb2.ADAPTER_CHANGE_UPDATED,
    }
)


# --- requests -----------------------------------------------------------------


# How a request's CallOptions message becomes CallOptions: `call_options`, or a
# CallCaches' shared conversion (call_caches.py).
OptionsConverter = Callable[[negotiator_pb2.CallOptions], CallOptions]


def produce_request(
    message: negotiator_pb2.ProduceRequest, options_of: OptionsConverter | None = None
) -> CallRequest:
    adapter, agent = _target(message)
    return CallRequest(
        kind=_PRODUCE,
        prompt=message.prompt,
        adapter=adapter,
        agent=agent,
        output_schema=message.output_schema or None,
        options=(options_of or call_options)(message.options) if message.HasField("options") else _NO_OPTIONS,
    )


def invoke_request(
    message: negotiator_pb2.InvokeRequest, options_of: OptionsConverter | None = None
) -> CallRequest:
    adapter, agent = _target(message)
    return CallRequest(
        kind=_INVOKE,
        prompt=message.prompt,
        adapter=adapter,
        agent=agent,
        options=(options_of or call_options)(message.options) if message.HasField("options") else _NO_OPTIONS,
    )


def negotiate_request(
    message: negotiator_pb2.NegotiateRequest, options_of: OptionsConverter | None = None
) -> CallRequest:
    """The call a dry run judges. Field paths in errors are relative to the call."""
    which = message.WhichOneof("call")
    if which == "produce":
        return produce_request(message.produce, options_of)
    if which == "invoke":
        return invoke_request(message.invoke, options_of)
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


_NO_SETTINGS: Mapping[str, JsonValue] = MappingProxyType({})
_NO_OPTIONS = CallOptions()


def call_options(message: negotiator_pb2.CallOptions) -> CallOptions:
    """The options of a call; raises InvalidRequest naming every field that cannot be converted."""
    return _call_options(message)


def _call_options(message: negotiator_pb2.CallOptions) -> CallOptions:
    # One ListFields() instead of a HasField() and a getter per field: it holds
    # exactly the fields that are present (set `optional` ones even when "",
    # plain scalars only when not their default), which is what each needs.
    present = {field.name: value for field, value in message.ListFields()}
    problems: list[tuple[str, str]] = []
    allow_unknown: frozenset[Capability] = frozenset()
    if "allow_unknown" in present:
        allowed: set[Capability] = set()
        for index, value in enumerate(message.allow_unknown):
            capability = CAPABILITY_FROM_PROTO.get(int(value))
            if capability is None:
                problems.append(
                    (f"options.allow_unknown[{index}]", f"is not a capability (enum value {int(value)})")
                )
            else:
                allowed.add(capability)
        allow_unknown = frozenset(allowed)
    settings = _NO_SETTINGS
    if "settings" in present:
        try:
            settings = MappingProxyType(struct_to_dict(present["settings"]))
        except ValueError as exc:
            problems.append(("options.settings", str(exc)))
    if problems:
        raise InvalidRequest(problems)
    depth_message = present.get("max_depth")
    filter_message = present.get("tool_filter")
    return CallOptions(
        model=present.get("model"),
        effort=present.get("effort"),
        settings=settings,
        profile=present.get("profile"),
        mcp_servers=tuple(map(mcp_server, present["mcp_servers"])) if "mcp_servers" in present else (),
        max_depth=max_depth(depth_message) if depth_message is not None else None,
        tool_filter=(
            ToolFilter(allow=tuple(filter_message.allow), deny=tuple(filter_message.deny))
            if filter_message is not None
            else None
        ),
        persona=present.get("persona"),
        stream_events=present.get("stream_events", False),
        allow_unknown=allow_unknown,
        # proto3 has no presence for a plain string: "" is no conversation.
        conversation_id=present.get("conversation_id") or None,
        no_wait=present.get("no_wait", False),
        new_conversation=present.get("new_conversation", False),
        generate_conversation_id=present.get("generate_conversation_id", False),
        requires=tuple(present["requires"]) if "requires" in present else (),
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


def _capabilities_to_proto(declaration: Declaration) -> list[common_pb2.CapabilityDeclaration]:
    return [
        common_pb2.CapabilityDeclaration(capability=CAPABILITY_TO_PROTO[c], state=STATE_TO_PROTO[s])
        for c, s in sorted(declaration.capabilities.items(), key=lambda kv: CAPABILITY_TO_PROTO[kv[0]])
    ]


def declaration_to_proto(declaration: Declaration) -> common_pb2.Declaration:
    return common_pb2.Declaration(
        shortname=declaration.shortname,
        kind=KIND_TO_PROTO[declaration.kind],
        capabilities=_capabilities_to_proto(declaration),
        mcp_transports=sorted(declaration.mcp_transports),
        accepted_settings=sorted(declaration.accepted_settings),
        string_formats=sorted(declaration.string_formats),
        hook_events=sorted(declaration.hook_events),
        version=declaration.version,
        scripted=declaration.scripted,
        effort_levels=sorted(declaration.effort_levels),
        default_model=declaration.default_model,
        models=[
            common_pb2.ModelDeclaration(
                model=name,
                capabilities=_capabilities_to_proto(entry),
                mcp_transports=sorted(entry.mcp_transports),
                accepted_settings=sorted(entry.accepted_settings),
                string_formats=sorted(entry.string_formats),
                hook_events=sorted(entry.hook_events),
                effort_levels=sorted(entry.effort_levels),
            )
            for name, entry in sorted(declaration.models.items())
        ],
    )


PROBE_VERDICT_TO_PROTO: Mapping[ProbeVerdict, negotiator_pb2.ProbeVerdict.ValueType] = MappingProxyType(
    {
        ProbeVerdict.PASSED: negotiator_pb2.PROBE_VERDICT_PASSED,
        ProbeVerdict.FAILED: negotiator_pb2.PROBE_VERDICT_FAILED,
        ProbeVerdict.INCONCLUSIVE: negotiator_pb2.PROBE_VERDICT_INCONCLUSIVE,
    }
)


def probe_evidence_to_proto(evidence: ProbeEvidence) -> negotiator_pb2.ProbeEvidence:
    time = timestamp_pb2.Timestamp()
    time.FromDatetime(evidence.time)
    capability = evidence.capability
    return negotiator_pb2.ProbeEvidence(
        model=evidence.model,
        probe=evidence.kind.value,
        capability=(
            CAPABILITY_TO_PROTO[capability] if capability is not None else common_pb2.CAPABILITY_UNSPECIFIED
        ),
        verdict=PROBE_VERDICT_TO_PROTO[evidence.verdict],
        time=time,
        request=evidence.request,
        reply=evidence.reply,
        detail=evidence.detail,
    )


def adapter_to_proto(entry: RegisteredAdapter) -> negotiator_pb2.Adapter:
    not_serving = entry.serving_detail
    evidence = entry.adapter.probe_evidence if isinstance(entry.adapter, Probeable) else {}
    return negotiator_pb2.Adapter(
        declaration=declaration_to_proto(entry.adapter.declaration),
        implementation=entry.adapter.implementation,
        source=SOURCE_TO_PROTO.get(entry.source, negotiator_pb2.ADAPTER_SOURCE_UNSPECIFIED),
        target=entry.target,
        serving_status=(
            negotiator_pb2.ADAPTER_SERVING_STATUS_NOT_SERVING
            if not_serving
            else negotiator_pb2.ADAPTER_SERVING_STATUS_SERVING
        ),
        serving_detail=not_serving,
        probe_evidence=[
            probe_evidence_to_proto(item) for model in sorted(evidence) for item in evidence[model]
        ],
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
    """The decision's proto: its verdicts (and gaps) as `verdict_to_proto` converts them.

    Each verdict is added in place and filled field by field, rather than
    built as a message of its own and copied in; a field left at its
    default (no typed set) is not set, which proto3 encodes alike.
    """
    message = negotiator_pb2.Decision(
        adapter=decision.adapter,
        declaration_version=decision.declaration_version,
        accepted=decision.accepted,
        model=decision.model,
    )
    _add_verdicts(message.verdicts, decision.verdicts)
    if decision.gaps:
        _add_verdicts(message.gaps, decision.gaps)
    return message


def _add_verdicts(
    field: RepeatedCompositeFieldContainer[negotiator_pb2.Verdict], verdicts: Iterable[Verdict]
) -> None:
    """Append each verdict to a repeated Verdict field, as `verdict_to_proto` converts it."""
    for verdict in verdicts:
        requirement = verdict.requirement
        added = field.add(state=STATE_TO_PROTO[verdict.state], allowed_unknown=verdict.allowed_unknown)
        converted = added.requirement
        converted.capability = CAPABILITY_TO_PROTO[requirement.capability]
        if requirement.typed_set is not None:
            converted.set = TYPED_SET_TO_PROTO[requirement.typed_set]
        converted.member = requirement.member
        converted.request_field = requirement.request_field


# How a reply's decision becomes its proto: `decision_to_proto`, or a
# CallCaches' shared proto (call_caches.py). Replies copy it, never change it.
DecisionConverter = Callable[[Decision], negotiator_pb2.Decision]


def events_to_proto(events: Sequence[StreamEvent]) -> list[negotiator_pb2.StreamEvent]:
    return [negotiator_pb2.StreamEvent(type=e.type, text=e.text) for e in events]


def negotiate_response(
    decision: Decision, decision_of: DecisionConverter = decision_to_proto
) -> negotiator_pb2.NegotiateResponse:
    response = negotiator_pb2.NegotiateResponse()
    response.decision.CopyFrom(decision_of(decision))
    return response


def produce_response(
    reply: AdapterReply, decision: Decision, decision_of: DecisionConverter = decision_to_proto
) -> negotiator_pb2.ProduceResponse:
    response = negotiator_pb2.ProduceResponse(output_json=reply.text)
    response.decision.CopyFrom(decision_of(decision))
    if reply.events:
        response.events.extend(events_to_proto(reply.events))
    if reply.usage is not None:
        response.usage.CopyFrom(usage_to_proto(reply.usage))
    return response


def invoke_response(
    reply: AdapterReply, decision: Decision, decision_of: DecisionConverter = decision_to_proto
) -> negotiator_pb2.InvokeResponse:
    response = negotiator_pb2.InvokeResponse(text=reply.text)
    response.decision.CopyFrom(decision_of(decision))
    if reply.events:
        response.events.extend(events_to_proto(reply.events))
    if reply.usage is not None:
        response.usage.CopyFrom(usage_to_proto(reply.usage))
    return response


def usage_to_proto(usage: Usage) -> negotiator_pb2.Usage:
    return negotiator_pb2.Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        cached_tokens=usage.cached_tokens,
    )


# --- audit ---------------------------------------------------------------------------


def audit_record_to_proto(record: AuditRecord) -> negotiator_pb2.AuditRecord:
    time = timestamp_pb2.Timestamp()
    time.FromDatetime(record.time)
    return negotiator_pb2.AuditRecord(
        time=time,
        caller=record.caller,
        operation=record.operation,
        adapter=record.adapter,
        declaration_version=record.declaration_version,
        verdicts=[verdict_to_proto(v) for v in record.verdicts],
        outcome=record.outcome.value,
        error_reason=record.error_reason,
        allowed_unknown=[CAPABILITY_TO_PROTO[c] for c in record.allowed_unknown],
        conversation_id=record.conversation_id,
        delegation_depth=record.delegation_depth,
        seed=record.seed,
        usage=usage_to_proto(record.usage) if record.usage is not None else None,
        tool_calls=[tool_call_record_to_proto(call) for call in record.tool_calls],
    )


def tool_call_record_to_proto(record: ToolCallRecord) -> negotiator_pb2.ToolCallRecord:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(round(record.duration_seconds * 1e9))
    risk = record.risk
    return negotiator_pb2.ToolCallRecord(
        function=record.function,
        server=record.server,
        tool=record.tool,
        risk=TOOL_RISK_TO_PROTO[risk] if risk is not None else negotiator_pb2.TOOL_RISK_UNSPECIFIED,
        decision=record.decision.value,
        approval=record.approval.value,
        duration=duration,
        error=record.error,
    )


def watch_audit_response(record: AuditRecord) -> negotiator_pb2.WatchAuditResponse:
    return negotiator_pb2.WatchAuditResponse(record=audit_record_to_proto(record))


# --- tool sessions ------------------------------------------------------------------

TOOL_RISK_TO_PROTO: Mapping[ToolRisk, negotiator_pb2.ToolRisk.ValueType] = MappingProxyType(
    {r: negotiator_pb2.ToolRisk.Value(f"TOOL_RISK_{r.name}") for r in ToolRisk}
)
# UNSPECIFIED is MUTATING, the safe default the proto documents.
TOOL_RISK_FROM_PROTO: Mapping[int, ToolRisk] = MappingProxyType(
    {int(negotiator_pb2.TOOL_RISK_UNSPECIFIED): ToolRisk.MUTATING}
    | {int(v): r for r, v in TOOL_RISK_TO_PROTO.items()}
)
APPROVAL_FROM_PROTO: Mapping[int, ApprovalDecision] = MappingProxyType(
    {int(negotiator_pb2.ApprovalDecision.Value(f"APPROVAL_DECISION_{d.name}")): d for d in ApprovalDecision}
)


def tool_session_request(message: negotiator_pb2.ToolSessionRequest) -> CallerMessage:
    """One caller message of a ToolSession; field paths start at the ToolSessionRequest."""
    which = message.WhichOneof("message")
    if which == "start":
        return tool_session_start(message.start)
    if which == "tool_result":
        result = message.tool_result
        outcome = result.WhichOneof("outcome")
        return ToolResultMessage(
            call_id=result.call_id,
            result_json=result.result_json if outcome == "result_json" else None,
            error=result.error if outcome == "error" else None,
        )
    if which == "approval":
        approval = message.approval
        decision = APPROVAL_FROM_PROTO.get(int(approval.decision))
        if decision is None:
            raise InvalidRequest(
                [("approval.decision", f"must be ALLOW, DENY or EDIT (enum value {int(approval.decision)})")]
            )
        return ApprovalMessage(
            call_id=approval.call_id,
            decision=decision,
            edited_arguments_json=approval.edited_arguments_json,
            reason=approval.reason,
        )
    raise InvalidRequest([("message", "exactly one of start, tool_result or approval is required")])


def tool_session_start(message: negotiator_pb2.ToolSessionStart) -> StartMessage:
    which = message.WhichOneof("call")
    if which is None:
        raise InvalidRequest([("start.call", "exactly one of produce or invoke is required")])
    try:
        call = produce_request(message.produce) if which == "produce" else invoke_request(message.invoke)
    except InvalidRequest as error:
        raise InvalidRequest([(f"start.{which}.{f}", d) for f, d in error.violations]) from error
    problems: list[tuple[str, str]] = []
    drafts: list[ToolDraft] = []
    for index, spec in enumerate(message.tools):
        risk = TOOL_RISK_FROM_PROTO.get(int(spec.risk))
        if risk is None:
            problems.append(
                (f"start.tools[{index}].risk", f"is not a tool risk (enum value {int(spec.risk)})")
            )
            continue
        drafts.append(
            ToolDraft(
                name=spec.name,
                arguments_schema=spec.arguments_schema,
                description=spec.description,
                return_schema=spec.return_schema,
                metadata=MappingProxyType(dict(spec.metadata)),
                risk=risk,
            )
        )
    if problems:
        raise InvalidRequest(problems)
    return StartMessage(call=call, tools=tuple(drafts), call_field=f"start.{which}", stream=message.stream)


def tool_session_response(message: SessionMessage) -> negotiator_pb2.ToolSessionResponse:
    if isinstance(message, StreamDelta):
        return negotiator_pb2.ToolSessionResponse(delta=message.text)
    if isinstance(message, StreamEvent):
        return negotiator_pb2.ToolSessionResponse(
            event=negotiator_pb2.StreamEvent(type=message.type, text=message.text)
        )
    if isinstance(message, Decision):
        response = negotiator_pb2.ToolSessionResponse()
        response.decision.CopyFrom(decision_to_proto(message))
        return response
    if isinstance(message, ToolCallMessage):
        return negotiator_pb2.ToolSessionResponse(
            tool_call=negotiator_pb2.ToolCall(
                call_id=message.call_id,
                name=message.name,
                arguments_json=message.arguments_json,
                risk=TOOL_RISK_TO_PROTO[message.risk],
            )
        )
    if isinstance(message, ApprovalRequestMessage):
        return negotiator_pb2.ToolSessionResponse(
            approval_request=negotiator_pb2.ApprovalRequest(
                call_id=message.call_id,
                tool_name=message.tool_name,
                arguments_json=message.arguments_json,
                risk=TOOL_RISK_TO_PROTO[message.risk],
                adapter=message.adapter,
                description=message.description,
                metadata=dict(message.metadata),
            )
        )
    assert isinstance(message, FinalResult)
    conversation_id = message.conversation_id or ""
    if message.kind is CallKind.PRODUCE:
        produced = produce_response(message.reply, message.decision)
        produced.conversation_id = conversation_id
        return negotiator_pb2.ToolSessionResponse(produce_result=produced)
    invoked = invoke_response(message.reply, message.decision)
    invoked.conversation_id = conversation_id
    return negotiator_pb2.ToolSessionResponse(invoke_result=invoked)


# --- capability bootstrap -------------------------------------------------------------

# Gates and risks <-> the proto enums, matched by member name (agentsidecar.sidecar_runtime.wire_names).
GATE_TO_PROTO: Mapping[Gate, common_pb2.Gate.ValueType] = MappingProxyType(
    {g: common_pb2.Gate.Value(f"GATE_{g.name}") for g in Gate}
)
GATE_FROM_PROTO: Mapping[int, Gate] = MappingProxyType({int(v): g for g, v in GATE_TO_PROTO.items()})
RISK_TO_PROTO: Mapping[Risk, common_pb2.RiskFlag.ValueType] = MappingProxyType(
    {r: common_pb2.RiskFlag.Value(f"RISK_FLAG_{r.name}") for r in Risk}
)
RISK_FROM_PROTO: Mapping[int, Risk] = MappingProxyType({int(v): r for r, v in RISK_TO_PROTO.items()})


def gates_from_proto(values: Iterable[int]) -> tuple[GateValue, ...]:
    """Gates as the seedstore sent them, in its order; a number this build does not know is kept."""
    return tuple(GATE_FROM_PROTO.get(int(v)) or UnknownGate(int(v)) for v in values)


def risks_from_proto(values: Iterable[int]) -> tuple[RiskValue, ...]:
    return tuple(RISK_FROM_PROTO.get(int(v)) or UnknownRisk(int(v)) for v in values)


def _gate_to_proto(gate: GateValue) -> common_pb2.Gate.ValueType:
    if isinstance(gate, UnknownGate):
        return common_pb2.Gate.ValueType(gate.number)
    return GATE_TO_PROTO[gate]


def _risk_to_proto(risk: RiskValue) -> common_pb2.RiskFlag.ValueType:
    if isinstance(risk, UnknownRisk):
        return common_pb2.RiskFlag.ValueType(risk.number)
    return RISK_TO_PROTO[risk]


def bootstrap_request(message: negotiator_pb2.BootstrapRequest) -> BootstrapCall:
    """Shape only: `bootstrap_plan.validate_call` judges the fields. "" is an absent domain, seed or prompt.

    Only gates this build names can be approved: any other number is refused here.
    """
    gates: set[Gate] = set()
    problems: list[tuple[str, str]] = []
    for index, value in enumerate(message.approved_gates):
        gate = GATE_FROM_PROTO.get(int(value))
        if gate is None:
            problems.append((f"approved_gates[{index}]", f"is not a gate (enum value {int(value)})"))
        else:
            gates.add(gate)
    if problems:
        raise InvalidRequest(problems)
    return BootstrapCall(
        capability=message.capability,
        domain=message.domain or None,
        local_only=message.local_only,
        seed=message.seed or None,
        approved_gates=frozenset(gates),
        run=message.run,
        prompt=message.prompt,
    )


def candidate_to_proto(candidate: Candidate) -> common_pb2.Candidate:
    return common_pb2.Candidate(
        id=candidate.id,
        domain=candidate.domain,
        path=candidate.path,
        score=candidate.score,
        reasons=candidate.reasons,
        risks=[_risk_to_proto(r) for r in candidate.risks],
        required_gates=[_gate_to_proto(g) for g in candidate.required_gates],
        matched_capability=candidate.matched_capability,
        matched_domain=candidate.matched_domain,
    )


def bootstrap_response(result: BootstrapResult) -> negotiator_pb2.BootstrapResponse:
    response = negotiator_pb2.BootstrapResponse(
        candidates=[candidate_to_proto(c) for c in result.candidates], selected=result.selected or ""
    )
    if result.ask_policy is not None:
        response.ask_policy.reason = result.ask_policy
    if result.run is not None:
        run = result.run
        response.run.CopyFrom(
            negotiator_pb2.BootstrapRun(
                seed=run.seed,
                argv=run.argv,
                exit_code=run.exit_code,
                output=run.output,
                evidence=run.evidence,
            )
        )
    return response


@dataclass(frozen=True, slots=True)
class RemoteRegistration:
    """A RegisterAdapter request, checked: where the adapter listens and the shortname it must have."""

    address: Address
    shortname: str  # "" when the caller expects none in particular


def register_adapter_request(request: negotiator_pb2.RegisterAdapterRequest) -> RemoteRegistration:
    """The registration a RegisterAdapter asks for; InvalidRequest names every bad field at once."""
    problems: list[tuple[str, str]] = []
    address: Address | None = None
    if not request.target:
        problems.append(("target", "is required: unix:PATH or HOST:PORT"))
    else:
        try:
            address = parse_address(request.target)
        except ValueError as exc:
            problems.append(("target", str(exc)))
    if request.shortname:
        try:
            validate_shortname(request.shortname)
        except ConfigError as exc:
            problems.append(("shortname", exc.message))
    if problems or address is None:
        raise InvalidRequest(problems)
    return RemoteRegistration(address, request.shortname)


def probe_model(request: negotiator_pb2.ProbeAdapterRequest) -> str:
    """The model a ProbeAdapter names ("": the adapter's own); InvalidRequest for one it could not be."""
    model = request.model
    if model != model.strip() or (model and not model.isprintable()):
        raise InvalidRequest(
            [("model", "must be a model name without surrounding space or control characters")]
        )
    return model
