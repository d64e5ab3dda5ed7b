"""The command adapter's `map`: what a CLI is given, element by element, and what is declared.

Real processes: the CLI here is a Python one-liner that reports the argv it received (and
writes an output file, or JSON-lines events, when told to), so every assertion is on what a
program really got. The Hypothesis properties run on the pure mapping (command_map).
"""

from __future__ import annotations

import json
import re
import string
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.adapters.command import CommandAdapter, build_argv
from agentsidecar.negotiator_service.adapters.command_map import CallArguments, CallNotPassable, toml_string
from agentsidecar.negotiator_service.adapters.command_presets import CLAUDE_CODE, CODEX_CLI, PRESETS, merged
from agentsidecar.negotiator_service.broker import check_output
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterSpec,
    CallOptions,
    Capability,
    CapabilityState,
    MaxDepth,
    McpServer,
    ToolFilter,
)

# Prints the argv it got (after the interpreter's own) as one JSON line.
ECHO = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]


def command(options: Mapping[str, Any]) -> CommandAdapter:
    spec = AdapterSpec(shortname="cli", implementation="command", options=MappingProxyType(dict(options)))
    adapter = build_adapter(spec)
    assert isinstance(adapter, CommandAdapter)
    return adapter


def supported(adapter: CommandAdapter) -> set[str]:
    declaration = adapter.declaration
    return {c.value for c in Capability if declaration.state(c) is CapabilityState.SUPPORTED}


async def argv_of(adapter: CommandAdapter, **options: Any) -> list[str]:
    reply = await adapter.invoke(
        AdapterCall(prompt=options.pop("prompt", "p"), options=CallOptions(**options))
    )
    result: list[str] = json.loads(reply.text)
    return result


# --- what a call passes on, as the program received it --------------------------------------


async def test_each_mapped_option_reaches_the_program_inside_its_own_element() -> None:
    adapter = command(
        {
            "argv": ECHO,
            "tail": ["--", "{prompt}"],
            "map": {
                "model": ["--model={model}"],
                "effort": {"argv": ["-c", "effort={effort:toml}"], "values": ["low", "high"]},
                "persona": ["--persona", "{persona}"],
            },
        }
    )
    hostile = 'x" ; --dangerous {prompt} $(id)\n'
    got = await argv_of(adapter, prompt="{model} -- two words", model=hostile, effort="high", persona=hostile)
    assert got == [
        f"--model={hostile}",
        "-c",
        'effort="high"',
        "--persona",
        hostile,
        "--",
        "{model} -- two words",
    ]
    assert supported(adapter) == {"settings", "model_override", "effort", "persona"}


async def test_options_the_call_does_not_set_add_nothing() -> None:
    adapter = command({"argv": ECHO, "map": {"model": ["--model={model}"], "persona": ["--p={persona}"]}})
    assert await argv_of(adapter) == []


async def test_an_effort_outside_the_mapped_values_is_refused() -> None:
    adapter = command({"argv": ECHO, "map": {"effort": {"argv": ["--e={effort}"], "values": ["low"]}}})
    # The mapped levels are the declaration's effort_levels: the negotiator refuses another before
    # dispatch, and the adapter's own edge refuses it too.
    assert adapter.declaration.effort_levels == {"low"}
    with pytest.raises(errors.AdapterRefused, match="effort_levels:max"):
        await argv_of(adapter, effort="max")


