"""The negotiator's config file: which adapters to build, and how their declarations narrow.

Parsing only; no adapter is built here. The file is read strictly: an
unknown key, a bad enum value or a duplicate shortname is a ConfigError
naming the file and the line, because a typo that silently drops a
narrowing would leave an adapter advertising more than the operator meant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NoReturn

import yaml

from negotiator_service.declarations import SHORTNAME_RE, validate_shortname
from negotiator_service.errors import ConfigError
from negotiator_service.model import (
    MCP_TRANSPORTS,
    AdapterKind,
    AdapterSpec,
    Capability,
    CapabilityState,
    DeclarationOverride,
    JsonValue,
    TypedSet,
)

IMPLEMENTATIONS = ("scripted", "command", "openai", "remote")
EMBEDDED_CONFIG_PATH = "<embedded default config>"

EMBEDDED_DEFAULT_CONFIG = """\
# The config used when `negotiator serve` is given no --config.
# Both adapters are DEMO adapters: they need no credentials and no network.
adapters:
  # Demo adapter: a scripted agent-framework with canned replies.
  # Invoke echoes the prompt; Produce returns a fixed JSON object.
  - shortname: demo
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities:
        structured_output: supported
        model_override: supported
        settings: supported
        tool_registration: unsupported
        mcp: unsupported
        profile_override: unsupported
        effort: unsupported
        codemode: unsupported
        native_approvals: unsupported
        native_approval_handler: unsupported
        subagents: unsupported
        background_subagents: unsupported
        stream_events: unsupported
        hooks: unsupported
        stateful_history: unsupported
        history_replay: unsupported
        native_artifacts: unsupported
        depth_limit: unsupported
        tool_filter: unsupported
        persona: unsupported
      mcp_transports: []
      accepted_settings: [temperature, seed]
      string_formats: [email, date]
      hook_events: []
    options:
      invoke: {echo: true}
      produce: {json: {"summary": "scripted reply", "ok": true}}

  # Demo adapter: a command harness running `cat`, so the prompt (on stdin)
  # comes back as the reply.
  - shortname: shell-echo
    implementation: command
    options:
      argv: ["cat"]
      timeout_seconds: 10
"""

_STR_TAG = "tag:yaml.org,2002:str"
_NULL_TAG = "tag:yaml.org,2002:null"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"

_ADAPTER_KEYS = ("shortname", "implementation", "declaration", "options")
_DECLARATION_KEYS = ("kind", "capabilities", *(s.value for s in TypedSet))


class _Reader:
    """Walks composed YAML nodes, so every error can name its line."""

    def __init__(self, path: str, loader: yaml.SafeLoader) -> None:
        self.path = path
        self.loader = loader

    def fail(self, node: yaml.Node | None, message: str) -> NoReturn:
        line = node.start_mark.line + 1 if node is not None else 1
        raise ConfigError(f"{self.path}:{line}: {message}")

    def mapping(self, node: yaml.Node, what: str, allowed: tuple[str, ...]) -> dict[str, yaml.Node]:
        """A mapping with string keys from `allowed`, each at most once."""
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, f"{what} must be a mapping")
        entries: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = self.string(key_node, f"a key of {what}")
            if key not in allowed:
                self.fail(key_node, f"unknown key {key!r} in {what}; expected one of: {', '.join(allowed)}")
            if key in entries:
                self.fail(key_node, f"duplicate key {key!r} in {what}")
            entries[key] = value_node
        return entries

    def string(self, node: yaml.Node, what: str) -> str:
        if not isinstance(node, yaml.ScalarNode) or node.tag != _STR_TAG:
            self.fail(node, f"{what} must be a string")
        value: str = node.value
        return value

    def choice(self, node: yaml.Node, what: str, choices: tuple[str, ...]) -> str:
        # A bare `yes` or `true` is a YAML boolean, not the word: say what was read.
        value = node.value if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(value, str) or node.tag != _STR_TAG or value not in choices:
            if not isinstance(value, str):
                shown = "not a string"
            elif node.tag != _STR_TAG:
                shown = f"{value} (not a string; quote it)"
            else:
                shown = repr(value)
            self.fail(node, f"{what} is {shown}; expected one of: {', '.join(choices)}")
        return value

    def string_set(
        self, node: yaml.Node, what: str, check: Callable[[yaml.Node, str], None]
    ) -> frozenset[str]:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, f"{what} must be a list")
        members: set[str] = set()
        for item in node.value:
            member = self.string(item, f"an entry of {what}")
            if not member:
                self.fail(item, f"{what} contains an empty entry")
            if member in members:
                self.fail(item, f"{what} lists {member!r} twice")
            check(item, member)
            members.add(member)
        return frozenset(members)

    def json_value(self, node: yaml.Node, what: str) -> JsonValue:
        """A JSON-compatible value: options end up in JSON-minded adapters."""
        if isinstance(node, yaml.MappingNode):
            result: dict[str, JsonValue] = {}
            for key_node, value_node in node.value:
                key = self.string(key_node, f"a key of {what}")
                if key in result:
                    self.fail(key_node, f"duplicate key {key!r} in {what}")
                result[key] = self.json_value(value_node, f"{what}.{key}")
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self.json_value(item, f"{what}[{i}]") for i, item in enumerate(node.value)]
        if isinstance(node, yaml.ScalarNode) and node.tag in (
            _STR_TAG,
            _NULL_TAG,
            _BOOL_TAG,
            _INT_TAG,
            _FLOAT_TAG,
        ):
            return self.loader.construct_object(node, deep=True)
        self.fail(node, f"{what} holds a {node.tag} value; options must be JSON-compatible")


def load_config(text: str, path: str) -> tuple[AdapterSpec, ...]:
    """Parse a config file's text into adapter specs, in file order."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigError(f"{path}:{line}: not valid YAML: {exc.problem or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    reader = _Reader(path, loader)
    if root is None:
        raise ConfigError(f"{path}:1: the config is empty; expected a mapping with an `adapters` list")
    top = reader.mapping(root, "the config", ("adapters",))
    if "adapters" not in top:
        reader.fail(root, "the config needs an `adapters` list")
    adapters_node = top["adapters"]
    if not isinstance(adapters_node, yaml.SequenceNode):
        reader.fail(adapters_node, "`adapters` must be a list")

    specs: list[AdapterSpec] = []
    first_seen: dict[str, int] = {}
    for index, entry in enumerate(adapters_node.value):
        spec = _adapter_spec(reader, entry, f"adapters[{index}]")
        if spec.shortname in first_seen:
            first_line = first_seen[spec.shortname]
            reader.fail(entry, f'duplicate shortname "{spec.shortname}" (first defined on line {first_line})')
        first_seen[spec.shortname] = entry.start_mark.line + 1
        specs.append(spec)
    return tuple(specs)


