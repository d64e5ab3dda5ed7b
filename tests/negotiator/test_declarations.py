"""Shortnames and narrowing: config may say less than the code, never more."""

from __future__ import annotations

import pytest
from fakes import make_declaration

from agentsidecar.negotiator_service.declarations import declaration_from_override, narrow, validate_shortname
from agentsidecar.negotiator_service.errors import ConfigError
from agentsidecar.negotiator_service.model import (
    AdapterKind,
    Capability,
    CapabilityState,
    Declaration,
    DeclarationOverride,
)

SUPPORTED = CapabilityState.SUPPORTED
UNKNOWN = CapabilityState.UNKNOWN
UNSUPPORTED = CapabilityState.UNSUPPORTED

CODE = make_declaration(
    "code-name",
    AdapterKind.FRAMEWORK,
    supported=[Capability.STRUCTURED_OUTPUT, Capability.MCP, Capability.SETTINGS],
    unsupported=[Capability.PERSONA],
    mcp_transports=["stdio", "http"],
    accepted_settings=["temperature", "seed"],
    string_formats=["email", "date"],
)


@pytest.mark.parametrize("name", ["a", "demo", "shell-echo", "gpt_4o-mini", "a" * 63, "x9"])
def test_valid_shortnames_are_returned(name: str) -> None:
    assert validate_shortname(name) == name