async def test_mapped_settings_are_checked_and_have_defaults() -> None:
    adapter = command(
        {
            "argv": ECHO,
            "map": {
                "settings": {
                    "sandbox": {
                        "argv": ["--sandbox={value}"],
                        "values": ["read-only", "write"],
                        "default": "read-only",
                    },
                    "turns": {"argv": ["--max-turns={value}"], "type": "integer", "minimum": 1},
                    "verbose": {"argv": ["--verbose"], "type": "boolean"},
                }
            },
        }
    )
    assert adapter.declaration.accepted_settings == {"sandbox", "turns", "verbose", "timeout"}
    assert await argv_of(adapter) == ["--sandbox=read-only"]
    chosen = MappingProxyType({"sandbox": "write", "turns": 3, "verbose": True})
    assert await argv_of(adapter, settings=chosen) == ["--sandbox=write", "--max-turns=3", "--verbose"]
    for bad, problem in (
        ({"sandbox": "danger-full-access"}, "setting sandbox: must be one of read-only, write"),
        ({"turns": 0}, "setting turns: must be at least 1"),
        ({"turns": 1.5}, "setting turns: must be an integer"),
        ({"verbose": "yes"}, "setting verbose: must be true or false"),
    ):
        with pytest.raises(errors.AdapterRefused, match=problem):
            await argv_of(adapter, settings=MappingProxyType(bad))


async def test_structured_output_goes_through_a_schema_file_and_comes_back_from_the_output_file() -> None:
    code = (
        "import json, sys\n"
        "args = dict(a.split('=', 1) for a in sys.argv[1:])\n"
        "schema = json.load(open(args['--schema']))\n"
        "open(args['--out'], 'w').write(json.dumps({'got_schema': schema['title']}))\n"
        "print('progress on stdout is not the reply')\n"
    )
    adapter = command(
        {
            "argv": [sys.executable, "-c", code],
            "map": {
                "output_schema": ["--schema={output_schema_file}"],
                "output_file": ["--out={output_file}"],
            },
        }
    )
    assert "structured_output" in supported(adapter)
    schema = {"title": "T", "type": "object", "required": ["got_schema"]}
    reply = await adapter.produce(AdapterCall(prompt="p", options=CallOptions(), output_schema=schema))
    assert json.loads(reply.text) == {"got_schema": "T"}
    check_output("cli", schema, reply.text)  # what the broker applies to every Produce reply


async def test_an_output_file_the_program_never_wrote_is_an_internal_error() -> None:
    adapter = command({"argv": ECHO, "map": {"output_file": ["--out={output_file}"]}})
    with pytest.raises(errors.AdapterInternal, match="wrote no output file"):
        await adapter.invoke(AdapterCall(prompt="p", options=CallOptions()))


async def test_json_lines_become_events_only_when_the_call_asks() -> None:
    lines = [
        {"type": "thread.started", "thread_id": "t1"},
        {"type": "item.completed", "item": {"type": "command_execution", "command": "ls"}},
        {"type": "item.completed", "item": {"type": "agent_message", "text": "done"}},
        {"type": "turn.completed", "usage": {}},
    ]
    code = (
        "import json, sys\n"
        f"if '--json' in sys.argv: print('\\n'.join(json.dumps(l) for l in {lines!r}))\n"
        "else: print('plain')\n"
    )
    adapter = command(
        {"argv": [sys.executable, "-c", code], "map": {"events": {"argv": ["--json"], "format": "codex"}}}
    )
    plain = await adapter.invoke(AdapterCall(prompt="p", options=CallOptions()))
    assert (plain.text, plain.events) == ("plain\n", ())
    streamed = await adapter.invoke(AdapterCall(prompt="p", options=CallOptions(stream_events=True)))
    assert streamed.text == "done"
    assert [(e.type, e.text) for e in streamed.events] == [
        ("session", "t1"),
        ("tool_use", "ls"),
        ("message", "done"),
        ("turn_completed", ""),
    ]


async def test_a_failure_the_events_report_is_an_internal_error() -> None:
    line = json.dumps({"type": "turn.failed", "error": {"message": "provider said no"}})
    adapter = command(
        {
            "argv": [sys.executable, "-c", f"print({line!r})"],
            "map": {"events": {"argv": [], "format": "codex"}},
        }
    )
    with pytest.raises(errors.AdapterInternal, match="provider said no"):
        await adapter.invoke(AdapterCall(prompt="p", options=CallOptions(stream_events=True)))


