"""The negotiator's config file: which adapters to build, and how their declarations narrow.

Parsing only; no adapter is built here. The file is read strictly: an
unknown key, a bad enum value or a duplicate shortname is a ConfigError
naming the file and the line, because a typo that silently drops a
narrowing would leave an adapter advertising more than the operator meant.

The file's shape is the pydantic models below (`ConfigFile` and what it
holds); `config_json_schema()` (`negotiator config-schema`) prints their JSON
Schema for editors. Loading composes the YAML into nodes, turns them into
plain values (refusing duplicate keys and non-JSON scalars, which the models
cannot see), validates those against the models, and maps the first error's
location back to its YAML node, so every message names `file:line`.

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

Probes (prober.py runs them) send requests that cost tokens, so none runs
unless the `probe:` section (or a ProbeAdapter call) asks for it; only
openai adapters can be probed:

    probe:
      every_seconds: 3600            # optional: probe again on this schedule; absent: at start-up only
      adapters:
        litellm: [mock-drop, gpt-4o] # the models to probe; []: the adapter's default model
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Literal, NoReturn, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    StrictStr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from agentsidecar.negotiator_service.declarations import SHORTNAME_RE
from agentsidecar.negotiator_service.depth import DEFAULT_MAX_DEPTH
from agentsidecar.negotiator_service.errors import ConfigError
from agentsidecar.negotiator_service.mcp_policy import McpPolicy
from agentsidecar.negotiator_service.model import (
    MCP_TRANSPORTS,
    AdapterKind,
    AdapterSpec,
    Capability,
    CapabilityState,
    DeclarationOverride,
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

# Profile names appear in request fields such as "profile(NAME).model".
PROFILE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_PROFILE_NAME = re.compile(PROFILE_NAME_RE)
_SHORTNAME = re.compile(SHORTNAME_RE)
# "streamable-http" is accepted as "http", as in requests.
_CONFIG_TRANSPORTS = ("stdio", "sse", "http", "streamable-http")
_STDIO_ONLY = ("command", "args", "env")
_REMOTE_ONLY = ("url", "headers")
PROBEABLE_IMPLEMENTATIONS = ("openai",)

_STR_TAG = "tag:yaml.org,2002:str"
_JSON_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("str", "null", "bool", "int", "float"))
_KEY = "[key]"  # a location step naming a mapping's key rather than its value (pydantic's own word)

Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class ProbeSchedule:
    adapters: Mapping[str, tuple[str, ...]]  # shortname: models to probe (empty: the default model)
    every_seconds: float | None = None  # None: at start-up only


@dataclass(frozen=True, slots=True)
class NegotiatorConfig:
    adapters: tuple[AdapterSpec, ...]
    # None: the config has no `profiles:` section, so profile names are the adapters' own.
    profiles: Mapping[str, Profile] | None = None
    max_depth: int = DEFAULT_MAX_DEPTH  # `limits.max_depth`
    mcp: McpPolicy = field(default_factory=McpPolicy)  # `mcp:`; the default admits no caller-supplied server
    probe: ProbeSchedule | None = None  # `probe:`; None: no probe runs unless asked (ProbeAdapter)


# --- the file's shape ----------------------------------------------------------------------
#
# Validators raise `_problem(...)`: a message template the loader completes
# with the YAML it points at. In a template, {what} names the location (with
# `at` appended), {parent} the location without `at`, and {shown} the value
# as written (`true (not a string; quote it)` for a bare YAML boolean).


def _problem(text: str, *at: str | int) -> PydanticCustomError:
    return PydanticCustomError("config", "{text}", {"text": text, "at": at})


class _Section(BaseModel):
    """A mapping read strictly: known keys only, values of their declared types."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        # Checked before the fields, so a misspelt key is the error reported
        # (and with the keys that would have been accepted).
        if isinstance(data, dict):
            for key, value in data.items():
                if value is None and key in cls.model_fields:
                    # `kind:` with its value forgotten is a typo, not "unstated": leave the key out.
                    raise _problem("{what} is null; give it a value or leave the key out", key)
                if key not in cls.model_fields:
                    allowed = ", ".join(cls.model_fields)
                    raise _problem(
                        f"unknown key {key!r} in {{parent}}; expected one of: {allowed}", key, _KEY
                    )
        return data


