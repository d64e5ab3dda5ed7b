"""The config file: strict parsing with file and line in every error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from negotiator_service.config import EMBEDDED_CONFIG_PATH, EMBEDDED_DEFAULT_CONFIG, load_config
from negotiator_service.declarations import declaration_from_override
from negotiator_service.errors import ConfigError
from negotiator_service.model import AdapterKind, AdapterSpec, Capability, CapabilityState

PATH = "/etc/negotiator/adapters.yaml"


def load(text: str) -> tuple[AdapterSpec, ...]:
    return load_config(textwrap.dedent(text), PATH)


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load(text)
    return caught.value.message


def test_a_full_entry_is_parsed() -> None:
    [spec] = load_config(
        textwrap.dedent(
            """\
            adapters:
              - shortname: fast
                implementation: openai
                declaration:
                  kind: agent-framework
                  capabilities: {structured_output: supported, model_override: unsupported, hooks: unknown}
                  mcp_transports: [stdio, http]
                  accepted_settings: [temperature]
                  string_formats: [email]
                  hook_events: []
                options:
                  base_url: http://127.0.0.1:8080/v1
                  models: [a, b]
                  retries: 2
                  ratio: 0.5
                  verbose: false
                  nothing: null
            """
        ),
        PATH,
    )
    assert spec.shortname == "fast"
    assert spec.implementation == "openai"
    assert spec.source_path == PATH
    assert spec.declaration is not None
    assert spec.declaration.kind is AdapterKind.FRAMEWORK
    assert dict(spec.declaration.capabilities) == {
        Capability.STRUCTURED_OUTPUT: CapabilityState.SUPPORTED,
        Capability.MODEL_OVERRIDE: CapabilityState.UNSUPPORTED,
        Capability.HOOKS: CapabilityState.UNKNOWN,
    }
    assert spec.declaration.mcp_transports == frozenset({"stdio", "http"})
    assert spec.declaration.accepted_settings == frozenset({"temperature"})
    assert spec.declaration.string_formats == frozenset({"email"})
    assert spec.declaration.hook_events == frozenset()
    assert dict(spec.options) == {
        "base_url": "http://127.0.0.1:8080/v1",
        "models": ["a", "b"],
        "retries": 2,
        "ratio": 0.5,
        "verbose": False,
        "nothing": None,
    }


def test_omitted_declaration_parts_stay_unset() -> None:
    [spec] = load(
        """\
        adapters:
          - shortname: fast
            implementation: command
            declaration:
              capabilities: {persona: unsupported}
        """
    )
    assert spec.declaration is not None
    assert spec.declaration.kind is None
    assert spec.declaration.mcp_transports is None
    assert dict(spec.declaration.capabilities) == {Capability.PERSONA: CapabilityState.UNSUPPORTED}
    assert dict(spec.options) == {}


def test_an_empty_adapter_list_is_allowed() -> None:
    assert load("adapters: []\n") == ()


def test_entries_keep_file_order() -> None:
    specs = load(
        """\
        adapters:
          - {shortname: zeta, implementation: command}
          - {shortname: alpha, implementation: remote}
        """
    )
    assert [s.shortname for s in specs] == ["zeta", "alpha"]


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("adapters: []\nlisteners: []\n", 2, "unknown key 'listeners' in the config"),
        (
            "adapters:\n  - shortname: a\n    implementation: command\n    optoins: {}\n",
            4,
            "unknown key 'optoins' in adapters[0]",
        ),
        (
            "adapters:\n  - shortname: a\n    implementation: command\n    declaration:\n      knid: x\n",
            5,
            "unknown key 'knid' in adapter \"a\": declaration",
        ),
        (
            "adapters:\n  - shortname: a\n    implementation: command\n    declaration:\n"
            "      capabilities:\n        telepathy: supported\n",
            6,
            "unknown key 'telepathy'",
        ),
        (
            "adapters:\n  - shortname: a\n    implementation: command\n    declaration:\n"
            "      capabilities:\n        mcp: maybe\n",
            6,
            "declaration.capabilities.mcp is 'maybe'; expected one of: unknown, unsupported, supported",
        ),
        (
            "adapters:\n  - shortname: a\n    implementation: command\n    declaration:\n"
            "      capabilities: {mcp: true}\n",
            5,
            "declaration.capabilities.mcp is true (not a string; quote it)",
        ),
        (
            "adapters:\n  - shortname: a\n    implementation: command\n    declaration:\n      kind: agent\n",
            5,
            "declaration.kind is 'agent'; expected one of: agent-framework, agent-harness",
        ),
        ("adapters:\n  - shortname: a\n    implementation: lambda\n", 3, "implementation is 'lambda'"),
        ("adapters:\n  - shortname: a\n    implementation: [x]\n", 3, "implementation is not a string"),
        ("adapters:\n  - shortname: Big\n    implementation: command\n", 2, "invalid shortname 'Big'"),
        ("adapters:\n  - shortname: 7\n    implementation: command\n", 2, "shortname must be a string"),
        ("adapters:\n  - implementation: command\n", 2, "adapters[0] needs `shortname`"),
        ("adapters:\n  - shortname: a\n", 2, 'adapter "a" needs `implementation`'),
        (
            "adapters:\n  - {shortname: a, implementation: command}\n"
            "  - {shortname: b, implementation: command}\n  - {shortname: a, implementation: remote}\n",
            4,
            'duplicate shortname "a" (first defined on line 2)',
        ),
        (
            "adapters:\n  - shortname: a\n    shortname: b\n    implementation: command\n",
            3,
            "duplicate key 'shortname'",
        ),
        (
            "adapters:\n  - shortname: a\n    implementation: command\n    declaration:\n"
            "      mcp_transports: [stdio, pigeon]\n",
            5,
            "'pigeon' is not a transport",
        ),
        (
            "adapters:\n  - shortname: a\n    implementation: command\n    declaration:\n"
            "      accepted_settings:\n        - seed\n        - seed\n",
            7,
            "lists 'seed' twice",
        ),
        (
            "adapters:\n  - shortname: a\n    implementation: command\n    declaration:\n"
            "      string_formats: email\n",
            5,
            "string_formats must be a list",
        ),
        ("adapters:\n  - shortname: a\n    implementation: scripted\n", 2, "`declaration.kind` is required"),
        (
            "adapters:\n  - shortname: a\n    implementation: command\n    options:\n      at: 2024-01-01\n",
            5,
            "options.at holds a tag:yaml.org,2002:timestamp value",
        ),
        (
            "adapters:\n  - shortname: a\n    implementation: command\n    options: [1]\n",
            4,
            "options must be",
        ),
        ("adapters: {}\n", 1, "`adapters` must be a list"),
        ("- adapters\n", 1, "the config must be a mapping"),
        ("{}\n", 1, "needs an `adapters` list"),
        ("", 1, "the config is empty"),
        ("adapters:\n  - shortname: [\n", 3, "not valid YAML"),
        ("adapters: []\n---\nadapters: []\n", 2, "not valid YAML"),
    ],
)
def test_errors_name_file_and_line(text: str, line: int, fragment: str) -> None:
    message = error_of(text)
    assert message.startswith(f"{PATH}:{line}: "), message
    assert fragment in message


def test_a_file_round_trips_through_load_config(tmp_path: Path) -> None:
    path = tmp_path / "negotiator.yaml"
    path.write_text("adapters:\n  - {shortname: echo, implementation: command, options: {argv: [cat]}}\n")
    [spec] = load_config(path.read_text(), str(path))
    assert spec.source_path == str(path)
    assert dict(spec.options) == {"argv": ["cat"]}


def test_embedded_default_config_is_valid_and_labelled_demo() -> None:
    demo, shell = load_config(EMBEDDED_DEFAULT_CONFIG, EMBEDDED_CONFIG_PATH)
    assert EMBEDDED_DEFAULT_CONFIG.count("# Demo adapter:") == 2

    assert (demo.shortname, demo.implementation) == ("demo", "scripted")
    assert demo.declaration is not None
    declaration = declaration_from_override(demo.declaration, shortname="demo", scripted=True)
    assert declaration.kind is AdapterKind.FRAMEWORK
    supported = {c for c in Capability if declaration.state(c) is CapabilityState.SUPPORTED}
    assert supported == {Capability.STRUCTURED_OUTPUT, Capability.MODEL_OVERRIDE, Capability.SETTINGS}
    unsupported = {c for c in Capability if declaration.state(c) is CapabilityState.UNSUPPORTED}
    assert unsupported == set(Capability) - supported
    assert declaration.string_formats == frozenset({"email", "date"})
    assert declaration.accepted_settings == frozenset({"temperature", "seed"})
    assert declaration.mcp_transports == frozenset()
    assert dict(demo.options) == {
        "invoke": {"echo": True},
        "produce": {"json": {"summary": "scripted reply", "ok": True}},
    }

    assert (shell.shortname, shell.implementation) == ("shell-echo", "command")
    assert dict(shell.options) == {"argv": ["cat"], "timeout_seconds": 10}
