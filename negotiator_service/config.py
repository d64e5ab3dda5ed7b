"""The negotiator's config file: which adapters to build, and how their declarations narrow.

Parsing only; no adapter is built here. The file is read strictly: an
unknown key, a bad enum value or a duplicate shortname is a ConfigError
naming the file and the line, because a typo that silently drops a
narrowing would leave an adapter advertising more than the operator meant.

An adapter's `declaration` may state capabilities and typed sets for the
adapter and, under `models`, per model (see declarations.py for what config
may state):

    declaration:
      capabilities: {effort: unsupported}
      models:
        gpt-reasoning:
          capabilities: {effort: supported, settings: supported}
          effort_levels: [low, medium, high]
          accepted_settings: [temperature, max_tokens]

Besides `adapters`, a config may define `profiles` (named call options the
negotiator expands into calls naming them; see negotiation.py) and `limits`
(the delegation depth every call is held to; see depth.py):

    profiles:
      research:
        model: gpt-research          # optional; also effort, settings
        settings: {temperature: 0.2}
        mcp_servers:
          - {name: docs, transport: streamable-http, url: "http://127.0.0.1:8931/mcp"}
          - {name: fs, transport: stdio, command: mcp-fs, args: [/srv/data], env: {LOG: "0"}}
        adapter_profile: deep        # optional: a profile the adapter applies itself
    limits:
      max_depth: 3                   # the default; 0 forbids delegation

MCP (the negotiator's own MCP client; mcp_policy.py, mcp_tools.py). Servers
in profiles are the operator's: any transport, stdio included, and two keys
of their own: `tool_risks` (an MCP tool's risk, which an annotation may raise
but never lower) and `preapproved` (tools that run without asking when a call
has no ToolSession to ask). Servers a request brings are admitted only by the
`mcp:` section:

    profiles:
      files:
        mcp_servers:
          - name: fs
            transport: stdio
            command: /usr/local/bin/mcp-fs
            tool_risks: {write_file: sensitive, read_file: read_only}
            preapproved: [write_file]
    mcp:
      caller_stdio_commands: [/usr/local/bin/mcp-git]   # exact commands a request may start
      caller_hosts: [127.0.0.1, mcp.internal]           # hosts a request's http/sse server may be on
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NoReturn

import yaml

from negotiator_service.declarations import SHORTNAME_RE, validate_shortname
from negotiator_service.depth import DEFAULT_MAX_DEPTH
from negotiator_service.errors import ConfigError
from negotiator_service.mcp_policy import McpPolicy
from negotiator_service.model import (
    MCP_TRANSPORTS,
    AdapterKind,
    AdapterSpec,
    Capability,
    CapabilityState,
    DeclarationOverride,
    JsonValue,
    McpServer,
    Profile,
    ToolRisk,
    TypedSet,
)

IMPLEMENTATIONS = ("scripted", "command", "openai", "remote", "acp")
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
  # comes back as the reply. `cat` is resolved on the negotiator's PATH at
  # start-up; calls may lower `timeout` and nothing else: it lists no
  # `call_env` (variables a call may set) and no `cwd_roots` (directories a
  # call's cwd must lie in), so `env` and `cwd` are not accepted settings.
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

_TOP_KEYS = ("adapters", "profiles", "limits", "mcp", "probe")
_ADAPTER_KEYS = ("shortname", "implementation", "declaration", "options")
_DECLARATION_KEYS = ("kind", "capabilities", *(s.value for s in TypedSet), "models")
# A model's entry states capabilities and typed sets; kind and models are the adapter's.
_MODEL_DECLARATION_KEYS = ("capabilities", *(s.value for s in TypedSet))
_PROFILE_KEYS = ("mcp_servers", "model", "effort", "settings", "adapter_profile")
_MCP_SERVER_KEYS = (
    "name",
    "transport",
    "command",
    "args",
    "env",
    "url",
    "headers",
    "tool_risks",
    "preapproved",
)
_LIMIT_KEYS = ("max_depth",)
# Profile names appear in request fields such as "profile(NAME).model".
PROFILE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_PROFILE_NAME = re.compile(PROFILE_NAME_RE)
# "streamable-http" is accepted as "http", as in requests.
_CONFIG_TRANSPORTS = ("stdio", "sse", "http", "streamable-http")
_STDIO_ONLY = ("command", "args", "env")
_REMOTE_ONLY = ("url", "headers")


@dataclass(frozen=True, slots=True)
class NegotiatorConfig:
    adapters: tuple[AdapterSpec, ...]
    # None: the config has no `profiles:` section, so profile names are the adapters' own.
    profiles: Mapping[str, Profile] | None = None
    max_depth: int = DEFAULT_MAX_DEPTH  # `limits.max_depth`
    mcp: McpPolicy = field(default_factory=McpPolicy)  # `mcp:`; the default admits no caller-supplied server
    probe: ProbeSchedule | None = None  # `probe:`; None: no probe runs unless asked (ProbeAdapter)


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

    def string_map(self, node: yaml.Node, what: str) -> dict[str, str]:
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, f"{what} must be a mapping of strings")
        result: dict[str, str] = {}
        for key_node, value_node in node.value:
            key = self.string(key_node, f"a key of {what}")
            if not key:
                self.fail(key_node, f"{what} contains an empty key")
            if key in result:
                self.fail(key_node, f"duplicate key {key!r} in {what}")
            result[key] = self.string(value_node, f"{what}.{key}")
        return result

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
    return load_negotiator_config(text, path).adapters


def load_negotiator_config(text: str, path: str) -> NegotiatorConfig:
    """Parse a whole config file: adapters, profiles and limits."""
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
    top = reader.mapping(root, "the config", _TOP_KEYS)
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
    profiles = _profiles(reader, top["profiles"]) if "profiles" in top else None
    max_depth = _max_depth(reader, top["limits"]) if "limits" in top else DEFAULT_MAX_DEPTH
    mcp = _mcp_policy(reader, top["mcp"]) if "mcp" in top else McpPolicy()
    probe = _probe_schedule(reader, top["probe"], specs) if "probe" in top else None
    return NegotiatorConfig(
        adapters=tuple(specs), profiles=profiles, max_depth=max_depth, mcp=mcp, probe=probe
    )


def _profiles(reader: _Reader, node: yaml.Node) -> Mapping[str, Profile]:
    if not isinstance(node, yaml.MappingNode):
        reader.fail(node, "`profiles` must be a mapping from profile name to profile")
    profiles: dict[str, Profile] = {}
    for name_node, profile_node in node.value:
        name = reader.string(name_node, "a profile name")
        if _PROFILE_NAME.fullmatch(name) is None:
            reader.fail(name_node, f"invalid profile name {name!r}: must match {PROFILE_NAME_RE}")
        if name in profiles:
            reader.fail(name_node, f"duplicate profile {name!r}")
        profiles[name] = _profile(reader, profile_node, name)
    return MappingProxyType(profiles)


def _profile(reader: _Reader, node: yaml.Node, name: str) -> Profile:
    what = f'profile "{name}"'
    fields = reader.mapping(node, what, _PROFILE_KEYS)
    if not fields:
        reader.fail(node, f"{what} sets nothing; expected one of: {', '.join(_PROFILE_KEYS)}")
    texts: dict[str, str | None] = {}
    for key in ("model", "effort", "adapter_profile"):
        texts[key] = None
        if key in fields:
            value = reader.string(fields[key], f"{what}: {key}")
            if not value.strip():
                reader.fail(fields[key], f"{what}: {key} must not be empty")
            texts[key] = value
    settings: Mapping[str, JsonValue] = MappingProxyType({})
    if "settings" in fields:
        settings_node = fields["settings"]
        if not isinstance(settings_node, yaml.MappingNode):
            reader.fail(settings_node, f"{what}: settings must be a mapping")
        for key_node, _ in settings_node.value:
            if reader.string(key_node, f"a key of {what}: settings") == "":
                reader.fail(key_node, f"{what}: settings contains an empty key")
        settings = MappingProxyType(reader.json_value(settings_node, f"{what}: settings"))
    servers: tuple[McpServer, ...] = ()
    if "mcp_servers" in fields:
        servers = _mcp_servers(reader, fields["mcp_servers"], f"{what}: mcp_servers")
    return Profile(
        name=name,
        mcp_servers=servers,
        model=texts["model"],
        effort=texts["effort"],
        settings=settings,
        adapter_profile=texts["adapter_profile"],
    )


def _mcp_servers(reader: _Reader, node: yaml.Node, what: str) -> tuple[McpServer, ...]:
    if not isinstance(node, yaml.SequenceNode):
        reader.fail(node, f"{what} must be a list")
    servers: list[McpServer] = []
    for index, entry in enumerate(node.value):
        server = _mcp_server(reader, entry, f"{what}[{index}]")
        if any(s.name == server.name for s in servers):
            reader.fail(entry, f"{what}[{index}]: duplicate MCP server name {server.name!r}")
        servers.append(server)
    return tuple(servers)


def _mcp_server(reader: _Reader, node: yaml.Node, what: str) -> McpServer:
    fields = reader.mapping(node, what, _MCP_SERVER_KEYS)
    for required in ("name", "transport"):
        if required not in fields:
            reader.fail(node, f"{what} needs `{required}`")
    name = reader.string(fields["name"], f"{what}.name")
    if not name:
        reader.fail(fields["name"], f"{what}.name must not be empty")
    transport = reader.choice(fields["transport"], f"{what}.transport", _CONFIG_TRANSPORTS)
    stdio = transport == "stdio"
    needed, inapplicable = ("command", _REMOTE_ONLY) if stdio else ("url", _STDIO_ONLY)
    if needed not in fields:
        reader.fail(node, f"{what} needs `{needed}` for the {transport} transport")
    for key in inapplicable:
        if key in fields:
            # Kedi drops inapplicable fields; config refuses them, since one is usually a mistake.
            reader.fail(fields[key], f"{what}.{key} does not apply to the {transport} transport")
    text = reader.string(fields[needed], f"{what}.{needed}")
    if not text:
        reader.fail(fields[needed], f"{what}.{needed} must not be empty")
    args: tuple[str, ...] = ()
    if "args" in fields:
        args_node = fields["args"]
        if not isinstance(args_node, yaml.SequenceNode):
            reader.fail(args_node, f"{what}.args must be a list of strings")
        args = tuple(reader.string(item, f"an entry of {what}.args") for item in args_node.value)
    maps: dict[str, Mapping[str, str]] = {}
    for key in ("env", "headers"):
        maps[key] = MappingProxyType(reader.string_map(fields[key], f"{what}.{key}") if key in fields else {})
    tool_risks, preapproved = _mcp_tool_settings(reader, fields, what)
    return McpServer(
        name=name,
        transport=transport,
        command=text if stdio else "",
        args=args,
        env=maps["env"],
        url="" if stdio else text,
        headers=maps["headers"],
        operator=True,
        tool_risks=tool_risks,
        preapproved=preapproved,
    )


# --- MCP: per-tool settings of config servers, and the `mcp:` section ---------------------

_MCP_KEYS = ("caller_stdio_commands", "caller_hosts")
_RISKS = tuple(risk.value for risk in ToolRisk)


def _mcp_tool_settings(
    reader: _Reader, fields: Mapping[str, yaml.Node], what: str
) -> tuple[Mapping[str, ToolRisk], frozenset[str]]:
    risks: dict[str, ToolRisk] = {}
    if "tool_risks" in fields:
        node = fields["tool_risks"]
        if not isinstance(node, yaml.MappingNode):
            reader.fail(node, f"{what}.tool_risks must be a mapping from MCP tool name to risk")
        for key_node, value_node in node.value:
            tool = reader.string(key_node, f"a key of {what}.tool_risks")
            if not tool or tool in risks:
                reader.fail(key_node, f"{what}.tool_risks: empty or duplicate tool name {tool!r}")
            risks[tool] = ToolRisk(reader.choice(value_node, f"{what}.tool_risks.{tool}", _RISKS))
    preapproved: frozenset[str] = frozenset()
    if "preapproved" in fields:
        preapproved = reader.string_set(fields["preapproved"], f"{what}.preapproved", lambda _n, _m: None)
    return MappingProxyType(risks), preapproved


def _mcp_policy(reader: _Reader, node: yaml.Node) -> McpPolicy:
    fields = reader.mapping(node, "mcp", _MCP_KEYS)
    commands: frozenset[str] = frozenset()
    hosts: frozenset[str] = frozenset()
    if "caller_stdio_commands" in fields:
        commands = reader.string_set(
            fields["caller_stdio_commands"], "mcp.caller_stdio_commands", lambda _n, _m: None
        )
    if "caller_hosts" in fields:

        def host_check(item: yaml.Node, host: str) -> None:
            if ":" in host:  # only an IPv6 address may hold one
                try:
                    ipaddress.IPv6Address(host.strip("[]"))
                except ValueError:
                    reader.fail(item, f"mcp.caller_hosts: {host!r} is a host, not a URL or host:port")
            elif any(c in host for c in "/@ "):
                reader.fail(item, f"mcp.caller_hosts: {host!r} is a host, not a URL")

        listed = reader.string_set(fields["caller_hosts"], "mcp.caller_hosts", host_check)
        # As urlsplit().hostname gives them: lower case, IPv6 without brackets.
        hosts = frozenset(host.strip("[]").lower() for host in listed)
    return McpPolicy(caller_stdio_commands=commands, caller_hosts=hosts)


# --- probe: (prober.py runs it) ------------------------------------------------
#
#     probe:
#       every_seconds: 3600           # optional: probe again on this schedule; absent: at start-up only
#       adapters:
#         litellm: [mock-drop, gpt-4o] # the models to probe; []: the adapter's default model
#
# Probes send requests that cost tokens, so none runs unless this section
# (or a ProbeAdapter call) asks for it. Only openai adapters can be probed.

_PROBE_KEYS = ("every_seconds", "adapters")
PROBEABLE_IMPLEMENTATIONS = ("openai",)


@dataclass(frozen=True, slots=True)
class ProbeSchedule:
    adapters: Mapping[str, tuple[str, ...]]  # shortname: models to probe (empty: the default model)
    every_seconds: float | None = None  # None: at start-up only


def _probe_schedule(reader: _Reader, node: yaml.Node, specs: list[AdapterSpec]) -> ProbeSchedule:
    fields = reader.mapping(node, "probe", _PROBE_KEYS)
    every: float | None = None
    if "every_seconds" in fields:
        every_node = fields["every_seconds"]
        value = (
            reader.loader.construct_object(every_node, deep=True)
            if isinstance(every_node, yaml.ScalarNode) and every_node.tag in (_INT_TAG, _FLOAT_TAG)
            else None
        )
        if not isinstance(value, int | float) or not value > 0:
            reader.fail(every_node, "probe.every_seconds must be a positive number of seconds")
        every = float(value)
    adapters: dict[str, tuple[str, ...]] = {}
    if "adapters" in fields:
        adapters_node = fields["adapters"]
        if not isinstance(adapters_node, yaml.MappingNode):
            reader.fail(adapters_node, "probe.adapters must be a mapping from adapter shortname to models")
        implementations = {spec.shortname: spec.implementation for spec in specs}
        for key_node, models_node in adapters_node.value:
            name = reader.string(key_node, "a key of probe.adapters")
            if name in adapters:
                reader.fail(key_node, f"duplicate key {name!r} in probe.adapters")
            implementation = implementations.get(name)
            if implementation is None:
                reader.fail(
                    key_node, f'probe.adapters names "{name}", which is not an adapter of this config'
                )
            if implementation not in PROBEABLE_IMPLEMENTATIONS:
                reader.fail(
                    key_node,
                    f'probe.adapters names "{name}", a {implementation} adapter; '
                    "only openai adapters can be probed",
                )
            models = reader.string_set(models_node, f"probe.adapters.{name}", lambda _n, _m: None)
            adapters[name] = tuple(sorted(models))
    return ProbeSchedule(adapters=MappingProxyType(adapters), every_seconds=every)


def _max_depth(reader: _Reader, node: yaml.Node) -> int:
    fields = reader.mapping(node, "limits", _LIMIT_KEYS)
    if "max_depth" not in fields:
        return DEFAULT_MAX_DEPTH
    depth_node = fields["max_depth"]
    # A YAML int only: `true` or `3.0` is a typo here, not a depth.
    if not isinstance(depth_node, yaml.ScalarNode) or depth_node.tag != _INT_TAG:
        reader.fail(depth_node, "limits.max_depth must be a non-negative integer (0 forbids delegation)")
    depth = reader.loader.construct_object(depth_node, deep=True)
    if not isinstance(depth, int) or depth < 0:
        reader.fail(depth_node, f"limits.max_depth must be a non-negative integer, not {depth}")
    return depth


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


def _declaration(
    reader: _Reader, node: yaml.Node, what: str, keys: tuple[str, ...] = _DECLARATION_KEYS
) -> DeclarationOverride:
    fields = reader.mapping(node, what, keys)
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
    models: dict[str, DeclarationOverride] = {}
    if "models" in fields:
        models_node = fields["models"]
        if not isinstance(models_node, yaml.MappingNode):
            reader.fail(models_node, f"{what}.models must be a mapping from model name to declaration")
        for name_node, model_node in models_node.value:
            name = reader.string(name_node, f"a model name in {what}.models")
            if not name.strip():
                reader.fail(name_node, f"{what}.models contains an empty model name")
            if name in models:
                reader.fail(name_node, f"duplicate model {name!r} in {what}.models")
            models[name] = _declaration(reader, model_node, f"{what}.models.{name}", _MODEL_DECLARATION_KEYS)
    return DeclarationOverride(
        kind=kind,
        capabilities=MappingProxyType(capabilities),
        mcp_transports=sets[TypedSet.MCP_TRANSPORTS],
        accepted_settings=sets[TypedSet.ACCEPTED_SETTINGS],
        string_formats=sets[TypedSet.STRING_FORMATS],
        hook_events=sets[TypedSet.HOOK_EVENTS],
        effort_levels=sets[TypedSet.EFFORT_LEVELS],
        models=MappingProxyType(models),
    )