def _choice(values: Sequence[str], description: str = "") -> Any:
    """A string from `values`; the schema lists them as an enum."""
    choices = tuple(values)

    def check(value: Any) -> Any:
        if not isinstance(value, str) or value not in choices:
            raise _problem(f"{{what}} is {{shown}}; expected one of: {', '.join(choices)}")
        return value

    return Annotated[
        Literal[choices],
        BeforeValidator(check),
        Field(description=description or None),
    ]


def _named(pattern: re.Pattern[str], source: str, noun: str) -> Any:
    """A string matching `pattern` (a shortname or a profile name)."""

    def check(value: str) -> str:
        if pattern.fullmatch(value) is None:
            raise _problem(f"invalid {noun} {value!r}: must match {source}")
        return value

    return Annotated[StrictStr, AfterValidator(check), Field(json_schema_extra={"pattern": source})]


def _not_blank(value: str) -> str:
    if not value.strip():
        raise _problem("{what} must not be empty")
    return value


def _not_empty(value: str) -> str:
    if not value:
        raise _problem("{what} must not be empty")
    return value


def _string_set(member: Callable[[int, str], None] | None = None, item_schema: Any = None) -> Any:
    """A list of distinct non-empty strings (read as a set)."""

    def check(values: list[str]) -> list[str]:
        seen: set[str] = set()
        for index, value in enumerate(values):
            if not value:
                raise _problem("{parent} contains an empty entry", index)
            if value in seen:
                raise _problem(f"{{parent}} lists {value!r} twice", index)
            if member is not None:
                member(index, value)
            seen.add(value)
        return values

    extra: dict[str, Any] = {"uniqueItems": True}
    extra["items"] = item_schema or {"type": "string", "minLength": 1}
    return Annotated[list[StrictStr], AfterValidator(check), Field(json_schema_extra=extra)]


def _transport_member(index: int, value: str) -> None:
    if value not in MCP_TRANSPORTS:
        expected = ", ".join(sorted(MCP_TRANSPORTS))
        raise _problem(f"{{parent}}: {value!r} is not a transport; expected one of: {expected}", index)


def _host_member(index: int, host: str) -> None:
    if ":" in host:  # only an IPv6 address may hold one
        try:
            ipaddress.IPv6Address(host.strip("[]"))
        except ValueError:
            raise _problem(f"{{parent}}: {host!r} is a host, not a URL or host:port", index) from None
    elif any(c in host for c in "/@ "):
        raise _problem(f"{{parent}}: {host!r} is a host, not a URL", index)


