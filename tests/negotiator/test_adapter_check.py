"""An adapter's own check reads the broker's judgement of the very call it judged, and judges any other."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import pytest
from fakes import FakeAdapter, make_declaration

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.adapters._calls import ALL_CAPABILITIES, _judged_honoured, check_call
from agentsidecar.negotiator_service.adapters.scripted import IMPLEMENTED, ScriptedAdapter
from agentsidecar.negotiator_service.broker import Broker
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterKind,
    AdapterSpec,
    CallKind,
    CallOptions,
    CallRequest,
    Capability,
    CapabilityState,
    DeclarationOverride,
)
from agentsidecar.negotiator_service.negotiation import derive_requirements, judge
from agentsidecar.negotiator_service.registry import AdapterRegistry, RegisteredAdapter

SUPPORTED = CapabilityState.SUPPORTED
SCHEMA = {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}}


def scripted_adapter() -> ScriptedAdapter:
    spec = AdapterSpec(
        shortname="demo",
        implementation="scripted",
        declaration=DeclarationOverride(
            kind=AdapterKind.FRAMEWORK,
            capabilities=MappingProxyType(
                {Capability.MODEL_OVERRIDE: SUPPORTED, Capability.STRUCTURED_OUTPUT: SUPPORTED}
            ),
            string_formats=frozenset({"date"}),
        ),
        options=MappingProxyType({"invoke": {"echo": True}, "produce": {"json": {"when": "2026-01-01"}}}),
    )
    adapter = build_adapter(spec)
    assert isinstance(adapter, ScriptedAdapter)
    return adapter


def broker_with(adapter: Any) -> Broker:
    registry = AdapterRegistry()
    registry.add(RegisteredAdapter(adapter=adapter, source="config"))
    return Broker(registry)


def judged_call(adapter: Any, call: AdapterCall, kind: CallKind) -> AdapterCall:
    """`call` with a judgement of its own objects, as the broker makes one (accepted or not)."""
    request = CallRequest(kind=kind, prompt=call.prompt, options=call.options)
    requirements = derive_requirements(request, call.output_schema)
    decision = judge(adapter.declaration, requirements, call.options.allow_unknown, call.options.model)
    judgement = (decision, adapter.declaration, kind, call.options, call.output_schema, call.tools)
    return dataclasses.replace(call, judgement=judgement)


async def test_a_brokered_call_carries_the_judgement_its_adapter_reads() -> None:
    # A recording adapter sees exactly what the broker hands the scripted one.
    declaration = make_declaration("rec", supported=[Capability.MODEL_OVERRIDE, Capability.STRUCTURED_OUTPUT])
    recorder = FakeAdapter(declaration)
    broker = broker_with(recorder)
    await broker.call(
        CallRequest(kind=CallKind.INVOKE, prompt="hi", adapter="rec", options=CallOptions(model="m")),
        time_budget=None,
    )
    [(_, received)] = recorder.calls
    assert received.judgement is not None
    decision, judged, kind, options, schema, tools = received.judgement
    assert judged is declaration
    assert kind is CallKind.INVOKE
    assert options is received.options
    assert schema is None
    assert tools is None
    assert decision.accepted
    assert [v.requirement.capability for v in decision.verdicts] == [Capability.MODEL_OVERRIDE]
    assert _judged_honoured(declaration, received, CallKind.INVOKE, ALL_CAPABILITIES)


async def test_a_brokered_produce_with_a_schema_reaches_the_scripted_adapter() -> None:
    adapter = scripted_adapter()
    broker = broker_with(adapter)
    request = CallRequest(
        kind=CallKind.PRODUCE,
        prompt="when?",
        adapter="demo",
        output_schema='{"type": "object", "properties": {"when": {"type": "string", "format": "date"}}}',
        options=CallOptions(model="m"),
    )
    reply, decision = await broker.call(request, time_budget=None)
    assert reply.text == '{"when": "2026-01-01"}'
    assert decision.accepted
    assert adapter.received[-1]["output_schema"] == SCHEMA


async def test_a_call_without_a_judgement_is_judged_by_the_adapter() -> None:
    adapter = scripted_adapter()
    with pytest.raises(errors.AdapterRefused, match=r"options\.effort needs effort"):
        await adapter.invoke(AdapterCall(prompt="hi", options=CallOptions(effort="high")))


async def test_a_judgement_of_other_options_is_not_read() -> None:
    # The broker judged plain options; the call now carries others needing what the adapter lacks.
    adapter = scripted_adapter()
    plain = judged_call(adapter, AdapterCall(prompt="hi", options=CallOptions()), CallKind.INVOKE)
    assert _judged_honoured(adapter.declaration, plain, CallKind.INVOKE, IMPLEMENTED)
    swapped = dataclasses.replace(plain, options=CallOptions(effort="high"))
    assert not _judged_honoured(adapter.declaration, swapped, CallKind.INVOKE, IMPLEMENTED)
    with pytest.raises(errors.AdapterRefused, match=r"options\.effort needs effort"):
        await adapter.invoke(swapped)


async def test_a_judgement_of_another_schema_tools_kind_or_declaration_is_not_read() -> None:
    adapter = scripted_adapter()
    declaration = adapter.declaration
    produce = judged_call(
        adapter, AdapterCall(prompt="hi", options=CallOptions(), output_schema=SCHEMA), CallKind.PRODUCE
    )
    assert _judged_honoured(declaration, produce, CallKind.PRODUCE, IMPLEMENTED)
    # An unlisted format: the adapter's own judgement refuses it, the broker's (of SCHEMA) would not.
    other_schema = {"type": "string", "format": "email"}
    swapped = dataclasses.replace(produce, output_schema=other_schema)
    assert not _judged_honoured(declaration, swapped, CallKind.PRODUCE, IMPLEMENTED)
    with pytest.raises(errors.AdapterRefused, match="string_formats:email"):
        await adapter.produce(swapped)
    assert not _judged_honoured(declaration, produce, CallKind.INVOKE, IMPLEMENTED)
    assert not _judged_honoured(dataclasses.replace(declaration), produce, CallKind.PRODUCE, IMPLEMENTED)
    with_tools = dataclasses.replace(produce, tools=FakeToolBox())
    assert not _judged_honoured(declaration, with_tools, CallKind.PRODUCE, IMPLEMENTED)


def test_a_refused_or_unimplemented_verdict_is_judged_afresh_with_the_same_message() -> None:
    # Declared SUPPORTED, but not implemented by the code asking: the broker's acceptance is not enough.
    declaration = make_declaration("all", supported=list(Capability), accepted_settings=["seed"])
    call = AdapterCall(prompt="hi", options=CallOptions(model="m", settings=MappingProxyType({"seed": 1})))
    fresh_message = ""
    try:
        check_call(declaration, call, CallKind.INVOKE, implemented=frozenset({Capability.MODEL_OVERRIDE}))
    except errors.AdapterRefused as error:
        fresh_message = str(error)
    assert "options.settings needs settings" in fresh_message
    request = CallRequest(kind=CallKind.INVOKE, prompt="hi", options=call.options)
    decision = judge(declaration, derive_requirements(request, None), frozenset(), "m")
    assert decision.accepted
    judged = dataclasses.replace(
        call, judgement=(decision, declaration, CallKind.INVOKE, call.options, None, None)
    )
    with pytest.raises(errors.AdapterRefused) as refused:
        check_call(declaration, judged, CallKind.INVOKE, implemented=frozenset({Capability.MODEL_OVERRIDE}))
    assert str(refused.value) == fresh_message
    # A judgement whose decision refused is judged afresh too (an adapter never trusts a refusal as a pass).
    narrow = make_declaration("all", supported=[Capability.MODEL_OVERRIDE])
    refusing = judge(narrow, derive_requirements(request, None), frozenset(), "m")
    assert not refusing.accepted
    trusting = dataclasses.replace(
        call, judgement=(refusing, declaration, CallKind.INVOKE, call.options, None, None)
    )
    assert not _judged_honoured(declaration, trusting, CallKind.INVOKE, ALL_CAPABILITIES)
    check_call(declaration, trusting, CallKind.INVOKE, implemented=ALL_CAPABILITIES)  # afresh: it passes


class FakeToolBox:
    specs = ()

    async def call(self, name: str, arguments: Any) -> Any:
        raise AssertionError("no tool is called here")
