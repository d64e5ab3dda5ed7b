"""Negotiator profiles: read strictly from config, expanded into the calls that name them.

A profile's fields merge under the request's (request wins; settings per key;
MCP servers append), then every requirement is judged where it came from, so
an MCP transport a profile brings is refused before dispatch naming the
profile's field.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeAlias

import grpc
import pytest
from fakes import make_declaration
from google.protobuf import struct_pb2
from negotiator_testkit import EVERYTHING, TEST_CONFIG, add_fake, call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service import negotiation
from agentsidecar.negotiator_service.config import load_negotiator_config
from agentsidecar.negotiator_service.errors import ConfigError, InvalidRequest
from agentsidecar.negotiator_service.model import (
    CallKind,
    CallOptions,
    CallRequest,
    Capability,
    McpServer,
    Profile,
)
from agentsidecar.negotiator_service.server import RunningNegotiator

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"

PROFILES = """\
profiles:
  research:
    model: research-model
    effort: high
    settings: {temperature: 0.2, seed: 1}
    mcp_servers:
      - {name: docs, transport: streamable-http, url: "http://127.0.0.1:9/mcp", headers: {X-Key: k}}
      - name: fs
        transport: stdio
        command: mcp-fs
        args: [/srv]
        env: {LOG: "0"}
  feeds:
    mcp_servers:
      - {name: feed, transport: sse, url: "http://127.0.0.1:9/sse"}
  deep:
    adapter_profile: deep-thinking
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    """The conftest config plus profiles (overrides conftest's fixture, so `negotiator` serves them)."""
    path = tmp_path / "negotiator.yaml"
    path.write_text(TEST_CONFIG + PROFILES)
    return path


# --- config -------------------------------------------------------------------------


def test_profiles_are_read_with_every_field() -> None:
    config = load_negotiator_config("adapters: []\n" + PROFILES, "n.yaml")
    assert config.profiles is not None
    assert sorted(config.profiles) == ["deep", "feeds", "research"]
    research = config.profiles["research"]
    assert (research.model, research.effort, dict(research.settings)) == (
        "research-model",
        "high",
        {"temperature": 0.2, "seed": 1},
    )
    assert research.mcp_servers == (
        McpServer(
            "docs", "streamable-http", url="http://127.0.0.1:9/mcp", headers={"X-Key": "k"}, operator=True
        ),
        McpServer("fs", "stdio", command="mcp-fs", args=("/srv",), env={"LOG": "0"}, operator=True),
    )
    assert config.profiles["deep"].adapter_profile == "deep-thinking"


def test_without_a_profiles_section_there_are_none() -> None:
    assert load_negotiator_config("adapters: []\n", "n.yaml").profiles is None
    assert load_negotiator_config("adapters: []\nprofiles: {}\n", "n.yaml").profiles == {}