async def test_a_tool_filter_needs_both_lists_mapped_and_names_the_cli_cannot_split() -> None:
    adapter = command(
        {"argv": ECHO, "map": {"tool_filter": {"allow": ["--allow={tools}"], "deny": ["--deny={tools}"]}}}
    )
    got = await argv_of(adapter, tool_filter=ToolFilter(allow=("Read", "Edit"), deny=("Bash",)))
    assert got == ["--allow=Read,Edit", "--deny=Bash"]
    with pytest.raises(errors.AdapterRefused, match=r"'Read,Bash'"):
        await argv_of(adapter, tool_filter=ToolFilter(allow=("Read,Bash",)))
    with pytest.raises(errors.ConfigError, match=r"map\.tool_filter\.deny"):
        command({"argv": ECHO, "map": {"tool_filter": {"allow": ["--allow={tools}"]}}})


@pytest.mark.slow
async def test_depth_passes_the_levels_left_and_provider_managed_passes_no_number() -> None:
    both = command(
        {"argv": ECHO, "map": {"max_depth": ["--depth={max_depth}"]}, "delegation": "provider-managed"}
    )
    assert {"depth_limit", "subagents"} <= supported(both)
    call = AdapterCall(prompt="p", options=CallOptions(max_depth=MaxDepth(depth=3)), delegation_depth=1)
    assert json.loads((await both.invoke(call)).text) == ["--depth=2"]
    assert await argv_of(both, max_depth=MaxDepth(provider_managed=True)) == []

    managed_only = command({"argv": ECHO, "delegation": "provider-managed"})
    assert {"depth_limit", "subagents"} <= supported(managed_only)
    assert await argv_of(managed_only, max_depth=MaxDepth(provider_managed=True)) == []
    with pytest.raises(errors.AdapterRefused, match=r"only options\.max_depth\.provider_managed"):
        await argv_of(managed_only, max_depth=MaxDepth(depth=2))

    numeric_only = command({"argv": ECHO, "map": {"max_depth": ["--depth={max_depth}"]}})
    assert "depth_limit" in supported(numeric_only)
    assert "subagents" not in supported(numeric_only)


# --- MCP --------------------------------------------------------------------------------------


def mcp_adapter(mcp_format: str, **mcp: Any) -> CommandAdapter:
    placeholder = "{mcp_config}" if mcp_format == "codex" else "{mcp_config_file}"
    code = (
        "import json, sys, pathlib\n"
        "value = sys.argv[1].split('=', 1)[1]\n"
        "p = pathlib.Path(value)\n"
        "print(p.read_text() if p.is_absolute() and p.exists() else value)\n"
    )
    return command(
        {
            "argv": [sys.executable, "-c", code],
            "map": {"mcp": {"format": mcp_format, "argv": [f"--mcp={placeholder}"], **mcp}},
        }
    )


@pytest.mark.slow
async def test_mcp_servers_are_written_in_the_harness_format_with_the_operator_program() -> None:
    servers = (
        McpServer(name="fs", transport="stdio", command="python3", args=("-m", "srv"), env={"LOG": "0"}),
        McpServer(name="web.x", transport="http", url="http://127.0.0.1:8931/mcp", headers={"A": '"b"'}),
    )
    options = CallOptions(mcp_servers=servers)
    codex = mcp_adapter("codex", stdio_commands=["python3"], url_origins=["http://127.0.0.1:8931"])
    assert codex.declaration.mcp_transports == {"stdio", "http"}
    text = (await codex.invoke(AdapterCall(prompt="p", options=options))).text
    parsed = tomllib.loads(f"mcp_servers = {text}")["mcp_servers"]
    program = parsed["fs"]["command"]
    assert program.startswith("/")
    assert program.endswith("python3")
    assert parsed["fs"]["args"] == ["-m", "srv"]
    assert parsed["fs"]["env"] == {"LOG": "0"}
    assert parsed["web.x"] == {"url": "http://127.0.0.1:8931/mcp", "http_headers": {"A": '"b"'}}

    claude = mcp_adapter("claude-code", stdio_commands=["python3"], url_origins=["http://127.0.0.1:8931"])
    assert claude.declaration.mcp_transports == {"stdio", "sse", "http"}
    written = json.loads((await claude.invoke(AdapterCall(prompt="p", options=options))).text)
    assert written["mcpServers"]["fs"]["type"] == "stdio"
    assert written["mcpServers"]["web.x"] == {"type": "http", "url": servers[1].url, "headers": {"A": '"b"'}}


