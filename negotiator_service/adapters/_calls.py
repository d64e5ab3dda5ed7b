"""What every adapter checks before it does any work: the call, and the clock.

The broker judges a call before dispatch, but an adapter is the last place a
field can be silently dropped, so each adapter judges again with the same
rules (`negotiation.derive_requirements` and `judge`) and additionally refuses
what its own code does not implement.

A call the broker dispatched carries the broker's judgement
(`AdapterCall.judgement`): the decision and the very objects it judged. When
those are the objects the adapter's check would read (its declaration, the
kind it is asked for, the call's options, parsed schema and ToolBox), judging
again would derive the same requirements from them (the broker's names a
profile's fields by their profile, and may add the tools the call's filter
hides, never fewer) and reach the same verdicts, so the check reads the
decision's verdicts instead: it passes when every one is accepted and
implemented. Anything else (no judgement, another object, a verdict the
decision has not accepted or the code does not implement) is judged afresh
as before, so every refusal and its message stay what a fresh judgement says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agentsidecar.negotiator_service.errors import AdapterRefused, AdapterTimeout
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    CallKind,
    CallRequest,
    Capability,
    Declaration,
    JsonValue,
)
from agentsidecar.negotiator_service.negotiation import derive_requirements, judge

ALL_CAPABILITIES = frozenset(Capability)

# Enum members as module constants: reading one off its class goes through the enum
# metaclass's __getattr__ hook on every call, a module global does not.
_PRODUCE = CallKind.PRODUCE
_INVOKE = CallKind.INVOKE


def check_call(
    declaration: Declaration,
    call: AdapterCall,
    kind: CallKind,
    *,
    implemented: frozenset[Capability],
) -> None:
    """Raise AdapterRefused naming every field of `call` this adapter would not honour.

    A field is honoured only when the effective declaration accepts it (SUPPORTED,
    or UNKNOWN and allowed by the caller) and the adapter's code implements it.
    """
    shortname = declaration.shortname
    if kind is _PRODUCE and call.output_schema is None:
        raise AdapterRefused(shortname, "Produce needs an output schema")
    if kind is _INVOKE and call.output_schema is not None:
        raise AdapterRefused(shortname, "Invoke returns plain text; it takes no output schema")
    if _judged_honoured(declaration, call, kind, implemented):
        return
    refusal = _refusal(declaration, call, kind, implemented)
    if refusal:
        raise AdapterRefused(shortname, refusal)


def _judged_honoured(
    declaration: Declaration, call: AdapterCall, kind: CallKind, implemented: frozenset[Capability]
) -> bool:
    """Whether the broker's judgement of these very objects accepted every verdict this code implements."""
    judgement = call.judgement
    if judgement is None:
        return False
    decision, judged_declaration, judged_kind, options, output_schema, tools = judgement
    if (
        judged_declaration is not declaration
        or judged_kind is not kind
        or options is not call.options
        or output_schema is not call.output_schema
        or tools is not call.tools
    ):
        return False
    return decision.accepted and decision.capabilities <= implemented


def _refusal(
    declaration: Declaration, call: AdapterCall, kind: CallKind, implemented: frozenset[Capability]
) -> str:
    """What `check_call` refuses the call with; "" when the adapter honours all of it."""
    tools = call.tools.specs if call.tools is not None else ()
    request = CallRequest(kind=kind, prompt=call.prompt, options=call.options, tools=tools)
    requirements = derive_requirements(request, call.output_schema if kind is CallKind.PRODUCE else None)
    decision = judge(declaration, requirements, call.options.allow_unknown, call.options.model)
    refused = [
        f"{verdict.requirement.request_field} needs {verdict.requirement.describe()}"
        for verdict in decision.verdicts
        if not verdict.accepted or verdict.requirement.capability not in implemented
    ]
    if refused:
        return "this adapter does not honour " + "; ".join(refused)
    return ""


@dataclass(frozen=True, slots=True)
class Deadline:
    """How long a call may run, and which limit set that."""

    seconds: float | None  # None: no limit at all
    limit: str

    def expired(self, adapter: str) -> AdapterTimeout:
        return AdapterTimeout(adapter, f"no answer within {self.seconds:g} s ({self.limit})")


def call_deadline(
    adapter: str,
    budget: float | None,
    configured: float | None = None,
    configured_limit: str = "the adapter's timeout_seconds",
) -> Deadline:
    """The tighter of the caller's remaining time and the adapter's own timeout.

    A budget already spent fails at once: starting work nobody waits for
    wastes a process or a provider request.
    """
    if budget is not None and budget <= 0:
        raise AdapterTimeout(adapter, "the caller's time budget was already spent")
    if budget is not None and (configured is None or budget <= configured):
        return Deadline(budget, "the caller's time budget")
    if configured is not None:
        return Deadline(configured, configured_limit)
    return Deadline(None, "no deadline")


def plain_json(value: JsonValue, *, integral_floats: bool = False) -> JsonValue:
    """`value` as plain dicts and lists (json.dumps refuses MappingProxyType)."""
    if isinstance(value, Mapping):
        return {str(k): plain_json(v, integral_floats=integral_floats) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_json(v, integral_floats=integral_floats) for v in value]
    if integral_floats and isinstance(value, float) and value.is_integer():
        return int(value)
    return value