@pytest.mark.parametrize(
    "name", ["", "Demo", "9lives", "-x", "_x", "a" * 64, "has space", "dot.ted", "demo\n", "ünïcode"]
)
def test_invalid_shortnames_are_refused_by_name(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_shortname(name)
    assert repr(name) in caught.value.message


def test_no_override_keeps_the_code_declaration_under_the_configured_shortname() -> None:
    narrowed = narrow(CODE, None, shortname="fast")
    assert narrowed.shortname == "fast"
    assert narrowed.kind is CODE.kind
    assert dict(narrowed.capabilities) == dict(CODE.capabilities)
    assert narrowed.mcp_transports == CODE.mcp_transports


def test_narrowing_moves_capabilities_down_and_shrinks_sets() -> None:
    override = DeclarationOverride(
        kind=AdapterKind.FRAMEWORK,
        capabilities={
            Capability.STRUCTURED_OUTPUT: UNSUPPORTED,
            Capability.MCP: UNKNOWN,
            Capability.TOOL_FILTER: UNSUPPORTED,  # undeclared in code (unknown) -> unsupported
            Capability.PERSONA: UNSUPPORTED,  # same state is not wider
        },
        mcp_transports=frozenset({"stdio"}),
        accepted_settings=frozenset(),
        string_formats=None,  # not mentioned: the code's set stays
    )
    narrowed = narrow(CODE, override, shortname="fast", implementation="openai")
    assert narrowed.state(Capability.STRUCTURED_OUTPUT) is UNSUPPORTED
    assert narrowed.state(Capability.MCP) is UNKNOWN
    assert narrowed.state(Capability.TOOL_FILTER) is UNSUPPORTED
    assert narrowed.state(Capability.SETTINGS) is SUPPORTED  # untouched
    assert narrowed.mcp_transports == frozenset({"stdio"})
    assert narrowed.accepted_settings == frozenset()
    assert narrowed.string_formats == frozenset({"email", "date"})
    assert narrowed.version != narrow(CODE, None, shortname="fast").version


def test_widening_a_capability_is_refused_naming_adapter_field_and_implementation() -> None:
    code = make_declaration(unsupported=[Capability.STRUCTURED_OUTPUT])
    override = DeclarationOverride(capabilities={Capability.STRUCTURED_OUTPUT: SUPPORTED})
    with pytest.raises(ConfigError) as caught:
        narrow(code, override, shortname="fast", implementation="openai")
    assert caught.value.message == (
        'adapter "fast": config declares capabilities.structured_output=supported '
        "but the openai implementation declares unsupported"
    )


@pytest.mark.parametrize(
    ("code_state", "config_state"),
    [(UNSUPPORTED, UNKNOWN), (UNSUPPORTED, SUPPORTED)],
)
def test_every_upward_move_from_unsupported_is_refused(
    code_state: CapabilityState, config_state: CapabilityState
) -> None:
    code = Declaration("code", AdapterKind.FRAMEWORK, {Capability.EFFORT: code_state})
    override = DeclarationOverride(capabilities={Capability.EFFORT: config_state})
    with pytest.raises(ConfigError, match=r"capabilities\.effort="):
        narrow(code, override, shortname="fast")


def test_an_undeclared_capability_cannot_be_configured_supported() -> None:
    override = DeclarationOverride(capabilities={Capability.HOOKS: SUPPORTED})
    with pytest.raises(ConfigError, match=r"capabilities\.hooks=supported but the code declares nothing"):
        narrow(CODE, override, shortname="fast")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            DeclarationOverride(mcp_transports=frozenset({"stdio", "sse"})),
            'mcp_transports contains "sse", which the code does not implement',
        ),
        (
            DeclarationOverride(accepted_settings=frozenset({"top_k"})),
            'accepted_settings contains "top_k", which the code does not implement',
        ),
        (
            DeclarationOverride(string_formats=frozenset({"uri"})),
            'string_formats contains "uri", which the code does not implement',
        ),
        (
            DeclarationOverride(hook_events=frozenset({"pre_tool_use"})),
            'hook_events contains "pre_tool_use", which the code does not implement',
        ),
    ],
)
def test_typed_sets_may_only_shrink(override: DeclarationOverride, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        narrow(CODE, override, shortname="fast")
    assert caught.value.message == f'adapter "fast": {expected}'


def test_kind_cannot_change() -> None:
    override = DeclarationOverride(kind=AdapterKind.HARNESS)
    with pytest.raises(ConfigError, match=r'adapter "fast": config declares kind=agent-harness'):
        narrow(CODE, override, shortname="fast")


def test_every_widening_is_reported_at_once() -> None:
    override = DeclarationOverride(
        kind=AdapterKind.HARNESS,
        capabilities={Capability.PERSONA: SUPPORTED},
        mcp_transports=frozenset({"sse"}),
    )
    with pytest.raises(ConfigError) as caught:
        narrow(CODE, override, shortname="fast")
    message = caught.value.message
    assert "kind=agent-harness" in message
    assert "capabilities.persona=supported" in message
    assert 'mcp_transports contains "sse"' in message


def test_narrow_refuses_an_invalid_shortname() -> None:
    with pytest.raises(ConfigError, match="Fast"):
        narrow(CODE, None, shortname="Fast")


def test_narrow_keeps_the_scripted_flag_of_the_code() -> None:
    scripted_code = make_declaration(scripted=True)
    assert narrow(scripted_code, DeclarationOverride(), shortname="s").scripted is True


def test_declaration_from_override_is_the_whole_declaration() -> None:
    override = DeclarationOverride(
        kind=AdapterKind.HARNESS,
        capabilities={Capability.STRUCTURED_OUTPUT: SUPPORTED, Capability.MCP: UNSUPPORTED},
        string_formats=frozenset({"email"}),
    )
    declaration = declaration_from_override(override, shortname="demo", scripted=True)
    assert declaration.shortname == "demo"
    assert declaration.kind is AdapterKind.HARNESS
    assert declaration.scripted is True
    assert declaration.state(Capability.STRUCTURED_OUTPUT) is SUPPORTED
    assert declaration.state(Capability.MCP) is UNSUPPORTED
    assert declaration.state(Capability.PERSONA) is UNKNOWN
    assert declaration.string_formats == frozenset({"email"})
    assert declaration.mcp_transports == frozenset()


def test_declaration_from_override_needs_a_kind() -> None:
    with pytest.raises(ConfigError, match=r'adapter "demo": declaration\.kind is required'):
        declaration_from_override(DeclarationOverride(), shortname="demo", scripted=True)


def test_declaration_from_override_refuses_an_unknown_transport() -> None:
    override = DeclarationOverride(kind=AdapterKind.FRAMEWORK, mcp_transports=frozenset({"carrier-pigeon"}))
    with pytest.raises(ConfigError, match='"carrier-pigeon", which is not a transport'):
        declaration_from_override(override, shortname="demo", scripted=True)