async def test_mcp_servers_the_operator_did_not_allow_are_refused() -> None:
    adapter = mcp_adapter("codex", stdio_commands=["python3"], url_origins=["http://127.0.0.1:8931"])
    for server, problem in (
        (
            McpServer(name="x", transport="stdio", command="/tmp/evil"),
            "not one of the adapter's mcp.stdio_commands",
        ),
        (
            McpServer(name="x", transport="stdio", command="python3", env={"LD_PRELOAD": "/x.so"}),
            "LD_PRELOAD is a loader or search-path variable",
        ),
        (
            McpServer(name="x", transport="http", url="http://127.0.0.1:9999/"),
            "not one of the adapter's mcp.url_origins",
        ),
        (McpServer(name="x", transport="http", url="http://127.0.0.1:8931@evil.example/"), "url_origins"),
        (McpServer(name="x", transport="sse", url="http://127.0.0.1:8931/sse"), "mcp_transports:sse"),
    ):
        with pytest.raises(errors.AdapterRefused, match=problem):
            await adapter.invoke(AdapterCall(prompt="p", options=CallOptions(mcp_servers=(server,))))


def test_mcp_without_allowed_servers_is_not_supported() -> None:
    adapter = mcp_adapter("codex")
    assert adapter.declaration.state(Capability.MCP) is CapabilityState.UNSUPPORTED
    assert adapter.declaration.mcp_transports == frozenset()


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mapping", "named", "problem"),
    [
        ({"model": ["--model"]}, "map.model", "no element holds {model}"),
        ({"model": ["--model={persona}"]}, "map.model[0]", "placeholder {persona} does not belong here"),
        ({"output_schema": ["--schema"]}, "map.output_schema", "{output_schema_file}"),
        ({"persona": ["--p={persona:yaml}"]}, "map.persona[0]", "unknown quoting :yaml"),
        ({"events": {"argv": ["--json"], "format": "xml"}}, "map.events.format", "must be one of"),
        (
            {"mcp": {"format": "codex", "argv": ["--mcp"]}},
            "map.mcp.argv",
            "{mcp_config_file} or {mcp_config}",
        ),
        (
            {"mcp": {"format": "codex", "argv": ["{mcp_config}"], "stdio_commands": ["no-such-x"]}},
            "map.mcp.stdio_commands[0]",
            "not an executable",
        ),
        ({"settings": {"timeout": {"argv": ["{value}"]}}}, "map.settings.timeout", "interprets itself"),
        (
            {"settings": {"s": {"argv": ["{value}"], "values": ["a"], "default": "b"}}},
            "map.settings.s.default",
            "one of a",
        ),
        ({"temperature": ["{value}"]}, "map.temperature", "unknown command option"),
    ],
)
def test_a_mapping_that_cannot_pass_its_value_on_is_a_config_error(
    mapping: dict[str, Any], named: str, problem: str
) -> None:
    with pytest.raises(errors.ConfigError) as raised:
        command({"argv": ECHO, "map": mapping})
    assert named in raised.value.message
    assert problem in raised.value.message


def test_an_unknown_preset_or_delegation_is_a_config_error() -> None:
    with pytest.raises(errors.ConfigError, match="`preset`: must be one of claude-code, codex-cli"):
        command({"preset": "aider"})
    with pytest.raises(errors.ConfigError, match="`delegation`"):
        command({"argv": ECHO, "delegation": "yes"})


