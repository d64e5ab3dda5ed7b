"""Shipped presets for the command adapter: agent CLIs mapped onto their own flags.

A config entry names one with `options.preset`; its own options are laid over
the preset's, mappings merged key by key (so `map.mcp.stdio_commands` can be
added without restating the rest) and every other value replaced. The blocks
here are the ones docs/harnesses.md shows, flag for flag.

codex-cli    `codex exec` of the OpenAI Codex CLI (checked against
             `codex exec --help` of @openai/codex 0.171.0)
claude-code  `claude -p` of Claude Code (checked against `claude --help` of
             @anthropic-ai/claude-code 2.1.197; `--max-turns` is hidden from
             that help and documented in its CLI reference)

Every value a call passes is glued to its flag (`--model=...`), so caller text
can never be read as another flag, and the prompt follows `--`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import MappingProxyType

from agentsidecar.negotiator_service.adapters._options import OptionReader
from agentsidecar.negotiator_service.model import AdapterSpec, JsonValue

CODEX_CLI: Mapping[str, JsonValue] = MappingProxyType(
    {
        "argv": ["codex", "exec", "--skip-git-repo-check", "--ephemeral", "--color=never"],
        "tail": ["--", "{prompt}"],
        "map": {
            "model": ["--model={model}"],
            "effort": {
                "argv": ["--config=model_reasoning_effort={effort:toml}"],
                "values": ["minimal", "low", "medium", "high", "xhigh"],
            },
            "persona": ["--config=developer_instructions={persona:toml}"],
            "output_schema": ["--output-schema={output_schema_file}"],
            "output_file": ["--output-last-message={output_file}"],
            "events": {"argv": ["--json"], "format": "codex"},
            "mcp": {"format": "codex", "argv": ["--config=mcp_servers={mcp_config}"]},
            "max_depth": ["--config=agents.max_depth={max_depth}"],
            "settings": {
                "sandbox": {
                    "argv": ["--sandbox={value}"],
                    "values": ["read-only", "workspace-write"],
                    "default": "read-only",
                }
            },
        },
        "delegation": "provider-managed",
    }
)

CLAUDE_CODE: Mapping[str, JsonValue] = MappingProxyType(
    {
        "argv": ["claude", "--print", "--no-session-persistence"],
        "tail": ["--", "{prompt}"],
        "map": {
            "model": ["--model={model}"],
            "effort": {"argv": ["--effort={effort}"], "values": ["low", "medium", "high", "xhigh", "max"]},
            "persona": ["--append-system-prompt={persona}"],
            "events": {
                "argv": ["--output-format=stream-json", "--verbose"],
                "otherwise": ["--output-format=text"],
                "format": "claude-code",
            },
            "mcp": {
                "format": "claude-code",
                "argv": ["--strict-mcp-config", "--mcp-config={mcp_config_file}"],
            },
            "tool_filter": {
                "allow": ["--allowedTools={tools}"],
                "deny": ["--disallowedTools={tools}"],
                "separator": ",",
            },
            "settings": {"max_turns": {"argv": ["--max-turns={value}"], "type": "integer", "minimum": 1}},
        },
        "delegation": "provider-managed",
    }
)

PRESETS: Mapping[str, Mapping[str, JsonValue]] = MappingProxyType(
    {"codex-cli": CODEX_CLI, "claude-code": CLAUDE_CODE}
)


def merged(base: Mapping[str, JsonValue], over: Mapping[str, JsonValue]) -> dict[str, JsonValue]:
    """`over` laid on `base`: mappings merged key by key, every other value replaced."""
    out: dict[str, JsonValue] = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def with_preset(spec: AdapterSpec) -> Mapping[str, JsonValue]:
    """The adapter's options with its `preset` (if any) underneath; an unknown preset is a ConfigError."""
    options = spec.options
    if not isinstance(options, Mapping) or "preset" not in options:
        return options
    name = options["preset"]
    preset = PRESETS.get(name) if isinstance(name, str) else None
    if preset is None:
        OptionReader(spec, options).fail(
            "preset", f"must be one of {', '.join(sorted(PRESETS))}, not {name!r}"
        )
    return merged(preset, {key: value for key, value in options.items() if key != "preset"})
