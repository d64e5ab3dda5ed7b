"""How a command adapter passes a call's options on to its CLI: the `map` option.

Pure: no I/O, no grpc. `read_map` reads the operator's mapping (argv fragments
with placeholders), `HarnessMap.capabilities` is what that mapping can pass on,
`HarnessMap.arguments` builds the argv of one call, and `parse_events` turns a
harness's JSON-lines stdout into semantic events.

A capability is declared SUPPORTED only when its mapping exists, so a harness
declares exactly what it is configured to pass on:

    model          [..."{model}"...]                       model_override
    effort         {argv: [..."{effort}"...], values: [...]}  effort
    persona        [..."{persona}"...]                     persona
    output_schema  [..."{output_schema_file}"...]          structured_output, with a
                                                           way to read the output:
                                                           `output_file`, or stdout
    output_file    [..."{output_file}"...]                 the reply is read from it
    events         {argv: [...], otherwise: [...], format: codex | claude-code}
                                                           stream_events
    mcp            {format: codex | claude-code, argv: [..."{mcp_config_file}" or
                    "{mcp_config}"...], stdio_commands: [...], url_origins: [...]}
                                                           mcp, mcp_transports
    tool_filter    {allow: [..."{tools}"...], deny: [..."{tools}"...], separator: ","}
                                                           tool_filter (both needed)
    max_depth      [..."{max_depth}"...]                   depth_limit
    delegation     provider-managed                        subagents and depth_limit
    settings       {NAME: {argv: [..."{value}"...], type, values, minimum, maximum,
                    default}}                              settings, accepted_settings

A fragment is a list of argv elements; fragments go, in the order above, after
`argv` and before `tail`. A placeholder stands inside one element and is
replaced there in one pass, so caller text never becomes an element of its
own, never splits into several, never reaches argv[0] and is never read again
for placeholders. `{name:toml}` and `{name:json}` quote the value as a TOML or
JSON string (for CLIs that parse an element as TOML, such as `codex -c`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NoReturn
from urllib.parse import urlsplit

from agentsidecar.negotiator_service.adapters._options import OptionReader, is_number, type_name
from agentsidecar.negotiator_service.model import (
    MCP_TRANSPORTS,
    CallOptions,
    Capability,
    JsonValue,
    McpServer,
    StreamEvent,
)

PLACEHOLDER = re.compile(r"\{([a-z_]+)(?::([a-z]+))?\}")
FILTERS = frozenset({"toml", "json"})
PROVIDER_MANAGED = "provider-managed"
EVENT_FORMATS = frozenset({"codex", "claude-code"})
# The transports each MCP config format can describe.
MCP_FORMATS: Mapping[str, frozenset[str]] = MappingProxyType(
    {"codex": frozenset({"stdio", "http"}), "claude-code": frozenset({"stdio", "sse", "http"})}
)
SETTING_TYPES = frozenset({"string", "integer", "boolean"})
# Settings the command adapter itself interprets (command.py); a mapped setting may not reuse them.
BUILT_IN_SETTINGS = frozenset({"timeout", "env", "cwd"})

# The placeholders each part of the options may use.
SLOT_PLACEHOLDERS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "argv": frozenset({"prompt"}),
        "tail": frozenset({"prompt"}),
        "model": frozenset({"model"}),
        "effort": frozenset({"effort"}),
        "persona": frozenset({"persona"}),
        "output_schema": frozenset({"output_schema_file"}),
        "output_file": frozenset({"output_file"}),
        "events": frozenset(),
        "mcp": frozenset({"mcp_config_file", "mcp_config"}),
        "tool_filter": frozenset({"tools"}),
        "max_depth": frozenset({"max_depth"}),
        "settings": frozenset({"value"}),
    }
)


class CallNotPassable(Exception):
    """A call carries a value this mapping cannot pass on (a message for AdapterRefused)."""


Fragment = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EventsMap:
    argv: Fragment
    otherwise: Fragment
    format: str


@dataclass(frozen=True, slots=True)
class McpMap:
    argv: Fragment
    format: str
    stdio_commands: Mapping[str, str]  # the name a call gives -> the absolute path the harness runs
    url_origins: frozenset[str]  # "scheme://host:port"
    transports: frozenset[str]

    @property
    def wants_file(self) -> bool:
        return any("{mcp_config_file" in element for element in self.argv)


@dataclass(frozen=True, slots=True)
class ToolFilterMap:
    allow: Fragment
    deny: Fragment
    separator: str


@dataclass(frozen=True, slots=True)
class SettingMap:
    argv: Fragment
    type: str
    values: tuple[JsonValue, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    default: JsonValue = None


@dataclass(frozen=True, slots=True)
class HarnessMap:
    tail: Fragment = ()
    model: Fragment | None = None
    effort: Fragment | None = None
    effort_values: frozenset[str] = frozenset()  # empty: any value
    persona: Fragment | None = None
    output_schema: Fragment | None = None
    string_formats: frozenset[str] = frozenset()
    output_file: Fragment | None = None
    events: EventsMap | None = None
    mcp: McpMap | None = None
    tool_filter: ToolFilterMap | None = None
    max_depth: Fragment | None = None
    provider_managed: bool = False
    settings: Mapping[str, SettingMap] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def capabilities(self) -> frozenset[Capability]:
        """The capabilities this mapping passes on to the CLI."""
        mapped = {
            Capability.MODEL_OVERRIDE: self.model is not None,
            Capability.EFFORT: self.effort is not None,
            Capability.PERSONA: self.persona is not None,
            # The reply is read from `output_file`, else from stdout (or, in an event mode, from
            # the final answer its events carry).
            Capability.STRUCTURED_OUTPUT: self.output_schema is not None,
            Capability.STREAM_EVENTS: self.events is not None,
            Capability.MCP: self.mcp is not None and bool(self.mcp.transports),
            Capability.TOOL_FILTER: self.tool_filter is not None,
            Capability.DEPTH_LIMIT: self.max_depth is not None or self.provider_managed,
            Capability.SUBAGENTS: self.provider_managed,
        }
        return frozenset(capability for capability, present in mapped.items() if present)

    @property
    def mcp_transports(self) -> frozenset[str]:
        return self.mcp.transports if self.mcp is not None else frozenset()

    def arguments(self, call: CallArguments) -> tuple[str, ...]:
        """The elements that follow `argv` for one call: fragments, then the tail.

        Raises CallNotPassable for a value the mapping cannot pass on.
        """
        values = call.values
        elements: list[str] = []

        def add(fragment: Fragment | None, **fill: str) -> None:
            if fragment is not None:
                elements.extend(substitute(element, fill) for element in fragment)

        options = call.options
        if options.model is not None:
            add(self.model, model=options.model)
        if options.effort is not None:
            if self.effort_values and options.effort not in self.effort_values:
                raise CallNotPassable(
                    f"effort {options.effort!r} is not one of {', '.join(sorted(self.effort_values))}"
                )
            add(self.effort, effort=options.effort)
        if options.persona is not None:
            add(self.persona, persona=options.persona)
        if "output_schema_file" in values:
            add(self.output_schema, output_schema_file=values["output_schema_file"])
        if "output_file" in values:
            add(self.output_file, output_file=values["output_file"])
        if self.events is not None:
            add(self.events.argv if options.stream_events else self.events.otherwise)
        if options.mcp_servers and self.mcp is not None:
            add(self.mcp.argv, **{k: v for k, v in values.items() if k.startswith("mcp_config")})
        if options.tool_filter is not None and self.tool_filter is not None:
            for names, fragment in (
                (options.tool_filter.allow, self.tool_filter.allow),
                (options.tool_filter.deny, self.tool_filter.deny),
            ):
                if names:
                    add(fragment, tools=self._tool_list(names))
        if options.max_depth is not None and options.max_depth.depth is not None:
            if self.max_depth is None:
                raise CallNotPassable(
                    "options.max_depth.depth: this harness delegates on its own; only "
                    "options.max_depth.provider_managed can be passed on"
                )
            add(self.max_depth, max_depth=str(max(0, options.max_depth.depth - call.delegation_depth)))
        for name, setting in self.settings.items():
            value = call.settings.get(name, setting.default)
            if value is None or value is False:
                continue
            add(setting.argv, value=setting_text(value))
        add(self.tail, prompt=call.prompt)
        return tuple(elements)

    def _tool_list(self, names: Sequence[str]) -> str:
        assert self.tool_filter is not None
        separator = self.tool_filter.separator
        for name in names:
            if not name or separator in name or any(c.isspace() for c in name):
                raise CallNotPassable(
                    f"options.tool_filter: tool name {name!r} cannot be passed on "
                    f"(empty, or holding {separator!r} or white space, which the CLI splits on)"
                )
        return separator.join(names)

    def check_setting(self, name: str, value: JsonValue) -> str | None:
        """What is wrong with a call's value for mapped setting `name`; None when it passes."""
        setting = self.settings[name]
        if setting.type == "boolean":
            return None if isinstance(value, bool) else "must be true or false"
        if setting.type == "integer":
            if not is_number(value) or not float(value).is_integer():
                return "must be an integer"
            if setting.minimum is not None and value < setting.minimum:
                return f"must be at least {setting.minimum:g}"
            if setting.maximum is not None and value > setting.maximum:
                return f"must be at most {setting.maximum:g}"
            return None
        if not isinstance(value, str) or "\0" in value:
            return "must be a string"
        if setting.values and value not in setting.values:
            return f"must be one of {', '.join(str(v) for v in setting.values)}"
        return None