def test_an_operator_lays_options_over_a_preset_key_by_key() -> None:
    adapter = command(
        {"preset": "codex-cli", "argv": [*ECHO], "map": {"mcp": {"stdio_commands": ["python3"]}}}
    )
    assert adapter.declaration.state(Capability.MCP) is CapabilityState.SUPPORTED
    assert adapter.declaration.mcp_transports == {"stdio"}
    assert adapter.declaration.state(Capability.MODEL_OVERRIDE) is CapabilityState.SUPPORTED


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_declares_what_its_flags_pass_on(name: str) -> None:
    adapter = command({"preset": name, "argv": ECHO})
    expected = {
        "codex-cli": {"depth_limit", "effort", "model_override", "persona", "settings", "stream_events",
                      "structured_output", "subagents"},
        "claude-code": {"depth_limit", "effort", "model_override", "persona", "settings", "stream_events",
                        "subagents", "tool_filter"},
    }[name]  # fmt: skip
    assert supported(adapter) == expected
    assert PRESETS[name] is (CODEX_CLI if name == "codex-cli" else CLAUDE_CODE)


async def test_the_claude_code_preset_builds_the_documented_command_line() -> None:
    # Claude Code needs Anthropic's API (or a proxy of it): no offline provider mock is set up
    # for it here, so its preset is checked on the argv it builds, flag by flag against
    # `claude --help` of @anthropic-ai/claude-code 2.1.197.
    adapter = command({"preset": "claude-code", "argv": [*ECHO, "--print", "--no-session-persistence"]})
    got = await argv_of(
        adapter,
        prompt="-v",
        model="sonnet",
        effort="high",
        persona="Be brief.",
        tool_filter=ToolFilter(allow=("Read", "Grep"), deny=("Bash",)),
        stream_events=False,
        settings=MappingProxyType({"max_turns": 4}),
    )
    assert got == [
        "--print",
        "--no-session-persistence",
        "--model=sonnet",
        "--effort=high",
        "--append-system-prompt=Be brief.",
        "--output-format=text",
        "--allowedTools=Read,Grep",
        "--disallowedTools=Bash",
        "--max-turns=4",
        "--",
        "-v",
    ]


# --- properties -------------------------------------------------------------------------------

# Caller text: anything without NUL, including braces, placeholder names, quotes and flags.
CALLER_TEXT = st.one_of(
    st.text(st.characters(blacklist_characters="\0", blacklist_categories=["Cs"]), max_size=30),
    st.sampled_from(["{prompt}", "{model}", "{persona:toml}", "--help", "-", "a b", '"', "{", "}"]),
)
LITERAL = st.text(string.ascii_letters + string.digits + "-=._ /:", max_size=8)
# Each slot's placeholder; the fragment element is literal + placeholder + literal.
SLOTS = {
    "model": "model",
    "effort": "effort",
    "persona": "persona",
    "max_depth": "max_depth",
}
CAPABILITY_OF = {
    "model": Capability.MODEL_OVERRIDE,
    "effort": Capability.EFFORT,
    "persona": Capability.PERSONA,
    "max_depth": Capability.DEPTH_LIMIT,
}


@st.composite
def fragments(draw: st.DrawFn, placeholder: str) -> list[tuple[str, str | None, str, str | None]]:
    """Elements as (prefix, placeholder or None, suffix, quoting); one at least holds the placeholder."""
    count = draw(st.integers(1, 3))
    holder = draw(st.integers(0, count - 1))
    out = []
    for index in range(count):
        quoting = draw(st.sampled_from([None, "toml", "json"])) if index == holder else None
        out.append((draw(LITERAL), placeholder if index == holder else None, draw(LITERAL), quoting))
    return out


def render(prefix: str, name: str | None, suffix: str, quoting: str | None) -> str:
    if name is None:
        return prefix + suffix
    return prefix + "{" + name + (f":{quoting}" if quoting else "") + "}" + suffix


