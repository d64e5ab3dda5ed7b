"""A declaration's version is read once per object and follows every change made by `replace`."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from fakes import make_declaration

from agentsidecar.negotiator_service.model import Capability, CapabilityState


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