@dataclass(frozen=True, slots=True)
class CallArguments:
    """What one call gives the mapping: its options, and the files the run prepared."""

    prompt: str
    options: CallOptions
    settings: Mapping[str, JsonValue]
    delegation_depth: int = 0
    # output_schema_file, output_file, mcp_config_file, mcp_config: set when the run made them.
    values: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def setting_text(value: JsonValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def substitute(element: str, values: Mapping[str, str]) -> str:
    """`element` with each placeholder replaced by its value, in one pass (values are not rescanned)."""

    def replace(match: re.Match[str]) -> str:
        name, how = match.group(1), match.group(2)
        if name not in values:
            return match.group(0)
        value = values[name]
        if how == "toml":
            return toml_string(value)
        if how == "json":
            return json.dumps(value, ensure_ascii=False)
        return value

    return PLACEHOLDER.sub(replace, element)


def toml_string(value: str) -> str:
    """`value` as a TOML basic string: quotes, backslashes and control characters escaped."""
    out = ['"']
    for char in value:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _toml_key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else toml_string(name)


def _toml_value(value: JsonValue) -> str:
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {type_name(value)}")


def mcp_config(
    mapping: McpMap, servers: Sequence[McpServer], is_loader_variable: Callable[[str], bool]
) -> str:
    """The call's MCP servers in the harness's format; raises CallNotPassable for one it may not run.

    A stdio server's command must be one of the operator's `stdio_commands` (the harness gets
    its absolute path) and its environment may hold no loader variable; an sse or http server's
    URL must have one of the operator's `url_origins`.
    """
    described: dict[str, dict[str, JsonValue]] = {}
    for index, server in enumerate(servers):
        where = f"options.mcp_servers[{index}]"
        transport = "http" if server.transport == "streamable-http" else server.transport
        if transport not in mapping.transports:
            raise CallNotPassable(f"{where}: transport {transport!r} is not one this harness is given")
        if transport == "stdio":
            program = mapping.stdio_commands.get(server.command)
            if program is None:
                listed = ", ".join(sorted(mapping.stdio_commands)) or "none"
                raise CallNotPassable(
                    f"{where}.command: {server.command!r} is not one of the adapter's "
                    f"mcp.stdio_commands ({listed})"
                )
            for name in server.env:
                if is_loader_variable(name):
                    raise CallNotPassable(
                        f"{where}.env: {name} is a loader or search-path variable, which no call may set"
                    )
            entry: dict[str, JsonValue] = {"command": program, "args": list(server.args)}
            if server.env:
                entry["env"] = dict(server.env)
            if mapping.format == "claude-code":
                entry = {"type": "stdio", **entry}
        else:
            if url_origin(server.url) not in mapping.url_origins:
                raise CallNotPassable(f"{where}.url: its origin is not one of the adapter's mcp.url_origins")
            if mapping.format == "codex":
                entry = {"url": server.url}
                if server.headers:
                    entry["http_headers"] = dict(server.headers)
            else:
                entry = {"type": transport, "url": server.url}
                if server.headers:
                    entry["headers"] = dict(server.headers)
        described[server.name] = entry
    if mapping.format == "codex":
        return _toml_value(described)
    return json.dumps({"mcpServers": described}, ensure_ascii=False)


def url_origin(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    port = port if port is not None else (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{parts.hostname}:{port}"


# --- events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParsedEvents:
    events: tuple[StreamEvent, ...]
    final_text: str | None  # the harness's final answer, when its events carry one
    failure: str | None  # the harness reported the run failed


def parse_events(event_format: str, stdout: str) -> ParsedEvents:
    """A harness's JSON-lines stdout as semantic events; lines that are not JSON objects are skipped."""
    read = _CODEX if event_format == "codex" else _CLAUDE
    events: list[StreamEvent] = []
    final: str | None = None
    failure: str | None = None
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        for kind, text in read(record):
            if kind == "final":
                final = text
            elif kind == "failure":
                failure = text
                events.append(StreamEvent(type="error", text=text))
            else:
                events.append(StreamEvent(type=kind, text=text))
    return ParsedEvents(events=tuple(events), final_text=final, failure=failure)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _codex_events(record: dict[str, JsonValue]) -> list[tuple[str, str]]:
    """`codex exec --json`: thread.started, turn.*, item.started/updated/completed, error."""
    kind = record.get("type")
    item = record.get("item")
    if kind == "thread.started":
        return [("session", _text(record.get("thread_id")))]
    if kind == "turn.failed":
        error = record.get("error")
        return [("failure", _text(error.get("message")) if isinstance(error, dict) else "the turn failed")]
    if kind == "error":
        return [("error", _text(record.get("message")))]
    if kind == "turn.completed":
        return [("turn_completed", "")]
    if kind != "item.completed" or not isinstance(item, dict):
        return []
    item_type = item.get("type")
    if item_type == "agent_message":
        text = _text(item.get("text"))
        return [("message", text), ("final", text)]
    if item_type == "reasoning":
        return [("reasoning", _text(item.get("text")))]
    if item_type == "command_execution":
        return [("tool_use", _text(item.get("command")))]
    if item_type == "mcp_tool_call":
        return [("tool_use", f"{_text(item.get('server'))}.{_text(item.get('tool'))}")]
    if item_type == "file_change":
        changes = item.get("changes")
        paths = (
            [_text(c.get("path")) for c in changes if isinstance(c, dict)]
            if isinstance(changes, list)
            else []
        )
        return [("file_change", "\n".join(paths))]
    if item_type == "error":
        return [("error", _text(item.get("message")))]
    return []


def _claude_events(record: dict[str, JsonValue]) -> list[tuple[str, str]]:
    """`claude -p --output-format stream-json --verbose`: system, assistant, user, result."""
    kind = record.get("type")
    if kind == "system" and record.get("subtype") == "init":
        return [("session", _text(record.get("session_id")))]
    if kind == "result":
        if record.get("is_error"):
            return [("failure", _text(record.get("result")) or _text(record.get("subtype")))]
        return [("final", _text(record.get("result")))]
    message = record.get("message")
    if kind not in ("assistant", "user") or not isinstance(message, dict):
        return []
    content = message.get("content")
    out: list[tuple[str, str]] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        block_type = block.get("type")
        if block_type == "text" and kind == "assistant":
            out.append(("message", _text(block.get("text"))))
        elif block_type == "thinking":
            out.append(("reasoning", _text(block.get("thinking"))))
        elif block_type == "tool_use":
            out.append(("tool_use", _text(block.get("name"))))
        elif block_type == "tool_result":
            out.append(("tool_result", ""))
    return out


_CODEX: Callable[[dict[str, JsonValue]], list[tuple[str, str]]] = _codex_events
_CLAUDE: Callable[[dict[str, JsonValue]], list[tuple[str, str]]] = _claude_events


# --- reading the mapping -----------------------------------------------------------------------


def read_map(reader: OptionReader, resolve: Callable[[str], str | None]) -> HarnessMap:
    """The mapping from the adapter's options (`tail`, `map`, `delegation`); `resolve` finds a
    program on the negotiator's PATH (for mcp.stdio_commands)."""
    tail = _fragment(reader, "tail", reader.raw("tail"), "tail", optional=True) or ()
    delegation = reader.raw("delegation")
    if delegation is not None and delegation != PROVIDER_MANAGED:
        reader.fail("delegation", f'must be "{PROVIDER_MANAGED}", not {delegation!r}')
    raw = reader.raw("map")
    if raw is None:
        return HarnessMap(tail=tail, provider_managed=delegation is not None)
    mapping = reader.nested("map")
    model = _mapped(mapping, "model")
    effort, effort_values = _effort(mapping)
    persona = _mapped(mapping, "persona")
    output_schema, string_formats = _output_schema(mapping)
    output_file = _mapped(mapping, "output_file")
    events = _events(mapping)
    mcp = _mcp(mapping, resolve)
    tool_filter = _tool_filter(mapping)
    max_depth = _mapped(mapping, "max_depth")
    settings = _settings(mapping)
    mapping.finish()
    harness = HarnessMap(
        tail=tail,
        model=model,
        effort=effort,
        effort_values=effort_values,
        persona=persona,
        output_schema=output_schema,
        string_formats=string_formats,
        output_file=output_file,
        events=events,
        mcp=mcp,
        tool_filter=tool_filter,
        max_depth=max_depth,
        provider_managed=delegation is not None,
        settings=settings,
    )
    return harness


def _fail(reader: OptionReader, path: str, problem: str) -> NoReturn:
    reader.fail(path, problem)


def _fragment(
    reader: OptionReader, path: str, value: JsonValue, slot: str, *, optional: bool = False
) -> Fragment | None:
    """A list of argv elements whose placeholders are those `slot` may use."""
    if value is None and optional:
        return None
    if not isinstance(value, list):
        _fail(reader, path, f"must be a list of strings, not {type_name(value)}")
    allowed = SLOT_PLACEHOLDERS[slot]
    for index, element in enumerate(value):
        if not isinstance(element, str) or "\0" in element:
            _fail(reader, f"{path}[{index}]", f"must be a string without NUL, not {element!r}")
        for match in PLACEHOLDER.finditer(element):
            name, how = match.group(1), match.group(2)
            if name not in allowed:
                usable = ", ".join("{" + p + "}" for p in sorted(allowed)) or "none"
                _fail(
                    reader,
                    f"{path}[{index}]",
                    f"placeholder {{{name}}} does not belong here (usable: {usable})",
                )
            if how is not None and how not in FILTERS:
                _fail(reader, f"{path}[{index}]", f"unknown quoting :{how} (expected :toml or :json)")
    return tuple(value)


def _requiring(reader: OptionReader, path: str, fragment: Fragment, names: Sequence[str]) -> None:
    used = {match.group(1) for element in fragment for match in PLACEHOLDER.finditer(element)}
    if not used & set(names):
        wanted = " or ".join("{" + name + "}" for name in names)
        _fail(reader, path, f"must pass the value on: no element holds {wanted}")


def _mapped(mapping: OptionReader, key: str) -> Fragment | None:
    fragment = _fragment(mapping, mapping.path(key), mapping.raw(key), key, optional=True)
    if fragment is not None:
        required = sorted(SLOT_PLACEHOLDERS[key])
        _requiring(mapping, mapping.path(key), fragment, required)
    return fragment


def _effort(mapping: OptionReader) -> tuple[Fragment | None, frozenset[str]]:
    raw = mapping.raw("effort")
    if raw is None or isinstance(raw, list):
        return _mapped(mapping, "effort"), frozenset()
    effort = mapping.nested("effort")
    fragment = _fragment(effort, effort.path("argv"), effort.raw("argv"), "effort")
    assert fragment is not None
    _requiring(effort, effort.path("argv"), fragment, ["effort"])
    values = _strings(effort, "values")
    effort.finish()
    return fragment, frozenset(values)


def _output_schema(mapping: OptionReader) -> tuple[Fragment | None, frozenset[str]]:
    raw = mapping.raw("output_schema")
    if raw is None or isinstance(raw, list):
        return _mapped(mapping, "output_schema"), frozenset()
    schema = mapping.nested("output_schema")
    fragment = _fragment(schema, schema.path("argv"), schema.raw("argv"), "output_schema")
    assert fragment is not None
    _requiring(schema, schema.path("argv"), fragment, ["output_schema_file"])
    formats = _strings(schema, "string_formats")
    schema.finish()
    return fragment, frozenset(formats)


def _events(mapping: OptionReader) -> EventsMap | None:
    if mapping.raw("events") is None:
        return None
    events = mapping.nested("events")
    argv = _fragment(events, events.path("argv"), events.raw("argv"), "events")
    otherwise = _fragment(events, events.path("otherwise"), events.raw("otherwise"), "events", optional=True)
    event_format = events.required_string("format")
    if event_format not in EVENT_FORMATS:
        events.fail(events.path("format"), f"must be one of {', '.join(sorted(EVENT_FORMATS))}")
    events.finish()
    assert argv is not None
    return EventsMap(argv=argv, otherwise=otherwise or (), format=event_format)


def _mcp(mapping: OptionReader, resolve: Callable[[str], str | None]) -> McpMap | None:
    if mapping.raw("mcp") is None:
        return None
    mcp = mapping.nested("mcp")
    mcp_format = mcp.required_string("format")
    if mcp_format not in MCP_FORMATS:
        mcp.fail(mcp.path("format"), f"must be one of {', '.join(sorted(MCP_FORMATS))}")
    argv = _fragment(mcp, mcp.path("argv"), mcp.raw("argv"), "mcp")
    assert argv is not None
    _requiring(mcp, mcp.path("argv"), argv, ["mcp_config_file", "mcp_config"])
    commands: dict[str, str] = {}
    for index, name in enumerate(_strings(mcp, "stdio_commands")):
        program = resolve(name)
        if program is None:
            mcp.fail(
                f"{mcp.path('stdio_commands')}[{index}]",
                f'"{name}" is not an executable file (looked up on the negotiator\'s PATH)',
            )
        commands[name] = program
    origins: set[str] = set()
    for index, origin in enumerate(_strings(mcp, "url_origins")):
        parsed = url_origin(origin)
        if parsed is None or urlsplit(origin).path not in ("", "/"):
            mcp.fail(
                f"{mcp.path('url_origins')}[{index}]", f"{origin!r} is not an http(s)://host[:port] origin"
            )
        origins.add(parsed)
    mcp.finish()
    offered = MCP_FORMATS[mcp_format]
    transports = ({"stdio"} if commands else set()) | ((offered - {"stdio"}) if origins else set())
    return McpMap(
        argv=argv,
        format=mcp_format,
        stdio_commands=MappingProxyType(commands),
        url_origins=frozenset(origins),
        transports=frozenset(transports) & offered & MCP_TRANSPORTS,
    )


def _tool_filter(mapping: OptionReader) -> ToolFilterMap | None:
    if mapping.raw("tool_filter") is None:
        return None
    tools = mapping.nested("tool_filter")
    fragments = []
    for key in ("allow", "deny"):
        fragment = _fragment(tools, tools.path(key), tools.raw(key), "tool_filter")
        assert fragment is not None
        _requiring(tools, tools.path(key), fragment, ["tools"])
        fragments.append(fragment)
    separator = tools.string("separator", default=",")
    assert separator is not None
    tools.finish()
    return ToolFilterMap(allow=fragments[0], deny=fragments[1], separator=separator)


def _settings(mapping: OptionReader) -> Mapping[str, SettingMap]:
    if mapping.raw("settings") is None:
        return MappingProxyType({})
    settings = mapping.nested("settings")
    out: dict[str, SettingMap] = {}
    for name in settings.keys():  # noqa: SIM118 (an OptionReader, not a dict)
        if name in BUILT_IN_SETTINGS:
            settings.fail(settings.path(name), "is a setting the command adapter interprets itself")
        entry = settings.nested(name)
        argv = _fragment(entry, entry.path("argv"), entry.raw("argv"), "settings")
        assert argv is not None
        setting_type = entry.string("type", default="string")
        assert setting_type is not None
        if setting_type not in SETTING_TYPES:
            entry.fail(entry.path("type"), f"must be one of {', '.join(sorted(SETTING_TYPES))}")
        if setting_type != "boolean":
            _requiring(entry, entry.path("argv"), argv, ["value"])
        values = tuple(_strings(entry, "values"))
        minimum = _number(entry, "minimum")
        maximum = _number(entry, "maximum")
        setting = SettingMap(argv=argv, type=setting_type, values=values, minimum=minimum, maximum=maximum)
        default = entry.raw("default")
        if default is not None:
            problem = HarnessMap(settings={name: setting}).check_setting(name, default)
            if problem:
                entry.fail(entry.path("default"), problem)
            setting = SettingMap(
                argv=argv, type=setting_type, values=values, minimum=minimum, maximum=maximum, default=default
            )
        entry.finish()
        out[name] = setting
    settings.finish()
    return MappingProxyType(out)


def _number(reader: OptionReader, key: str) -> float | None:
    value = reader.raw(key)
    if value is None:
        return None
    if not is_number(value) or not math.isfinite(value):
        reader.fail(reader.path(key), f"must be a number, not {value!r}")
    return float(value)


def _strings(reader: OptionReader, key: str) -> list[str]:
    value = reader.raw(key)
    if value is None:
        return []
    if not isinstance(value, list):
        reader.fail(reader.path(key), f"must be a list of strings, not {type_name(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item or "\0" in item:
            reader.fail(f"{reader.path(key)}[{index}]", f"must be a non-empty string, not {item!r}")
    return list(value)
