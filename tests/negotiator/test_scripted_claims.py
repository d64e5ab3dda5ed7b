"""A scripted adapter declares only what its code does, and records what it was sent.

Capabilities with no behaviour in the double (mcp, hooks, codemode, ...) may
only be declared unsupported: anything else is refused when the config is
loaded, and one left out is unsupported, so a call needing it is refused
before dispatch even when the caller allows unknowns. Values the double
cannot act on (model, effort, settings, profile, persona) are recorded, and
the record is what tests assert on.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeAlias

import grpc
import pytest
from google.protobuf import json_format, struct_pb2
from negotiator_testkit import NEGOTIATOR_BIN, TEST_CONFIG, call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.adapters.scripted import ScriptedAdapter
from agentsidecar.negotiator_service.config import EMBEDDED_DEFAULT_CONFIG, load_config
from agentsidecar.negotiator_service.convert import CAPABILITY_TO_PROTO
from agentsidecar.negotiator_service.model import (
    AdapterKind,
    AdapterSpec,
    Capability,
    CapabilityState,
    DeclarationOverride,
)
from agentsidecar.negotiator_service.server import RunningNegotiator

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"

# Re-stated from the double's docstring: what it can do nothing for.
WITHOUT_BEHAVIOUR = (
    Capability.MCP,
    Capability.CODEMODE,
    Capability.NATIVE_APPROVALS,
    Capability.NATIVE_APPROVAL_HANDLER,
    Capability.SUBAGENTS,
    Capability.BACKGROUND_SUBAGENTS,
    Capability.HOOKS,
    Capability.HISTORY_REPLAY,
    Capability.NATIVE_ARTIFACTS,
    Capability.DEPTH_LIMIT,
)

RECORDER_CONFIG = (
    TEST_CONFIG
    + """\
  - shortname: recorder
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities:
        model_override: supported
        effort: supported
        settings: supported
        profile_override: supported
        persona: supported
      accepted_settings: [temperature, seed]
    options:
      invoke: {received: true}
"""
)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "negotiator.yaml"
    path.write_text(RECORDER_CONFIG)
    return path


def spec(
    capabilities: dict[Capability, CapabilityState],
    *,
    mcp_transports: frozenset[str] | None = None,
    hook_events: frozenset[str] | None = None,
) -> AdapterSpec:
    return AdapterSpec(
        shortname="double",
        implementation="scripted",
        declaration=DeclarationOverride(
            kind=AdapterKind.FRAMEWORK,
            capabilities=MappingProxyType(capabilities),
            mcp_transports=mcp_transports,
            hook_events=hook_events,
        ),
    )


@pytest.mark.parametrize("capability", WITHOUT_BEHAVIOUR, ids=lambda c: c.value)
@pytest.mark.parametrize("state", [CapabilityState.SUPPORTED, CapabilityState.UNKNOWN], ids=lambda s: s.value)
def test_a_capability_without_behaviour_may_only_be_declared_unsupported(
    capability: Capability, state: CapabilityState
) -> None:
    with pytest.raises(errors.ConfigError) as caught:
        build_adapter(spec({capability: state}))
    message = caught.value.message
    assert message.startswith('adapter "double": ')
    assert f"capabilities.{capability.value}={state.value}" in message
    adapter = build_adapter(spec({capability: CapabilityState.UNSUPPORTED}))
    assert adapter.declaration.state(capability) is CapabilityState.UNSUPPORTED


def test_mcp_transports_and_hook_events_must_stay_empty() -> None:
    with pytest.raises(errors.ConfigError) as caught:
        build_adapter(spec({}, mcp_transports=frozenset({"stdio"}), hook_events=frozenset({"stop"})))
    assert "mcp_transports must be empty" in caught.value.message
    assert "hook_events must be empty" in caught.value.message


def test_capabilities_left_out_are_unsupported_unless_the_double_implements_them() -> None:
    declaration = build_adapter(spec({})).declaration
    for capability in Capability:
        expected = CapabilityState.UNSUPPORTED if capability in WITHOUT_BEHAVIOUR else CapabilityState.UNKNOWN
        assert declaration.state(capability) is expected, capability
    assert declaration.scripted


@pytest.mark.parametrize(
    "text", [TEST_CONFIG, RECORDER_CONFIG, EMBEDDED_DEFAULT_CONFIG], ids=["test", "recorder", "embedded"]
)
def test_the_shipped_and_test_configs_claim_only_what_the_double_does(text: str) -> None:
    for adapter_spec in load_config(text, "<config>"):
        if adapter_spec.implementation == "scripted":
            build_adapter(adapter_spec)


@pytest.mark.slow
def test_serve_refuses_a_config_claiming_mcp_at_load(tmp_path: Path) -> None:
    config = tmp_path / "claims.yaml"
    config.write_text(
        "adapters:\n"
        "  - shortname: mcp-liar\n"
        "    implementation: scripted\n"
        "    declaration:\n"
        "      kind: agent-framework\n"
        "      capabilities: {mcp: supported}\n"
        "      mcp_transports: [stdio]\n"
    )
    result = subprocess.run(
        [str(NEGOTIATOR_BIN), "serve", "--config", str(config), "--listen", f"unix:{tmp_path / 'n.sock'}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert 'adapter "mcp-liar": capabilities.mcp=supported: a scripted adapter has no behaviour for mcp' in (
        result.stderr
    )
    assert "mcp_transports must be empty" in result.stderr


async def test_mcp_servers_are_refused_before_dispatch_even_when_unknowns_are_allowed(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    # scripted-fw's config says nothing about mcp: the double contacts no MCP server.
    request = pb.InvokeRequest(
        adapter="scripted-fw",
        prompt="p",
        options=pb.CallOptions(
            mcp_servers=[pb.McpServer(name="fs", transport="stdio", command="mcp-fs")],
            allow_unknown=[CAPABILITY_TO_PROTO[Capability.MCP]],
        ),
    )
    error = await call_error(stub.Invoke(request))
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UNSUPPORTED_CAPABILITY")
    assert [(g.type, g.subject) for g in error.precondition_violations] == [
        ("UNSUPPORTED_CAPABILITY", "mcp"),
        ("UNSUPPORTED_CAPABILITY", "mcp_transports:stdio"),
    ]


async def test_the_double_records_what_it_was_sent(stub: Stub, negotiator: RunningNegotiator) -> None:
    settings = struct_pb2.Struct()
    json_format.ParseDict({"temperature": 0.5, "seed": 7}, settings)
    request = pb.InvokeRequest(
        adapter="recorder",
        prompt="hello",
        options=pb.CallOptions(
            model="m-1",
            effort="low",
            settings=settings,
            profile="fast",
            persona="critic",
            requires=["persona"],
        ),
    )
    reply = await stub.Invoke(request)
    record: dict[str, Any] = json.loads(reply.text)
    assert record == {
        "kind": "invoke",
        "prompt": "hello",
        "output_schema": None,
        "model": "m-1",
        "effort": "low",
        "settings": {"temperature": 0.5, "seed": 7},
        "profile": "fast",
        "persona": "critic",
        "stream_events": False,
        "conversation_id": None,
        "tool_filter": None,
        "tools": [],
        "requires": ["persona"],
    }
    adapter = negotiator.registry.get("recorder").adapter
    assert isinstance(adapter, ScriptedAdapter)
    assert list(adapter.received) == [record]