def _adapter_spec(reader: _Reader, node: yaml.Node, what: str) -> AdapterSpec:
    fields = reader.mapping(node, what, _ADAPTER_KEYS)
    if "shortname" not in fields:
        reader.fail(node, f"{what} needs `shortname`")
    shortname_node = fields["shortname"]
    shortname = reader.string(shortname_node, f"{what}.shortname")
    try:
        validate_shortname(shortname)
    except ConfigError:
        reader.fail(shortname_node, f"invalid shortname {shortname!r}: must match {SHORTNAME_RE}")
    what = f'adapter "{shortname}"'
    if "implementation" not in fields:
        reader.fail(node, f"{what} needs `implementation` (one of: {', '.join(IMPLEMENTATIONS)})")
    implementation = reader.choice(fields["implementation"], f"{what}: implementation", IMPLEMENTATIONS)

    declaration = None
    if "declaration" in fields:
        declaration = _declaration(reader, fields["declaration"], f"{what}: declaration")
    if implementation == "scripted" and (declaration is None or declaration.kind is None):
        reader.fail(
            fields.get("declaration", node),
            f"{what}: a scripted adapter declares everything in config, so `declaration.kind` is required",
        )

    options: Mapping[str, JsonValue] = MappingProxyType({})
    if "options" in fields:
        options_node = fields["options"]
        if not isinstance(options_node, yaml.MappingNode):
            reader.fail(options_node, f"{what}: options must be a mapping")
        options = MappingProxyType(reader.json_value(options_node, f"{what}: options"))
    return AdapterSpec(
        shortname=shortname,
        implementation=implementation,
        declaration=declaration,
        options=options,
        source_path=reader.path,
    )


def _declaration(reader: _Reader, node: yaml.Node, what: str) -> DeclarationOverride:
    fields = reader.mapping(node, what, _DECLARATION_KEYS)
    kind = None
    if "kind" in fields:
        kind = AdapterKind(reader.choice(fields["kind"], f"{what}.kind", tuple(k.value for k in AdapterKind)))

    capabilities: dict[Capability, CapabilityState] = {}
    if "capabilities" in fields:
        names = tuple(c.value for c in Capability)
        states = tuple(s.value for s in CapabilityState)
        for name, state_node in reader.mapping(fields["capabilities"], f"{what}.capabilities", names).items():
            state = reader.choice(state_node, f"{what}.capabilities.{name}", states)
            capabilities[Capability(name)] = CapabilityState(state)

    def transport_check(item: yaml.Node, member: str) -> None:
        if member not in MCP_TRANSPORTS:
            reader.fail(
                item,
                f"{what}.mcp_transports: {member!r} is not a transport; "
                f"expected one of: {', '.join(sorted(MCP_TRANSPORTS))}",
            )

    def any_member(item: yaml.Node, member: str) -> None:
        pass

    sets: dict[TypedSet, frozenset[str] | None] = dict.fromkeys(TypedSet)
    for typed_set in TypedSet:
        if typed_set.value in fields:
            check = transport_check if typed_set is TypedSet.MCP_TRANSPORTS else any_member
            sets[typed_set] = reader.string_set(fields[typed_set.value], f"{what}.{typed_set.value}", check)
    return DeclarationOverride(
        kind=kind,
        capabilities=MappingProxyType(capabilities),
        mcp_transports=sets[TypedSet.MCP_TRANSPORTS],
        accepted_settings=sets[TypedSet.ACCEPTED_SETTINGS],
        string_formats=sets[TypedSet.STRING_FORMATS],
        hook_events=sets[TypedSet.HOOK_EVENTS],
    )
