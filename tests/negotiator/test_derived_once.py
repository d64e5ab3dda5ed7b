"""What is derived once per immutable object (a declaration's version, what call options need)
follows every change `replace` makes and takes no part in equality."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from fakes import make_declaration

from agentsidecar.negotiator_service import negotiation
from agentsidecar.negotiator_service.model import (
    CallKind,
    CallOptions,
    CallRequest,
    Capability,
    CapabilityState,
    Requirement,
    TypedSet,
)


def test_a_replaced_declaration_has_the_version_of_its_own_fields() -> None:
    declaration = make_declaration(supported=[Capability.STRUCTURED_OUTPUT], string_formats=["date"])
    version = declaration.version
    assert declaration.version == version
    widened = dataclasses.replace(declaration, string_formats=frozenset({"date", "email"}))
    assert widened.version != version
    assert dataclasses.replace(widened, string_formats=frozenset({"date"})).version == version
    refused = dataclasses.replace(
        declaration,
        capabilities=MappingProxyType({Capability.STRUCTURED_OUTPUT: CapabilityState.UNSUPPORTED}),
    )
    assert refused.version != version
    assert refused == dataclasses.replace(refused)  # the kept version takes no part in equality
    assert make_declaration(supported=[Capability.STRUCTURED_OUTPUT], string_formats=["date"]) == declaration


def test_options_need_what_their_own_fields_say_however_often_they_are_judged() -> None:
    options = CallOptions(model="m", settings=MappingProxyType({"seed": 7, "temperature": 0.2}))
    needs = negotiation.options_requirements(options)
    assert needs == (
        Requirement(Capability.MODEL_OVERRIDE, "options.model"),
        Requirement(Capability.SETTINGS, "options.settings"),
        Requirement(Capability.SETTINGS, "options.settings.seed", TypedSet.ACCEPTED_SETTINGS, "seed"),
        Requirement(
            Capability.SETTINGS, "options.settings.temperature", TypedSet.ACCEPTED_SETTINGS, "temperature"
        ),
    )
    assert negotiation.options_requirements(options) is needs
    invoke = CallRequest(kind=CallKind.INVOKE, prompt="p", adapter="a", options=options)
    assert negotiation.derive_requirements(invoke, None) == needs
    produce = dataclasses.replace(invoke, kind=CallKind.PRODUCE, output_schema='{"format": "date"}')
    assert negotiation.derive_requirements(produce, {"format": "date"}) == (
        Requirement(Capability.STRUCTURED_OUTPUT, "output_schema"),
        Requirement(Capability.STRUCTURED_OUTPUT, "output_schema/format", TypedSet.STRING_FORMATS, "date"),
        *needs,
    )
    narrowed = dataclasses.replace(options, model=None, persona="p")
    assert negotiation.options_requirements(narrowed) == (
        *needs[1:],
        Requirement(Capability.PERSONA, "options.persona"),
    )
    assert negotiation.options_requirements(options) is needs
    assert dataclasses.replace(options) == options == CallOptions(model="m", settings=options.settings)