def _key_check(check: Callable[[str], str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Apply `check` to every key of a mapping, pointing an error at the key."""

    def keys(values: dict[str, Any]) -> dict[str, Any]:
        for key in values:
            try:
                check(key)
            except PydanticCustomError as exc:
                context = exc.context or {}
                raise _problem(str(context.get("text", exc.message())), key, _KEY) from None
        return values

    return keys


def _empty_key(key: str) -> str:
    if not key:
        raise _problem("{parent} contains an empty key")
    return key


def _model_name(key: str) -> str:
    if not key.strip():
        raise _problem("{parent} contains an empty model name")
    return key


def _tool_name(key: str) -> str:
    if not key:
        raise _problem("{parent}: empty tool name")
    return key


_StringMap = Annotated[dict[StrictStr, StrictStr], AfterValidator(_key_check(_empty_key))]
_JsonObject = Annotated[dict[StrictStr, JsonValue], AfterValidator(_key_check(_empty_key))]
_Text = Annotated[StrictStr, AfterValidator(_not_blank), Field(min_length=1)]
_States = _choice([s.value for s in CapabilityState])

Capabilities: type[_Section] = create_model(
    "Capabilities",
    __base__=_Section,
    __doc__="Capability states; a capability left out is `unknown`.",
    **{c.value: (_States | None, None) for c in Capability},  # type: ignore[call-overload]
)


class ModelDeclaration(_Section):
    """A model's own capabilities and typed sets, on top of its adapter's."""

    capabilities: Capabilities | None = None  # type: ignore[valid-type]
    mcp_transports: _string_set(_transport_member, {"enum": sorted(MCP_TRANSPORTS)}) | None = None  # type: ignore[valid-type]
    accepted_settings: _string_set() | None = None  # type: ignore[valid-type]
    string_formats: _string_set() | None = None  # type: ignore[valid-type]
    hook_events: _string_set() | None = None  # type: ignore[valid-type]
    effort_levels: _string_set() | None = None  # type: ignore[valid-type]


class Declaration(ModelDeclaration):
    """What config states about an adapter's declaration (see declarations.py)."""

    kind: _choice([k.value for k in AdapterKind]) | None = None  # type: ignore[valid-type]
    models: Annotated[dict[StrictStr, ModelDeclaration], AfterValidator(_key_check(_model_name))] | None = (
        None
    )


class AdapterEntry(_Section):
    shortname: _named(_SHORTNAME, SHORTNAME_RE, "shortname")  # type: ignore[valid-type]
    implementation: _choice(IMPLEMENTATIONS)  # type: ignore[valid-type]
    declaration: Declaration | None = None
    options: _JsonObject = Field(default_factory=dict, description="implementation-specific; JSON values")

    @model_validator(mode="after")
    def _scripted_declares_kind(self) -> Self:
        if self.implementation == "scripted" and (self.declaration is None or self.declaration.kind is None):
            raise _problem(
                "{what}: a scripted adapter declares everything in config, so `declaration.kind` is required",
                *(("declaration",) if self.declaration is not None else ()),
            )
        return self


class McpServerEntry(_Section):
    """An operator's MCP server: any transport; per-tool risks and pre-approvals."""

    name: Annotated[StrictStr, AfterValidator(_not_empty), Field(min_length=1)]
    transport: _choice(_CONFIG_TRANSPORTS)  # type: ignore[valid-type]
    command: StrictStr | None = None
    args: list[StrictStr] | None = None
    env: _StringMap | None = None
    url: StrictStr | None = None
    headers: _StringMap | None = None
    tool_risks: (
        Annotated[
            dict[StrictStr, _choice([risk.value for risk in ToolRisk])],  # type: ignore[valid-type]
            AfterValidator(_key_check(_tool_name)),
        ]
        | None
    ) = None
    preapproved: _string_set() | None = None  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _fits_transport(self) -> Self:
        stdio = self.transport == "stdio"
        needed, inapplicable = ("command", _REMOTE_ONLY) if stdio else ("url", _STDIO_ONLY)
        if getattr(self, needed) is None:
            raise _problem(f"{{what}} needs `{needed}` for the {self.transport} transport")
        for key in inapplicable:
            if getattr(self, key) is not None:
                # Refused rather than dropped: an inapplicable field is usually a mistake.
                raise _problem(f"{{what}} does not apply to the {self.transport} transport", key)
        if not getattr(self, needed):
            raise _problem("{what} must not be empty", needed)
        return self


def _distinct_servers(servers: list[McpServerEntry]) -> list[McpServerEntry]:
    seen: set[str] = set()
    for index, server in enumerate(servers):
        if server.name in seen:
            raise _problem(f"{{what}}: duplicate MCP server name {server.name!r}", index)
        seen.add(server.name)
    return servers


class ProfileEntry(_Section):
    """Named call options the negotiator merges into a call naming the profile."""

    mcp_servers: Annotated[list[McpServerEntry], AfterValidator(_distinct_servers)] | None = None
    model: _Text | None = None
    effort: _Text | None = None
    settings: _JsonObject | None = None
    adapter_profile: _Text | None = Field(None, description="a profile the adapter applies itself")

    @model_validator(mode="after")
    def _sets_something(self) -> Self:
        if not self.model_fields_set:
            raise _problem(f"{{what}} sets nothing; expected one of: {', '.join(type(self).model_fields)}")
        return self


def _depth(value: Any) -> Any:
    # A YAML int only: `true` or `3.0` is a typo here, not a depth.
    if type(value) is not int:
        raise _problem("{what} must be a non-negative integer (0 forbids delegation)")
    if value < 0:
        raise _problem(f"{{what}} must be a non-negative integer, not {value}")
    return value


def _seconds(value: Any) -> Any:
    if type(value) not in (int, float) or not value > 0:
        raise _problem("{what} must be a positive number of seconds")
    return float(value)


class Limits(_Section):
    max_depth: Annotated[int, Field(ge=0), BeforeValidator(_depth)] = Field(
        DEFAULT_MAX_DEPTH, description="the delegation depth every call is held to; 0 forbids delegation"
    )


class McpSection(_Section):
    """What MCP servers a request may bring (none by default)."""

    caller_stdio_commands: _string_set() | None = None  # type: ignore[valid-type]
    caller_hosts: _string_set(_host_member) | None = None  # type: ignore[valid-type]


class ProbeSection(_Section):
    """Probes of openai adapters (they cost tokens, so none runs unless listed here)."""

    every_seconds: Annotated[float, Field(gt=0), BeforeValidator(_seconds)] | None = Field(
        None, description="probe again on this schedule; absent: at start-up only"
    )
    adapters: dict[StrictStr, _string_set()] | None = Field(  # type: ignore[valid-type]
        None, description="adapter shortname: the models to probe ([]: the adapter's default model)"
    )


class ConfigFile(_Section):
    """The negotiator's config file (`negotiator serve --config FILE`)."""

    model_config = ConfigDict(title="agentsidecar negotiator config")

    adapters: list[AdapterEntry] = Field(description="the adapters to build, in order")
    profiles: (
        Annotated[
            dict[StrictStr, ProfileEntry],
            Field(json_schema_extra={"propertyNames": {"pattern": PROFILE_NAME_RE}}),
        ]
        | None
    ) = None
    limits: Limits | None = None
    mcp: McpSection | None = None
    probe: ProbeSection | None = None

    @field_validator("profiles", mode="after")
    @classmethod
    def _profile_names(cls, profiles: dict[str, ProfileEntry] | None) -> dict[str, ProfileEntry] | None:
        for name in profiles or {}:
            if _PROFILE_NAME.fullmatch(name) is None:
                raise _problem(f"invalid profile name {name!r}: must match {PROFILE_NAME_RE}", name, _KEY)
        return profiles


class _SchemaWithoutNulls(GenerateJsonSchema):
    """The models' schema as the loader reads them: an optional key is left out, never null."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        json_schema = super().default_schema(schema)
        if json_schema.get("default", ...) is None:
            del json_schema["default"]
        return json_schema


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the config file, for editors."""
    schema = ConfigFile.model_json_schema(schema_generator=_SchemaWithoutNulls)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


# --- loading ---------------------------------------------------------------------------------


def load_config(text: str, path: str) -> tuple[AdapterSpec, ...]:
    """Parse a config file's text into adapter specs, in file order."""
    return load_negotiator_config(text, path).adapters


def load_negotiator_config(text: str, path: str) -> NegotiatorConfig:
    """Parse a whole config file: adapters, profiles, limits, mcp and probe."""
    root = _compose(text, path)
    if root is None:
        raise ConfigError(f"{path}:1: the config is empty; expected a mapping with an `adapters` list")
    data = _Plain(path, root).value(root, ())
    try:
        parsed = ConfigFile.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, root, path) from None
    return _convert(parsed, root, path)


def _compose(text: str, path: str) -> yaml.Node | None:
    try:
        loader = yaml.SafeLoader(text)
        try:
            node: yaml.Node | None = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigError(f"{path}:{line}: not valid YAML: {exc.problem or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return node


def _fail(path: str, node: yaml.Node, message: str) -> NoReturn:
    raise ConfigError(f"{path}:{node.start_mark.line + 1}: {message}")


class _Plain:
    """YAML nodes to plain values: what the models cannot check, checked here."""

    def __init__(self, path: str, root: yaml.Node) -> None:
        self.path = path
        self.root = root
        self.constructor = yaml.SafeLoader("")

    def value(self, node: yaml.Node, loc: Loc) -> Any:
        if isinstance(node, yaml.MappingNode):
            result: dict[str, Any] = {}
            # An adapter entry's own keys are read before its shortname: name it by index.
            owner = _what(loc, None if len(loc) == 2 else self.root)
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR_TAG:
                    _fail(self.path, key_node, f"a key of {owner} must be a string")
                key: str = key_node.value
                if key in result:
                    _fail(self.path, key_node, f"duplicate key {key!r} in {owner}")
                result[key] = self.value(value_node, (*loc, key))
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self.value(item, (*loc, index)) for index, item in enumerate(node.value)]
        if node.tag not in _JSON_TAGS:
            _fail(
                self.path,
                node,
                f"{_what(loc, self.root)} holds a {node.tag} value; config values must be JSON-compatible",
            )
        return self.constructor.construct_object(node, deep=True)


def _node_at(root: yaml.Node, loc: Loc) -> yaml.Node:
    """The deepest node along `loc` (a missing key's mapping, for instance)."""
    node = root
    key_node: yaml.Node | None = None
    for step in loc:
        if step == _KEY:
            return key_node or node
        if isinstance(node, yaml.MappingNode):
            found = next(((k, v) for k, v in node.value if k.value == step), None)
            if found is None:
                return node
            key_node, node = found
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            key_node, node = None, node.value[step]
        else:
            return node
    return node


def _what(loc: Loc, root: yaml.Node | None) -> str:
    """How messages name a location: `adapter "fast": declaration.kind`, `mcp.caller_hosts`."""
    if not loc:
        return "the config"
    head, rest = loc[0], loc[1:]
    separator = "."
    if head == "adapters" and rest and isinstance(rest[0], int):
        index, rest = rest[0], rest[1:]
        shortname = _entry_shortname(root, index)
        text = f'adapter "{shortname}"' if shortname else f"adapters[{index}]"
        separator = ": " if shortname else "."
    elif head == "profiles" and rest:
        text, rest, separator = f'profile "{rest[0]}"', rest[1:], ": "
    else:
        text = f"`{head}`" if head in ("adapters", "profiles") and not rest else str(head)
    for step in rest:
        if step == _KEY:
            continue
        text += f"[{step}]" if isinstance(step, int) else f"{separator}{step}"
        separator = "."
    return text


def _entry_shortname(root: yaml.Node | None, index: int) -> str | None:
    """An adapter entry's shortname once it is valid (before that, messages say adapters[i])."""
    node = root
    for step in ("adapters", index, "shortname"):
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == step), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            node = node.value[step]
        else:
            return None
    if not isinstance(node, yaml.ScalarNode) or node.tag != _STR_TAG:
        return None
    shortname: str = node.value
    return shortname if _SHORTNAME.fullmatch(shortname) else None


