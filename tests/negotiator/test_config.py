"""The config file: strict parsing with file and line in every error."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from negotiator_testkit import NEGOTIATOR_BIN

from agentsidecar.negotiator_service.config import (
    EMBEDDED_CONFIG_PATH,
    EMBEDDED_DEFAULT_CONFIG,
    load_config,
    load_negotiator_config,
)
from agentsidecar.negotiator_service.declarations import declaration_from_override
from agentsidecar.negotiator_service.errors import ConfigError
from agentsidecar.negotiator_service.model import AdapterKind, AdapterSpec, Capability, CapabilityState

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
        (
            "adapters:\n  - shortname: a\n    implementation: command\n    declaration:\n      kind:\n",
            5,
            "declaration.kind is null",
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


# --- the config's JSON Schema (`negotiator config-schema`) ------------------------------------

TESTS = Path(__file__).resolve().parents[1]
CONFIG_KEYS = ("adapters", "profiles", "limits", "mcp", "probe")


def config_schema() -> dict[str, Any]:
    """The schema as an editor gets it: `negotiator config-schema` in a process of its own."""
    done = subprocess.run(
        [str(NEGOTIATOR_BIN), "config-schema"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    schema: dict[str, Any] = json.loads(done.stdout)
    return schema


def configs_in_tests() -> dict[str, str]:
    """Every module-level config constant in tests/ that the loader accepts, by `file:NAME`."""
    found: dict[str, str] = {}
    for source in sorted(TESTS.rglob("*.py")):
        if "node_modules" in source.parts:
            continue
        for statement in ast.parse(source.read_text()).body:
            if not isinstance(statement, ast.Assign) or not isinstance(statement.value, ast.Constant):
                continue
            text = statement.value.value
            if not isinstance(text, str) or not any(f"{key}:" in text for key in CONFIG_KEYS):
                continue
            for target in statement.targets:
                if not isinstance(target, ast.Name):
                    continue
                label = f"{source.relative_to(TESTS)}:{target.id}"
                # Some constants are the sections a test puts after `adapters: []`.
                for candidate in (text, "adapters: []\n" + text):
                    try:
                        load_negotiator_config(candidate, label)
                    except ConfigError:
                        continue  # a str.format template, or a config broken on purpose
                    found[label] = candidate
                    break
    return found


@pytest.mark.slow
def test_the_schema_validates_the_embedded_config_and_every_test_config() -> None:
    schema = config_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    configs = {EMBEDDED_CONFIG_PATH: EMBEDDED_DEFAULT_CONFIG, **configs_in_tests()}
    assert len(configs) >= 15, sorted(configs)
    for label, text in configs.items():
        errors = [error.message for error in validator.iter_errors(yaml.safe_load(text))]
        assert errors == [], label


@pytest.mark.slow
def test_check_jsonschema_accepts_the_embedded_config_with_the_printed_schema(tmp_path: Path) -> None:
    schema_file = tmp_path / "negotiator-config.schema.json"
    schema_file.write_text(json.dumps(config_schema()))
    config_file = tmp_path / "negotiator.yaml"
    config_file.write_text(EMBEDDED_DEFAULT_CONFIG)
    broken = tmp_path / "broken.yaml"
    broken.write_text("adapters:\n  - shortname: Big\n    implementation: lambda\n    optoins: {}\n")
    check = Path(sys.executable).parent / "check-jsonschema"
    ok = subprocess.run(
        [str(check), "--schemafile", str(schema_file), str(config_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run(
        [str(check), "--schemafile", str(schema_file), str(broken)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr
    for problem in ("'Big' does not match", "'lambda' is not one of", "'optoins' was unexpected"):
        assert problem in bad.stdout


@pytest.mark.parametrize(
    "text",
    [
        "adapters: []\nlisteners: []\n",
        "adapters:\n  - shortname: Big\n    implementation: command\n",
        "adapters:\n  - shortname: a\n    implementation: lambda\n",
        "adapters:\n  - shortname: a\n    implementation: command\n    declaration: {kind: agent}\n",
        "adapters:\n  - {shortname: a, implementation: command, declaration: {capabilities: {mcp: true}}}\n",
        "adapters:\n  - shortname: a\n    implementation: command\n    declaration:\n      kind:\n",
        "adapters:\n  - {shortname: a, implementation: command, declaration: {string_formats: [a, a]}}\n",
        "adapters: []\nlimits: {max_depth: -1}\n",
        "adapters: []\nprofiles:\n  'bad name': {model: m}\n",
        "adapters: []\nprofiles:\n  p: {mcp_servers: [{name: a, transport: pigeon, url: u}]}\n",
        "adapters: []\nprobe: {every_seconds: 0}\n",
    ],
)
def test_the_schema_refuses_what_the_loader_refuses_for_its_shape(text: str) -> None:
    """An editor flags these as the loader would (rules across entries are the loader's alone)."""
    with pytest.raises(ConfigError):
        load(text)
    validator = jsonschema.Draft202012Validator(schema_from_models())
    assert not validator.is_valid(yaml.safe_load(text))


def schema_from_models() -> dict[str, Any]:
    from agentsidecar.negotiator_service.config import config_json_schema

    return config_json_schema()


@pytest.mark.slow
def test_client_commands_do_not_import_the_config_models() -> None:
    """The config's models (and pydantic) load for `serve` and `config-schema` only."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import agentsidecar.negotiator_service.cli"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "agentsidecar.negotiator_service.config" not in imported
    assert "pydantic" not in imported