def expected_value(value: str, quoting: str | None) -> str:
    if quoting == "toml":
        return toml_string(value)
    if quoting == "json":
        return json.dumps(value, ensure_ascii=False)
    return value


@pytest.mark.slow
@given(
    mapped=st.dictionaries(st.sampled_from(sorted(SLOTS)), st.just(True)),
    shapes=st.fixed_dictionaries({slot: fragments(placeholder) for slot, placeholder in SLOTS.items()}),
    head=st.lists(st.tuples(LITERAL, st.sampled_from([None, "prompt"]), LITERAL, st.none()), max_size=3),
    prompt=CALLER_TEXT,
    model=st.none() | CALLER_TEXT,
    persona=st.none() | CALLER_TEXT,
    effort=st.none() | CALLER_TEXT,
    depth=st.none() | st.integers(0, 5),
)
def test_caller_text_lands_only_inside_its_placeholder_and_unmapped_is_never_supported(
    mapped: dict[str, bool],
    shapes: dict[str, list[tuple[str, str | None, str, str | None]]],
    head: list[tuple[str, str | None, str, None]],
    prompt: str,
    model: str | None,
    persona: str | None,
    effort: str | None,
    depth: int | None,
) -> None:
    mapping = {slot: [render(*element) for element in shapes[slot]] for slot in mapped}
    argv = [sys.executable, *(render(*element) for element in head)]
    adapter = command({"argv": argv, "map": mapping})

    # A capability without a mapping is never SUPPORTED; one with a mapping is.
    declaration = adapter.declaration
    for slot, capability in CAPABILITY_OF.items():
        state = declaration.state(capability)
        assert (state is CapabilityState.SUPPORTED) == (slot in mapped), (slot, state)
    for capability in Capability:
        if capability not in CAPABILITY_OF.values() and capability is not Capability.SETTINGS:
            assert declaration.state(capability) is CapabilityState.UNSUPPORTED, capability

    # The argv one call builds: only the mapped, set options add elements; every element is its
    # template with each placeholder replaced by exactly the caller's text (nothing re-read).
    values = {"prompt": prompt, "model": model, "persona": persona, "effort": effort}
    values["max_depth"] = None if depth is None else str(depth)
    options = CallOptions(
        model=model,
        persona=persona,
        effort=effort,
        max_depth=None if depth is None else MaxDepth(depth=depth),
    )
    built_head, _ = build_argv(tuple(argv), prompt)
    try:
        built_rest = adapter._options.harness.arguments(
            CallArguments(prompt=prompt, options=options, settings=MappingProxyType({}))
        )
    except CallNotPassable:
        assert depth is not None
        assert "max_depth" not in mapped
        return
    expected = [sys.executable]
    for prefix, name, suffix, quoting in head:
        expected.append(prefix + (expected_value(prompt, quoting) if name else "") + suffix)
    for slot in ("model", "effort", "persona", "max_depth"):
        if slot not in mapped or values[slot] is None:
            continue
        for prefix, name, suffix, quoting in shapes[slot]:
            value = values[slot]
            assert value is not None
            expected.append(prefix + (expected_value(value, quoting) if name else "") + suffix)
    assert [*built_head, *built_rest] == expected
    assert built_head[0] == sys.executable


@pytest.mark.slow
@given(st.text(st.characters(blacklist_categories=["Cs"])))
def test_toml_quoting_reads_back_as_the_same_text(text: str) -> None:
    assert tomllib.loads(f"key = {toml_string(text)}")["key"] == text


def test_the_documented_preset_blocks_are_the_shipped_presets() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "harnesses.md").read_text()
    blocks = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)]
    documented = {block.pop("preset"): block for block in blocks if "preset" in block and "argv" in block}
    assert set(documented) == set(PRESETS)
    for name, preset in PRESETS.items():
        assert documented[name] == merged({}, preset), name