def _config_error(exc: ValidationError, root: yaml.Node, path: str) -> ConfigError:
    """The earliest of pydantic's errors in the file, as `file:line: message`."""
    located = []
    for error in exc.errors(include_url=False):
        context = error.get("ctx") or {}
        loc = tuple(error["loc"])
        at = tuple(context.get("at", ()))
        node = _node_at(root, (*loc, *at))
        located.append((node.start_mark.line, node.start_mark.column, loc, at, node, error))
    line, _, loc, at, node, error = min(located, key=lambda entry: entry[:2])
    context = error.get("ctx") or {}
    # An unknown key in an adapter entry is read before its shortname: name the entry by index.
    named = None if error["type"] == "config" and at[-1:] == (_KEY,) and len(loc) == 2 else root
    what, parent = _what((*loc, *at), named), _what(loc, named)
    kind = error["type"]
    if kind == "config":
        text = str(context["text"])
        message = text.replace("{what}", what).replace("{parent}", parent)
        if "{shown}" in message:
            message = message.replace("{shown}", _shown(node, error.get("input")))
    elif kind == "missing":
        owner, name = _what(loc[:-1], root), loc[-1]
        message = "the config needs an `adapters` list" if loc == ("adapters",) else f"{owner} needs `{name}`"
    elif kind in ("model_type", "dict_type", "model_attributes_type"):
        message = f"{what} must be a mapping{_MAPPING_OF.get(loc[-2:]) or _MAPPING_OF.get(loc[-1:], '')}"
    elif kind == "list_type":
        message = f"{what} must be a list{' of strings' if loc[-1:] == ('args',) else ''}"
    elif kind == "string_type":
        message = f"{what} must be a string"
    elif kind == "string_too_short":
        message = f"{what} must not be empty"
    else:
        message = f"{what}: {error['msg']}"
    return ConfigError(f"{path}:{line + 1}: {message}")