@pytest.mark.parametrize(
    ("profiles", "line", "message"),
    [
        ("  p:\n    modle: x\n", 4, "unknown key 'modle'"),
        ("  p: {}\n", 3, 'profile "p" sets nothing'),
        ("  bad name:\n    model: x\n", 3, "invalid profile name 'bad name'"),
        ("  p:\n    model: ''\n", 4, "model must not be empty"),
        ("  p:\n    settings: [1]\n", 4, "settings must be a mapping"),
        ("  p:\n    mcp_servers:\n      - {name: a, transport: ftp, url: u}\n", 5, "ftp"),
        ("  p:\n    mcp_servers:\n      - {name: a, transport: stdio}\n", 5, "needs `command` for the stdio"),
        ("  p:\n    mcp_servers:\n      - {name: a, transport: http}\n", 5, "needs `url` for the http"),
        (
            "  p:\n    mcp_servers:\n      - {name: a, transport: stdio, command: x, url: u}\n",
            5,
            "url does not apply to the stdio transport",
        ),
        (
            "  p:\n    mcp_servers:\n      - {name: a, transport: sse, url: u, env: {A: b}}\n",
            5,
            "env does not apply to the sse transport",
        ),
        (
            "  p:\n    mcp_servers:\n      - {name: a, transport: sse, url: u}\n"
            "      - {name: a, transport: http, url: v}\n",
            6,
            "duplicate MCP server name 'a'",
        ),
        (
            "  p:\n    mcp_servers:\n      - {name: a, transport: sse, url: u, headers: {K: 1}}\n",
            5,
            "must be a string",
        ),
        ("  p:\n    model: x\n  p:\n    model: y\n", 5, "duplicate"),
    ],
)
def test_profile_mistakes_name_the_line(profiles: str, line: int, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_negotiator_config("adapters: []\nprofiles:\n" + profiles, "n.yaml")
    assert raised.value.message.startswith(f"n.yaml:{line}:")
    assert message in raised.value.message


@pytest.mark.parametrize(
    ("limits", "expected"),
    [("limits: {max_depth: 0}\n", 0), ("limits: {max_depth: 7}\n", 7), ("limits: {}\n", 3), ("", 3)],
)
def test_limits_max_depth(limits: str, expected: int) -> None:
    assert load_negotiator_config("adapters: []\n" + limits, "n.yaml").max_depth == expected


@pytest.mark.parametrize("value", ["-1", "true", "1.5", "'2'", "[1]"])
def test_a_bad_max_depth_names_its_line(value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_negotiator_config(f"adapters: []\nlimits:\n  max_depth: {value}\n", "n.yaml")
    assert raised.value.message.startswith("n.yaml:3: limits.max_depth must be a non-negative integer")


# --- expansion, pure -------------------------------------------------------------------

RESEARCH = Profile(
    name="research",
    model="pm",
    effort="high",
    settings={"temperature": 0.2, "seed": 1},
    mcp_servers=(
        McpServer("docs", "streamable-http", url="http://h/mcp"),
        McpServer("fs", "stdio", command="x"),
    ),
)


def request(**options: object) -> CallRequest:
    return CallRequest(CallKind.INVOKE, "p", adapter="a", options=CallOptions(**options))  # type: ignore[arg-type]


def test_request_fields_win_settings_merge_and_servers_append() -> None:
    own = McpServer("local", "sse", url="http://l/sse")
    expanded, fields = negotiation.expand_profile(
        request(profile="research", model="mine", settings={"temperature": 0.9}, mcp_servers=(own,)),
        {"research": RESEARCH},
    )
    options = expanded.options
    assert (options.model, options.effort, options.profile) == ("mine", "high", None)
    assert dict(options.settings) == {"temperature": 0.9, "seed": 1}
    assert [s.name for s in options.mcp_servers] == ["docs", "fs", "local"]
    requirements = negotiation.relabel(negotiation.derive_requirements(expanded, None), fields)
    assert [r.request_field for r in requirements] == [
        "options.model",
        "profile(research).effort",
        "profile(research).effort",  # its level
        "options.settings",
        "profile(research).settings.seed",
        "options.settings.temperature",
        "options.mcp_servers",
        "profile(research).mcp_servers[0].transport",
        "profile(research).mcp_servers[1].transport",
        "options.mcp_servers[0].transport",
    ]
    assert Capability.PROFILE_OVERRIDE not in {r.capability for r in requirements}


def test_a_profile_alone_names_its_own_fields() -> None:
    expanded, fields = negotiation.expand_profile(request(profile="research"), {"research": RESEARCH})
    requirements = negotiation.relabel(negotiation.derive_requirements(expanded, None), fields)
    assert [r.request_field for r in requirements][:4] == [
        "profile(research).model",
        "profile(research).effort",
        "profile(research).effort",
        "profile(research).settings",
    ]
    assert "profile(research).mcp_servers" in [r.request_field for r in requirements]


def test_without_negotiator_profiles_the_name_is_the_adapters() -> None:
    unexpanded = request(profile="fast")
    expanded, fields = negotiation.expand_profile(unexpanded, None)
    assert (expanded, dict(fields)) == (unexpanded, {})
    assert [r.request_field for r in negotiation.derive_requirements(expanded, None)] == ["options.profile"]


def test_unknown_profiles_and_clashing_server_names_are_invalid() -> None:
    with pytest.raises(InvalidRequest) as raised:
        negotiation.validate_request(request(profile="nope"), {"research": RESEARCH})
    assert raised.value.violations == (
        ("options.profile", 'unknown profile "nope"; the negotiator defines "research"'),
    )
    with pytest.raises(InvalidRequest) as raised:
        negotiation.validate_request(
            request(profile="research", mcp_servers=(McpServer("fs", "stdio", command="y"),)),
            {"research": RESEARCH},
        )
    assert [f for f, _ in raised.value.violations] == ["options.mcp_servers[0].name"]


# --- over the service ---------------------------------------------------------------------


async def test_a_profile_transport_the_adapter_lacks_is_refused_naming_the_profile_field(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(
        negotiator, make_declaration("fake", supported=[Capability.MCP], mcp_transports=["stdio", "http"])
    )
    error = await call_error(
        stub.Invoke(
            pb.InvokeRequest(adapter="fake", prompt="p", options=pb.CallOptions(profile="feeds")), timeout=5
        )
    )
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UNSUPPORTED_CAPABILITY")
    [gap] = error.precondition_violations
    assert gap.subject == "mcp_transports:sse"
    assert gap.description.startswith("profile(feeds).mcp_servers[0].transport needs mcp_transports:sse")
    assert fake.call_count == 0

    decision = await stub.Negotiate(
        pb.NegotiateRequest(
            invoke=pb.InvokeRequest(adapter="fake", prompt="p", options=pb.CallOptions(profile="feeds"))
        ),
        timeout=5,
    )
    assert [v.requirement.request_field for v in decision.decision.gaps] == [
        "profile(feeds).mcp_servers[0].transport"
    ]


async def test_an_unknown_profile_is_invalid_argument(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator)
    options = pb.CallOptions(profile="reserch")
    error = await call_error(
        stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p", options=options), timeout=5)
    )
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    [(field, description)] = error.field_violations
    assert field == "options.profile"
    assert '"deep", "feeds", "research"' in description
    error = await call_error(
        stub.Negotiate(
            pb.NegotiateRequest(invoke=pb.InvokeRequest(adapter="fake", prompt="p", options=options))
        )
    )
    assert error.field_violations[0][0] == "invoke.options.profile"
    assert fake.call_count == 0


async def test_request_fields_override_profile_fields(stub: Stub, negotiator: RunningNegotiator) -> None:
    fake = add_fake(negotiator, EVERYTHING)
    settings = struct_pb2.Struct()
    settings.update({"temperature": 0.9})
    options = pb.CallOptions(
        profile="research",
        model="mine",
        settings=settings,
        mcp_servers=[pb.McpServer(name="local", transport="sse", url="http://127.0.0.1:9/sse")],
    )
    reply = await stub.Invoke(pb.InvokeRequest(adapter="fake", prompt="p", options=options), timeout=5)
    [(_, call)] = fake.calls
    seen = call.options
    assert (seen.model, seen.effort, seen.profile) == ("mine", "high", None)
    assert dict(seen.settings) == {"temperature": 0.9, "seed": 1}
    assert [(s.name, s.transport) for s in seen.mcp_servers] == [
        ("docs", "streamable-http"),
        ("fs", "stdio"),
        ("local", "sse"),
    ]
    assert seen.mcp_servers[1].env == {"LOG": "0"}
    fields = [v.requirement.request_field for v in reply.decision.verdicts]
    for field in (
        "options.model",
        "profile(research).effort",
        "profile(research).settings.seed",
        "options.settings.temperature",
        "options.mcp_servers[0].transport",
    ):
        assert field in fields


async def test_a_negotiator_profile_needs_no_profile_override(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(
        negotiator,
        make_declaration(
            "fake",
            supported=[Capability.MODEL_OVERRIDE, Capability.EFFORT, Capability.SETTINGS, Capability.MCP],
            unsupported=[Capability.PROFILE_OVERRIDE],
            mcp_transports=["stdio", "http"],
            accepted_settings=["temperature", "seed"],
        ),
    )
    await stub.Invoke(
        pb.InvokeRequest(adapter="fake", prompt="p", options=pb.CallOptions(profile="research")), timeout=5
    )
    assert fake.calls[0][1].options.model == "research-model"

    # A profile that asks the adapter to apply one of its own does need it.
    error = await call_error(
        stub.Invoke(
            pb.InvokeRequest(adapter="fake", prompt="p", options=pb.CallOptions(profile="deep")), timeout=5
        )
    )
    assert error.reason == "UNSUPPORTED_CAPABILITY"
    assert error.precondition_violations[0].description.startswith(
        "profile(deep).adapter_profile needs profile_override"
    )
    assert fake.call_count == 1


async def test_an_adapter_profile_reaches_the_adapter_by_its_name(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator, EVERYTHING)
    await stub.Invoke(
        pb.InvokeRequest(adapter="fake", prompt="p", options=pb.CallOptions(profile="deep")), timeout=5
    )
    assert fake.calls[0][1].options.profile == "deep-thinking"