# What a mapping maps, where a message says "must be a mapping".
_MAPPING_OF: Mapping[Loc, str] = MappingProxyType(
    {
        ("profiles",): " from profile name to profile",
        ("declaration", "models"): " from model name to declaration",
        ("probe", "adapters"): " from adapter shortname to models",
        ("tool_risks",): " from MCP tool name to risk",
    }
)


def _shown(node: yaml.Node, value: Any) -> str:
    """A value as a message quotes it: a bare `yes` or `true` is a YAML boolean, not the word."""
    if not isinstance(node, yaml.ScalarNode):
        return "not a string"
    if node.tag != _STR_TAG:
        return f"{node.value} (not a string; quote it)"
    return repr(value)


# --- to the negotiator's values --------------------------------------------------------------


def _convert(parsed: ConfigFile, root: yaml.Node, path: str) -> NegotiatorConfig:
    specs: list[AdapterSpec] = []
    first_seen: dict[str, int] = {}
    for index, entry in enumerate(parsed.adapters):
        node = _node_at(root, ("adapters", index))
        if entry.shortname in first_seen:
            first_line = first_seen[entry.shortname]
            _fail(path, node, f'duplicate shortname "{entry.shortname}" (first defined on line {first_line})')
        first_seen[entry.shortname] = node.start_mark.line + 1
        specs.append(
            AdapterSpec(
                shortname=entry.shortname,
                implementation=entry.implementation,
                declaration=_declaration(entry.declaration) if entry.declaration is not None else None,
                options=MappingProxyType(dict(entry.options)),
                source_path=path,
            )
        )
    profiles = None
    if parsed.profiles is not None:
        profiles = MappingProxyType(
            {name: _profile(name, profile) for name, profile in parsed.profiles.items()}
        )
    probe = _probe(parsed.probe, specs, root, path) if parsed.probe is not None else None
    return NegotiatorConfig(
        adapters=tuple(specs),
        profiles=profiles,
        max_depth=parsed.limits.max_depth if parsed.limits is not None else DEFAULT_MAX_DEPTH,
        mcp=_mcp_policy(parsed.mcp) if parsed.mcp is not None else McpPolicy(),
        probe=probe,
    )


def _declaration(entry: ModelDeclaration) -> DeclarationOverride:
    capabilities: dict[Capability, CapabilityState] = {}
    if entry.capabilities is not None:
        stated = entry.capabilities.model_dump(exclude_none=True)
        capabilities = {Capability(name): CapabilityState(state) for name, state in stated.items()}
    sets = {s: getattr(entry, s.value) for s in TypedSet}
    kind = getattr(entry, "kind", None)
    models = getattr(entry, "models", None) or {}
    return DeclarationOverride(
        kind=AdapterKind(kind) if kind is not None else None,
        capabilities=MappingProxyType(capabilities),
        **{s.value: (frozenset(members) if members is not None else None) for s, members in sets.items()},
        models=MappingProxyType({name: _declaration(model) for name, model in models.items()}),
    )


def _profile(name: str, entry: ProfileEntry) -> Profile:
    return Profile(
        name=name,
        mcp_servers=tuple(_mcp_server(server) for server in entry.mcp_servers or ()),
        model=entry.model,
        effort=entry.effort,
        settings=MappingProxyType(dict(entry.settings or {})),
        adapter_profile=entry.adapter_profile,
    )


def _mcp_server(entry: McpServerEntry) -> McpServer:
    stdio = entry.transport == "stdio"
    return McpServer(
        name=entry.name,
        transport=entry.transport,
        command=entry.command or "",
        args=tuple(entry.args or ()),
        env=MappingProxyType(dict(entry.env or {})),
        url="" if stdio else entry.url or "",
        headers=MappingProxyType(dict(entry.headers or {})),
        operator=True,
        tool_risks=MappingProxyType(
            {tool: ToolRisk(risk) for tool, risk in (entry.tool_risks or {}).items()}
        ),
        preapproved=frozenset(entry.preapproved or ()),
    )


def _mcp_policy(entry: McpSection) -> McpPolicy:
    # Hosts as urlsplit().hostname gives them: lower case, IPv6 without brackets.
    hosts = frozenset(host.strip("[]").lower() for host in entry.caller_hosts or ())
    return McpPolicy(caller_stdio_commands=frozenset(entry.caller_stdio_commands or ()), caller_hosts=hosts)


def _probe(entry: ProbeSection, specs: list[AdapterSpec], root: yaml.Node, path: str) -> ProbeSchedule:
    implementations = {spec.shortname: spec.implementation for spec in specs}
    adapters: dict[str, tuple[str, ...]] = {}
    for name, models in (entry.adapters or {}).items():
        key_node = _node_at(root, ("probe", "adapters", name, _KEY))
        implementation = implementations.get(name)
        if implementation is None:
            _fail(path, key_node, f'probe.adapters names "{name}", which is not an adapter of this config')
        if implementation not in PROBEABLE_IMPLEMENTATIONS:
            _fail(
                path,
                key_node,
                f'probe.adapters names "{name}", a {implementation} adapter; '
                "only openai adapters can be probed",
            )
        adapters[name] = tuple(sorted(models))
    return ProbeSchedule(adapters=MappingProxyType(adapters), every_seconds=entry.every_seconds)
