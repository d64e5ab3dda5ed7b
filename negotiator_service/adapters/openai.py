"""The OpenAI-compatible adapter: any server that speaks chat completions.

Structured output goes through `response_format` with a JSON schema. With
`strict_schema` (the default) the schema is first rewritten into the strict
subset (`_strict.strict_form`) and sent with `strict: true`, so the provider
constrains decoding; a schema with no sound strict form, or a model
configured `strict_schema: false`, is sent as the caller wrote it with
`strict: false`. No schema a strict provider would refuse is sent with
`strict: true`, and the broker validates the text against the caller's
schema either way.

The declaration follows the rule in protos/README.md: what this code
carries but only the server can honour or ignore, and the reply cannot
show, is UNKNOWN until the operator's config states it SUPPORTED for the
server or a model: `effort` (reasoning_effort, which a server may reject or
silently drop), `settings` (sampling parameters) and `persona` (a system
message). What the negotiator enforces itself is SUPPORTED: structured
output (every output is validated), tool_filter (the ToolBox hides
tools), stateful_history (the negotiator holds and resends the history).
The declaration's default model is `model`, so a call naming no model is
judged by that model's entry of `declaration.models` when it has one.

Conversations (stateful_history): the provider is stateless, so the history
is the conversation state, `{"messages": [...]}`. The committed messages are
sent before the new user message, and the reply's state is those messages
plus the assistant's answer; the negotiator commits it only after the whole
call succeeded.

Tools (tool_registration) go through function calling: the call's visible
tools are sent as `tools: [{type: function, function: {name, description,
parameters}}]`. While the model answers with `tool_calls`, each call is run
through the call's ToolBox in order (which asks the caller, validates, and
hides filtered tools: that is how tool_filter is honoured), the assistant
message and one `{"role": "tool"}` message per call are appended, and the
completion is requested again, for at most MAX_TOOL_ROUNDS rounds. The call's
MCP servers (mcp) are connected for the length of the call by the
negotiator's own client (mcp_tools.py), and their tools join the caller's in
one tools.CallToolBox, so the same filter, risk and approval rules hold for
both; a server whose tools changed is listed again before the next round. A persona
is sent as a leading system (or, per `persona_role`, developer) message (it is
not part of the conversation state: each call states its own).

Settings are checked by type and range (openai_settings.py) before dispatch and
again here. The `usage` of every completion is summed over the call's rounds
into the reply.

Options:
    base_url:        e.g. http://127.0.0.1:8000/v1 (required)
    api_key_env:     name of the environment variable holding the key (required;
                     read at call time, so a rotated key needs no restart)
    model:           the default model (required)
    timeout_seconds: default 60
    organization:    sent as OpenAI-Organization (optional)
    strict_schema:   send structured output with `strict: true` (after the strict
                     rewrite) where the schema has a strict form; false: always
                     `strict: false` (default true)
    max_tokens_field: max_tokens | max_completion_tokens: the name a max-tokens setting
                     (either name) is sent under; unset: the name the caller used
    persona_role:    system | developer: the role of the persona message (default system)
    models:          per-model options, {MODEL: {strict_schema, max_tokens_field, persona_role}}
    max_response_bytes: the largest response body read from the provider
                     (default 8 MiB, after content decoding). The body is read
                     as a stream and reading stops at the cap: the call fails
                     with ADAPTER_REPLY_TOO_LARGE and the connection is dropped,
                     so one huge reply never holds more than the cap in memory.

HTTP goes through one aiohttp session per adapter (opened at the first
request, closed with the adapter), set up so that a provider sees what
httpx's AsyncClient sends: its default headers and JSON body bytes, the
proxy the environment names (read when the adapter is built, by httpx's
rules for HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY), its trust store
for https (certifi, or SSL_CERT_FILE / SSL_CERT_DIR), URL credentials as
Basic auth, the cookies a provider set, and no redirect followed. An
unreachable server, a dropped connection or an answer that is not HTTP is
ADAPTER_UNAVAILABLE ("cannot reach URL: ..."), the call's deadline its
timeout, and any other HTTP failure (a body that does not decode)
ADAPTER_INTERNAL.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import email.utils
import json
import os
import re
import time
from collections.abc import AsyncGenerator, Collection, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from agentsidecar.negotiator_service import errors, mcp_tools
from agentsidecar.negotiator_service.adapters._calls import Deadline, call_deadline, check_call, plain_json
from agentsidecar.negotiator_service.adapters._options import OptionReader
from agentsidecar.negotiator_service.adapters._strict import STRICT_FORMATS, strict_form
from agentsidecar.negotiator_service.adapters.openai_settings import (
    ACCEPTED_SETTINGS,
    MAX_TOKENS_FIELDS,
    setting_problems,
)
from agentsidecar.negotiator_service.declarations import narrow
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterKind,
    AdapterReply,
    AdapterSpec,
    CallKind,
    CallOptions,
    Capability,
    CapabilityState,
    Declaration,
    JsonValue,
    StreamDelta,
    StreamEvent,
    StreamItem,
    ToolOutcome,
    ToolSpec,
    Usage,
    strict_json,
)
from agentsidecar.negotiator_service.probes import ProbeEvidence, ProbeRequest, settle
from agentsidecar.negotiator_service.tools import CallToolBox
from agentsidecar.sidecar_runtime.tracing import trace_metadata

# aiohttp (and yarl, which it brings) is imported when an adapter is built, not with this
# module: its pure parts (request bodies, replies, SSE) serve without it.
if TYPE_CHECKING:
    import ssl

    import aiohttp
    from yarl import URL

DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
STRING_FORMATS = STRICT_FORMATS
# The values chat completions documents for `reasoning_effort`; a model takes some of them
# (config lists which per model with `effort_levels`).
EFFORT_LEVELS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh"})
IMPLEMENTED = frozenset(
    {
        Capability.STRUCTURED_OUTPUT,
        Capability.MODEL_OVERRIDE,
        Capability.EFFORT,
        Capability.SETTINGS,
        Capability.STATEFUL_HISTORY,
        Capability.TOOL_REGISTRATION,
        # The negotiator's ToolBox enforces the filter: hidden tools are neither
        # sent to the model nor run when it names them anyway.
        Capability.TOOL_FILTER,
        Capability.PERSONA,  # a leading system (or developer) message
        # MCP servers are run by the negotiator's own client (mcp_tools.py) in the tool loop.
        Capability.MCP,
        # Completions are read as server-sent events (`stream: true`); see `stream`.
        Capability.STREAM_EVENTS,
    }
)
MCP_TRANSPORTS_IMPLEMENTED = frozenset({"stdio", "http", "sse"})
# Carried by this code, honoured (or rejected, or silently dropped) by the server alone,
# with no sign of it in the reply: UNKNOWN until config states them for a server or model.
UPSTREAM_DEPENDENT = frozenset({Capability.EFFORT, Capability.SETTINGS, Capability.PERSONA})
_QUOTE_LIMIT = 500  # characters of a provider's body quoted in an error

# Rounds of tool calls one call may take before it counts as a runaway loop.
MAX_TOOL_ROUNDS = 16


@dataclass(frozen=True, slots=True)
class ModelToolCall:
    """One entry of `message.tool_calls`: the model wants a function run."""

    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(frozen=True, slots=True)
class ToolRound:
    """A completion that asks for tool calls instead of answering."""

    assistant_message: dict[str, JsonValue]  # to send back, as the protocol requires
    calls: tuple[ModelToolCall, ...]
    usage: Usage | None = None


def _code_state(capability: Capability) -> CapabilityState:
    if capability not in IMPLEMENTED:
        return CapabilityState.UNSUPPORTED
    if capability in UPSTREAM_DEPENDENT:
        return CapabilityState.UNKNOWN
    return CapabilityState.SUPPORTED


def code_declaration(shortname: str, default_model: str = "") -> Declaration:
    return Declaration(
        shortname=shortname,
        kind=AdapterKind.FRAMEWORK,
        capabilities=MappingProxyType({capability: _code_state(capability) for capability in Capability}),
        accepted_settings=ACCEPTED_SETTINGS,
        string_formats=STRING_FORMATS,
        mcp_transports=MCP_TRANSPORTS_IMPLEMENTED,
        effort_levels=EFFORT_LEVELS,
        default_model=default_model,
    )


PERSONA_ROLES = ("system", "developer")


@dataclass(frozen=True, slots=True)
class ModelOptions:
    """What the adapter sends differently for one model (options `models.<model>`, else the adapter's)."""

    strict_schema: bool = True
    # The field a max-tokens setting is sent as (either name the caller used); None: as the caller named it.
    max_tokens_field: str | None = None
    persona_role: str = "system"  # the role of the persona message: "system" or "developer"


@dataclass(frozen=True, slots=True)
class OpenAIOptions:
    base_url: str
    api_key_env: str
    model: str
    timeout_seconds: float
    organization: str | None
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    defaults: ModelOptions = ModelOptions()
    # Models whose options differ from the adapter's.
    models: Mapping[str, ModelOptions] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def strict_schema(self) -> bool:
        return self.defaults.strict_schema

    def for_model(self, model: str) -> ModelOptions:
        return self.models.get(model, self.defaults)

    def strict_for(self, model: str) -> bool:
        return self.for_model(model).strict_schema


def _model_options(reader: OptionReader, base: ModelOptions) -> ModelOptions:
    max_tokens_field = reader.string("max_tokens_field", default=base.max_tokens_field)
    if max_tokens_field is not None and max_tokens_field not in MAX_TOKENS_FIELDS:
        reader.fail(reader.path("max_tokens_field"), f"must be one of {', '.join(MAX_TOKENS_FIELDS)}")
    persona_role = reader.string("persona_role", default=base.persona_role)
    if persona_role not in PERSONA_ROLES:
        reader.fail(reader.path("persona_role"), f"must be one of {', '.join(PERSONA_ROLES)}")
    return ModelOptions(
        strict_schema=reader.boolean("strict_schema", base.strict_schema),
        max_tokens_field=max_tokens_field,
        persona_role=persona_role,
    )


def read_options(spec: AdapterSpec) -> OpenAIOptions:
    reader = OptionReader(spec, spec.options)
    from yarl import URL

    base_url = reader.required_string("base_url").rstrip("/")
    try:
        url = URL(base_url)
    except ValueError as exc:
        reader.fail("base_url", f"is not a URL: {exc}")
    if url.scheme not in ("http", "https") or not url.raw_host:
        reader.fail("base_url", f'must be an http:// or https:// URL with a host, not "{base_url}"')
    api_key_env = reader.required_string("api_key_env")
    model = reader.required_string("model")
    timeout = reader.positive_number("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    assert timeout is not None  # it has a default
    organization = reader.string("organization")
    max_response_bytes = reader.positive_int("max_response_bytes", DEFAULT_MAX_RESPONSE_BYTES)
    defaults = _model_options(reader, ModelOptions())
    per_model: dict[str, ModelOptions] = {}
    if reader.has("models"):
        raw_models = reader.raw("models")
        if not isinstance(raw_models, Mapping):
            reader.fail("models", "must be a mapping from model name to its options")
        models = reader.nested("models")
        for name in sorted(str(key) for key in raw_models):
            if not name.strip():
                reader.fail("models", "contains an empty model name")
            model_reader = models.nested(name)
            per_model[name] = _model_options(model_reader, defaults)
            model_reader.finish()
        models.finish()
    reader.finish()
    return OpenAIOptions(
        base_url=base_url,
        api_key_env=api_key_env,
        model=model,
        timeout_seconds=timeout,
        organization=organization,
        max_response_bytes=max_response_bytes,
        defaults=defaults,
        models=MappingProxyType(per_model),
    )


def history(adapter: str, state: JsonValue) -> list[dict[str, JsonValue]]:
    """The committed messages of a conversation state (none at its start)."""
    if state is None:
        return []
    messages = state.get("messages") if isinstance(state, dict) else None
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
    ):
        raise errors.AdapterInternal(adapter, "the conversation state is not a list of chat messages")
    return [dict(m) for m in messages]


def request_body(
    call: AdapterCall,
    default_model: str,
    *,
    produce: bool,
    prior: list[dict[str, JsonValue]] | None = None,
    followups: list[dict[str, JsonValue]] | None = None,
    strict: bool = True,
    model_options: ModelOptions | None = None,
) -> dict[str, JsonValue]:
    """The chat-completions request for a call that passed `check_call` and `setting_problems`.

    `prior` is the conversation's history; `followups` are this call's tool
    rounds so far (assistant tool_calls and tool results), after the prompt.
    `strict`: whether the model takes `strict: true` schemas (see `response_format`).
    `model_options` say how the model takes the persona and the max-tokens limit.
    """
    options = model_options if model_options is not None else ModelOptions()
    persona: list[dict[str, JsonValue]] = (
        [{"role": options.persona_role, "content": call.options.persona}]
        if call.options.persona is not None
        else []
    )
    body: dict[str, JsonValue] = {
        "model": call.options.model or default_model,
        "messages": [*persona, *(prior or []), {"role": "user", "content": call.prompt}, *(followups or [])],
    }
    if call.tools is not None and call.tools.specs:
        body["tools"] = tool_definitions(call.tools.specs)
    for name, value in call.options.settings.items():
        if name in MAX_TOKENS_FIELDS and options.max_tokens_field is not None:
            # One limit under two names: the model takes the one its options name.
            name = options.max_tokens_field
        # protobuf Struct carries every number as a double; providers reject 256.0 max_tokens.
        body[name] = plain_json(value, integral_floats=True)
    if call.options.effort is not None:
        body["reasoning_effort"] = call.options.effort
    if produce:
        assert call.output_schema is not None  # check_call refuses Produce without one
        body["response_format"] = response_format(call.output_schema, strict=strict)
    return body


def response_format(schema: Mapping[str, JsonValue], *, strict: bool) -> dict[str, JsonValue]:
    """`response_format` for a caller's schema: its strict form with `strict: true` where it has one.

    Without a strict form (or with `strict` off for the model) the caller's
    schema goes as it is, with `strict: false`: a strict provider would
    refuse it, and rewriting it further would change what it admits.
    """
    plain = plain_json(schema)
    converted = strict_form(plain) if strict else None
    json_schema: dict[str, JsonValue] = (
        {"name": "output", "schema": converted, "strict": True}
        if converted is not None
        else {"name": "output", "schema": plain, "strict": False}
    )
    return {"type": "json_schema", "json_schema": json_schema}


def tool_definitions(specs: tuple[ToolSpec, ...]) -> list[JsonValue]:
    """The `tools` request field: one function per visible tool."""
    definitions: list[JsonValue] = []
    for spec in specs:
        function: dict[str, JsonValue] = {"name": spec.name}
        if spec.description:
            function["description"] = spec.description
        function["parameters"] = plain_json(spec.arguments_schema)
        definitions.append({"type": "function", "function": function})
    return definitions


def tool_message(call_id: str, outcome: ToolOutcome) -> dict[str, JsonValue]:
    """The `role: tool` message answering one tool call: the JSON result, or why there is none."""
    if outcome.denied:
        content = f"denied: {outcome.error or 'the caller denied this call'}"
    elif outcome.error is not None:
        content = f"error: {outcome.error}"
    else:
        content = json.dumps(outcome.result, ensure_ascii=False)
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def read_response(
    adapter: str, status: int, headers: Mapping[str, str], body: bytes, *, produce: bool
) -> AdapterReply | ToolRound:
    """Map one HTTP answer to a reply, a round of tool calls, or the error it stands for. Pure."""
    if status == 429:
        raise errors.AdapterRateLimited(
            adapter, f"HTTP 429: {provider_message(body)}", retry_after=retry_after_seconds(headers)
        )
    if status in (401, 403):
        raise errors.AdapterMisconfigured(
            adapter, f"HTTP {status}: {provider_message(body)} (check the API key and organization)"
        )
    if status == 404:
        raise errors.AdapterMisconfigured(
            adapter, f"HTTP 404: {provider_message(body)} (check base_url and the model)"
        )
    if status == 408 or status >= 500:
        raise errors.AdapterUnavailable(adapter, f"HTTP {status}: {provider_message(body)}")
    if 400 <= status < 500:
        raise errors.AdapterRefused(adapter, f"HTTP {status}: {provider_message(body)}")
    if not 200 <= status < 300:
        raise errors.AdapterInternal(adapter, f"unexpected HTTP {status}: {provider_message(body)}")

    try:
        completion = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise errors.AdapterInternal(
            adapter, f"malformed response body, not JSON ({exc}): {_quote(body)}"
        ) from exc
    if not isinstance(completion, dict):
        raise errors.AdapterInternal(adapter, f"malformed response body, not a JSON object: {_quote(body)}")
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices:
        error = completion.get("error")
        detail = f"; error: {_quote(json.dumps(error).encode())}" if error is not None else ""
        raise errors.AdapterInternal(adapter, f"response has no choices{detail}")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise errors.AdapterInternal(adapter, "choices[0] has no message")
    refusal = message.get("refusal")
    if refusal:
        raise errors.AdapterRefused(adapter, f"the model refused: {refusal}")
    finish_reason = choice.get("finish_reason")
    if finish_reason == "content_filter":
        raise errors.AdapterRefused(adapter, "the provider's content filter stopped the output")
    usage = read_usage(completion.get("usage"))
    # Some providers finish a tool round with "stop"; the tool_calls decide.
    if message.get("tool_calls"):
        return replace(_tool_round(adapter, message), usage=usage)
    content = message.get("content")
    if not isinstance(content, str):
        raise errors.AdapterInternal(
            adapter, f"choices[0].message has no text content (finish_reason {finish_reason!r})"
        )
    if produce and finish_reason == "length":
        raise errors.AdapterInternal(adapter, "output truncated by max tokens")
    return AdapterReply(text=content, usage=usage)


def _count(value: JsonValue) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def read_usage(usage: JsonValue) -> Usage | None:
    """A completion's `usage` (None when it has none); a count missing or malformed reads as 0."""
    if not isinstance(usage, dict):
        return None
    completion_details = usage.get("completion_tokens_details")
    prompt_details = usage.get("prompt_tokens_details")
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        reasoning_tokens=_count(completion_details.get("reasoning_tokens"))
        if isinstance(completion_details, dict)
        else 0,
        cached_tokens=_count(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else 0,
    )


def _summed(total: Usage | None, more: Usage | None) -> Usage | None:
    if more is None:
        return total
    return more if total is None else total + more


def _tool_round(adapter: str, message: dict[str, Any]) -> ToolRound:
    raw_calls = message["tool_calls"]
    if not isinstance(raw_calls, list):
        raise errors.AdapterInternal(adapter, "choices[0].message.tool_calls is not a list")
    calls = []
    for index, item in enumerate(raw_calls):
        function = item.get("function") if isinstance(item, dict) else None
        if (
            not isinstance(item, dict)
            or item.get("type", "function") != "function"
            or not isinstance(item.get("id"), str)
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str)
        ):
            quoted = _quote(json.dumps(item).encode())
            raise errors.AdapterInternal(
                adapter, f"choices[0].message.tool_calls[{index}] is malformed: {quoted}"
            )
        calls.append(ModelToolCall(id=item["id"], name=function["name"], arguments=function["arguments"]))
    content = message.get("content")
    assistant: dict[str, JsonValue] = {
        "role": "assistant",
        "content": content if isinstance(content, str) else None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ],
    }
    return ToolRound(assistant_message=assistant, calls=tuple(calls))


def provider_message(body: bytes) -> str:
    """The `error.message` of an OpenAI-shaped error body, else the body itself."""
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _quote(body) or "(empty body)"
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        message = parsed["error"].get("message")
        if isinstance(message, str) and message:
            return message[:_QUOTE_LIMIT]
    return _quote(body)


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The throttling hint: `retry-after-ms`, else `Retry-After` in seconds or as an HTTP date."""
    lowered = {name.lower(): value for name, value in headers.items()}
    if "retry-after-ms" in lowered:
        try:
            return max(0.0, float(lowered["retry-after-ms"]) / 1000)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _quote(body: bytes) -> str:
    return body.decode("utf-8", errors="replace")[:_QUOTE_LIMIT]


_DEFAULT_PORTS = MappingProxyType({"http": 80, "https": 443})


@dataclass(frozen=True, slots=True)
class _ProxyRule:
    """One entry of httpx's proxy routing: a URL pattern and the proxy it names (None: direct)."""

    scheme: str  # "" for any
    host: str  # "" for any; a leading "*" matches subdomains ("*." only them)
    port: int | None
    proxy: str | None

    def matches(self, scheme: str, host: str, port: int | None) -> bool:
        if self.scheme and self.scheme != scheme:
            return False
        if self.port is not None and self.port != port:
            return False
        if not self.host or self.host == "*":
            return True
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        if self.host.startswith("*"):
            domain = self.host[1:]
            return host == domain or (host.endswith(f".{domain}") and len(host) > len(domain) + 1)
        return host == self.host

    @property
    def priority(self) -> tuple[int, int, int]:
        """httpx's order: a pattern with a port first, then the longer host, then the longer scheme."""
        return (0 if self.port is not None else 1, -len(self.host), -len(self.scheme))


def _proxy_rule(pattern: str, proxy: str | None) -> _ProxyRule | None:
    """The rule of one httpx mount pattern (`all://*example.com`, `https://`); None if it parses as none."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(pattern)
        port = parts.port
    except ValueError:
        return None
    scheme = "" if parts.scheme == "all" else parts.scheme
    if port is not None and _DEFAULT_PORTS.get(scheme) == port:
        port = None  # as httpx normalises a scheme's default port away
    return _ProxyRule(scheme, (parts.hostname or "").lower(), port, proxy)


def environment_proxy(scheme: str, host: str, port: int | None, proxies: Mapping[str, str]) -> str | None:
    """The proxy httpx's client picks from the environment for a URL; None: connect directly. Pure.

    `proxies` is `urllib.request.getproxies()` (HTTP_PROXY, HTTPS_PROXY,
    ALL_PROXY, NO_PROXY, lower- or upper-case); `port` is None for the
    scheme's default port. As httpx reads them: each of http, https and all
    names a proxy for that scheme (`http://` assumed when the value has no
    scheme), and each NO_PROXY entry a destination reached directly: `*`
    disables every proxy, an IP address or `localhost` is that host,
    `.example.com` its subdomains, `example.com` the domain and its
    subdomains, an entry with `://` a pattern of its own. The most specific
    matching rule decides.
    """
    rules: list[_ProxyRule] = []
    for name in ("http", "https", "all"):
        value = proxies.get(name)
        if value:
            rule = _proxy_rule(f"{name}://", value if "://" in value else f"http://{value}")
            if rule is not None:
                rules.append(rule)
    for entry in (item.strip() for item in proxies.get("no", "").split(",")):
        if entry == "*":
            return None
        if not entry:
            continue
        if "://" in entry:
            pattern = entry
        elif _is_ip_address(entry, 4) or entry.lower() == "localhost":
            pattern = f"all://{entry}"
        elif _is_ip_address(entry, 6):
            pattern = f"all://[{entry}]"
        else:
            pattern = f"all://*{entry}"
        rule = _proxy_rule(pattern, None)
        if rule is not None:
            rules.append(rule)
    host = host.lower()
    for rule in sorted(rules, key=lambda rule: rule.priority):
        if rule.matches(scheme, host, port):
            return rule.proxy
    return None


def _is_ip_address(text: str, version: int) -> bool:
    import ipaddress

    try:
        address = ipaddress.ip_address(text.split("/")[0])
    except ValueError:
        return False
    return address.version == version


def _trust_store() -> ssl.SSLContext:
    """httpx's default verification: SSL_CERT_FILE, else SSL_CERT_DIR, else certifi's bundle."""
    import ssl

    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


# json.dumps with these arguments builds this same encoder on every call; encode() keeps no state.
_JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _json_bytes(body: JsonValue) -> bytes:
    """A request body as httpx's client encodes `json=`: compact, UTF-8, no NaN."""
    return _JSON_ENCODER.encode(body).encode()


def _http_failure(adapter: str, url: URL, exc: Exception) -> errors.AdapterFailure | None:
    """The adapter error an exception of the HTTP exchange stands for; None for one that is not HTTP's.

    Unreachable, dropped, cut short or answered with something that is not
    HTTP: ADAPTER_UNAVAILABLE, as for httpx's transport errors. A body whose
    content encoding does not decode: ADAPTER_INTERNAL, as httpx's
    DecodingError. The exception is quoted as `Name('message')`, never its
    arguments (a connection key holds the proxy's credentials).
    """
    import aiohttp
    from aiohttp.http_exceptions import ContentEncodingError

    if isinstance(exc, errors.NegotiatorError):
        return None
    quoted = f"{type(exc).__name__}({str(exc)!r})"
    if isinstance(exc, aiohttp.ClientPayloadError) and isinstance(exc.__cause__, ContentEncodingError):
        return errors.AdapterInternal(adapter, f"HTTP exchange with {url} failed: {quoted}")
    if isinstance(
        exc,
        aiohttp.ClientConnectionError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError | OSError,
    ):
        return errors.AdapterUnavailable(adapter, f"cannot reach {url}: {quoted}")
    if isinstance(exc, aiohttp.ClientError):
        return errors.AdapterInternal(adapter, f"HTTP exchange with {url} failed: {quoted}")
    return None


# httpx's pool limits and keep-alive expiry, which the adapter's session keeps.
HTTP_MAX_CONNECTIONS = 100
HTTP_KEEPALIVE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class _HttpSetup:
    """How an adapter's requests are sent, decided once from its base_url and the environment."""

    base: str  # base_url without its credentials
    default_headers: Mapping[str, str]
    authorization: str | None  # Basic auth from credentials in base_url, in place of the key
    proxy: URL | None
    tls_context: ssl.SSLContext | None  # None: the endpoint and its proxy are plain http
    timeout: aiohttp.ClientTimeout

    @classmethod
    def for_base_url(cls, base_url: str, shortname: str) -> _HttpSetup:
        import importlib.metadata
        from urllib.request import getproxies

        import aiohttp
        from yarl import URL

        parsed = URL(base_url)
        authorization = None
        if parsed.user or parsed.password:
            userpass = f"{parsed.user or ''}:{parsed.password or ''}".encode()
            authorization = f"Basic {base64.b64encode(userpass).decode('ascii')}"
        base = (
            str(parsed.with_user(None))
            if parsed.user is not None or parsed.password is not None
            else base_url
        )
        port = parsed.explicit_port
        if port is not None and _DEFAULT_PORTS.get(parsed.scheme) == port:
            port = None
        named = environment_proxy(parsed.scheme, parsed.raw_host or "", port, getproxies())
        proxy = URL(named) if named is not None else None
        if proxy is not None and proxy.scheme not in ("http", "https"):
            raise errors.ConfigError(
                f'adapter "{shortname}": the proxy the environment names for {base} ({proxy.scheme}://...) '
                "is not an http:// or https:// proxy"
            )
        tls = parsed.scheme == "https" or (proxy is not None and proxy.scheme == "https")
        headers = {
            # The client names itself and what sends for it; Accept: */* and the
            # Accept-Encoding of the codings it decodes are aiohttp's own.
            "User-Agent": (
                f"agentsidecar/{importlib.metadata.version('agentsidecar')} "
                f"aiohttp/{importlib.metadata.version('aiohttp')}"
            ),
            "Connection": "keep-alive",
        }
        return cls(
            base=base,
            default_headers=MappingProxyType(headers),
            authorization=authorization,
            proxy=proxy,
            tls_context=_trust_store() if tls else None,
            # No aiohttp timeouts: each exchange is bounded by one asyncio.timeout, its
            # deadline; a phase timer given the same budget could never fire first.
            timeout=aiohttp.ClientTimeout(),
        )

    def url(self, path: str) -> URL:
        from yarl import URL

        return URL(f"{self.base}{path}")


class OpenAIAdapter:
    """Chat completions over one pooled HTTP session; see the module docstring for the options."""

    implementation = "openai"

    def __init__(self, spec: AdapterSpec) -> None:
        self._options = read_options(spec)
        # Code narrowed by config; `_declaration` is this with the probe evidence settled on it.
        self._base_declaration = narrow(
            code_declaration(spec.shortname, self._options.model),
            spec.declaration,
            shortname=spec.shortname,
            implementation="openai",
        )
        self._declaration = self._base_declaration
        self._evidence: dict[str, tuple[ProbeEvidence, ...]] = {}
        self._http = _HttpSetup.for_base_url(self._options.base_url, spec.shortname)
        # Parsed once: a string URL would be parsed again on every request.
        self._endpoint = self._http.url("/chat/completions")
        # Opened at the first request: a session belongs to the event loop it starts in.
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @property
    def declaration(self) -> Declaration:
        return self._declaration

    # -- probes (prober.py runs them) -------------------------------------

    @property
    def probe_evidence(self) -> Mapping[str, tuple[ProbeEvidence, ...]]:
        """The latest evidence per model."""
        return MappingProxyType(self._evidence)

    def probe_strict(self, model: str) -> bool:
        """Whether structured output goes to `model` with `strict: true`."""
        return self._options.strict_for(model)

    def record_probes(self, model: str, evidence: tuple[ProbeEvidence, ...]) -> None:
        """Keep `evidence` as `model`'s latest and settle the declaration from code, config and evidence."""
        self._evidence[model] = evidence
        self._declaration = settle(self._base_declaration, self._evidence)

    async def probe_exchange(self, request: ProbeRequest) -> tuple[int, bytes]:
        """Send one probe; its status and body (capped like a call's). Raises AdapterError when unanswered."""
        shortname = self._declaration.shortname
        if self._closed:
            raise errors.AdapterUnavailable(shortname, "the adapter is closed")
        url = self._http.url(request.path)
        body = dict(request.body) if request.body is not None else None
        deadline = call_deadline(shortname, None, self._options.timeout_seconds)
        status, _, content = await self._exchange(request.method, url, body, self._headers(), deadline)
        return status, content

    async def invoke(self, call: AdapterCall) -> AdapterReply:
        check_call(self._declaration, call, CallKind.INVOKE, implemented=IMPLEMENTED)
        if call.options.stream_events:
            return await collect_stream(self.stream(call, CallKind.INVOKE))
        return await self._complete(call, produce=False)

    async def produce(self, call: AdapterCall) -> AdapterReply:
        check_call(self._declaration, call, CallKind.PRODUCE, implemented=IMPLEMENTED)
        if call.options.stream_events:
            return await collect_stream(self.stream(call, CallKind.PRODUCE))
        return await self._complete(call, produce=True)

    async def stream(self, call: AdapterCall, kind: CallKind) -> AsyncGenerator[StreamItem, None]:
        """The call as server-sent events: content deltas as the provider sends them, then the reply.

        Each completion is requested with `stream: true` and
        `stream_options.include_usage`. Tool calls arrive in pieces and are
        assembled per index; a round that ends in tool calls runs them
        through the call's ToolBox (as the unary loop does) and streams the
        next completion. Events (with stream_events): `tool_call` (JSON
        `{id, name, arguments}`) before a tool runs, `tool_result` (JSON
        `{id, name, denied, error}`) after. One deadline bounds the whole
        exchange, checked on every read; closing this iterator closes the
        open HTTP response, which drops its connection.
        """
        produce = kind is CallKind.PRODUCE
        check_call(self._declaration, call, kind, implemented=IMPLEMENTED)
        shortname = self._declaration.shortname
        if self._closed:
            raise errors.AdapterUnavailable(shortname, "the adapter is closed")
        # Before any MCP server starts; a tool_choice naming an MCP tool is checked once they are listed.
        self._refuse_settings(call, tools_known=not call.options.mcp_servers)
        headers = self._headers()
        in_conversation = call.options.conversation_id is not None
        prior = history(shortname, call.conversation_state) if in_conversation else []
        followups: list[dict[str, JsonValue]] = []
        budget = call_deadline(shortname, call.time_budget, self._options.timeout_seconds)
        when = None if budget.seconds is None else asyncio.get_running_loop().time() + budget.seconds
        async with contextlib.AsyncExitStack() as stack:
            if call.options.mcp_servers:
                call = await self._with_mcp_tools(call, stack)
                self._refuse_settings(call, tools_known=True)
            rounds = 0
            usage: Usage | None = None  # summed over the tool rounds, as the unary path sums it
            while True:
                if isinstance(call.tools, CallToolBox):
                    await call.tools.refresh()
                model_options = self._options.for_model(call.options.model or self._options.model)
                body = stream_body(
                    request_body(
                        call,
                        self._options.model,
                        produce=produce,
                        prior=prior,
                        followups=followups,
                        strict=model_options.strict_schema,
                        model_options=model_options,
                    )
                )
                assembly = StreamAssembly()
                completion = self._stream_completion(body, headers, budget, when, assembly, produce=produce)
                # Closed with this iterator: its finally closes the HTTP response.
                async with contextlib.aclosing(completion):
                    async for delta in completion:
                        yield StreamDelta(delta)
                usage = _summed(usage, read_usage(assembly.usage))
                answer = assembly.answer(shortname, produce=produce)
                if isinstance(answer, AdapterReply):
                    answer = replace(answer, usage=usage)
                    break
                rounds += 1
                if rounds > MAX_TOOL_ROUNDS:
                    raise errors.AdapterInternal(
                        shortname, f"no final answer after {MAX_TOOL_ROUNDS} rounds of tool calls"
                    )
                followups.append(answer.assistant_message)
                for model_call in answer.calls:
                    if call.options.stream_events:
                        yield StreamEvent("tool_call", _call_event(model_call))
                    [message] = await self._run_tools(call, (model_call,))
                    followups.append(message)
                    if call.options.stream_events:
                        yield StreamEvent("tool_result", _result_event(model_call, message))
        if not in_conversation:
            yield answer
            return
        turn = [*prior, {"role": "user", "content": call.prompt}, *followups]
        state = {"messages": [*turn, {"role": "assistant", "content": answer.text}]}
        yield AdapterReply(text=answer.text, conversation_state=state, usage=answer.usage)

    async def _stream_completion(
        self,
        body: dict[str, JsonValue],
        headers: dict[str, str],
        budget: Deadline,
        when: float | None,
        assembly: StreamAssembly,
        *,
        produce: bool,
    ) -> AsyncGenerator[str, None]:
        """One streamed completion: its content deltas, with the rest gathered into `assembly`."""
        shortname = self._declaration.shortname
        cap = self._options.max_response_bytes
        url = self._endpoint
        response: aiohttp.ClientResponse | None = None
        try:
            try:
                # The request and the first read of its answer come before any yield: one deadline
                # scope bounds both, as it bounds each later read.
                async with asyncio.timeout_at(when):
                    # Compression would hold deltas back until a compressed block fills: the stream
                    # asks for none.
                    response = await self._send("POST", url, body, headers, identity=True)
                    content_type = response.headers.get("content-type", "")
                    streamed = response.status == 200 and content_type.startswith("text/event-stream")
                    # Streamed: the first chunk of events; else the whole body (an error, or a server
                    # that answered the whole completion at once).
                    chunk = await (response.content.readany() if streamed else self._read_capped(response))
                if not streamed:
                    answer = read_response(
                        shortname, response.status, response.headers, chunk, produce=produce
                    )
                    assembly.whole(answer)
                    if isinstance(answer, AdapterReply) and answer.text:
                        yield answer.text
                    return
                received = 0
                # Identity was asked for, so the raw body is the events; a body encoded anyway is decoded.
                body_stream = response.content
                events = SseReader()
                while True:
                    if not chunk:
                        payloads = events.finish()
                    else:
                        received += len(chunk)
                        if received > cap:
                            raise self._too_large(f"streamed more than {cap} bytes")
                        payloads = events.feed(chunk)
                    for payload in payloads:
                        if payload == "[DONE]":
                            # Read on to the body's end, so the connection goes back to the pool.
                            events.ignore_rest()
                            break
                        delta = assembly.add(shortname, payload)
                        if delta:
                            yield delta
                    if not chunk:
                        break
                    if body_stream.is_eof():
                        # At the body's end a read returns at once, so no deadline can pass during it.
                        chunk = await body_stream.readany()
                    else:
                        async with asyncio.timeout_at(when):
                            chunk = await body_stream.readany()
            finally:
                if response is not None:
                    response.close()
        except TimeoutError as exc:
            raise budget.expired(shortname) from exc
        except Exception as exc:
            failure = _http_failure(shortname, url, exc)
            if failure is None:
                raise
            raise failure from exc

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def setting_problems(
        self, options: CallOptions, tool_names: Collection[str] | None
    ) -> list[tuple[str, str]]:
        """(field, problem) for each setting of a call this adapter would not send as it stands. Pure.

        The broker asks before dispatch (INVALID_REQUEST); `tool_names` are the
        tools the model would be offered, None while MCP servers may add some.
        """
        if not options.settings:
            return []
        return setting_problems(options.settings, tool_names)

    def _refuse_settings(self, call: AdapterCall, *, tools_known: bool) -> None:
        """The edge check of the call's settings; `tools_known`: its tools are all listed."""
        settings = call.options.settings
        if not settings:
            return
        # A setting this code does not know would be sent blind; only the declared ones are passed on.
        unknown = sorted(set(settings) - ACCEPTED_SETTINGS)
        names = [spec.name for spec in call.tools.specs] if call.tools is not None else []
        problems = setting_problems(settings, names if tools_known else None)
        if unknown or problems:
            parts = [f"settings this adapter does not pass on: {', '.join(unknown)}"] if unknown else []
            parts.extend(
                f"setting {field.removeprefix('options.settings.')} {text}" for field, text in problems
            )
            raise errors.AdapterRefused(self._declaration.shortname, "; ".join(parts))

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self._options.api_key_env)
        if not key:
            raise errors.AdapterMisconfigured(
                self._declaration.shortname,
                f"the API key environment variable {self._options.api_key_env} is not set",
            )
        headers = {"Authorization": f"Bearer {key}"}
        if self._options.organization:
            headers["OpenAI-Organization"] = self._options.organization
        # With --otel, W3C trace context: servers that trace (vLLM does) join the caller's trace.
        headers.update(trace_metadata())
        return headers

    async def _complete(self, call: AdapterCall, *, produce: bool) -> AdapterReply:
        shortname = self._declaration.shortname
        if self._closed:
            raise errors.AdapterUnavailable(shortname, "the adapter is closed")
        # Before any MCP server starts; a tool_choice naming an MCP tool is checked once they are listed.
        self._refuse_settings(call, tools_known=not call.options.mcp_servers)
        headers = self._headers()
        in_conversation = call.options.conversation_id is not None
        prior = history(shortname, call.conversation_state) if in_conversation else []
        followups: list[dict[str, JsonValue]] = []
        started = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            if call.options.mcp_servers:
                call = await self._with_mcp_tools(call, stack)
                self._refuse_settings(call, tools_known=True)
            reply = await self._tool_loop(call, produce, headers, prior, followups, started)
        if not in_conversation:
            return reply
        # The persona is not history: each call states its own.
        turn = [*prior, {"role": "user", "content": call.prompt}, *followups]
        state = {"messages": [*turn, {"role": "assistant", "content": reply.text}]}
        return AdapterReply(text=reply.text, events=reply.events, conversation_state=state, usage=reply.usage)

    async def _with_mcp_tools(self, call: AdapterCall, stack: contextlib.AsyncExitStack) -> AdapterCall:
        """The call with its MCP servers' tools beside the caller's; the servers close with `stack`."""
        caller_names = [spec.name for spec in call.tools.specs] if call.tools is not None else []
        mcp = await stack.enter_async_context(
            mcp_tools.open_servers(call.options.mcp_servers, self._declaration.shortname, caller_names)
        )
        toolbox = CallToolBox(
            call.tools, mcp, call.options.tool_filter, self._declaration.shortname, call.tool_log
        )
        return replace(call, tools=toolbox)

    async def _tool_loop(
        self,
        call: AdapterCall,
        produce: bool,
        headers: dict[str, str],
        prior: list[dict[str, JsonValue]],
        followups: list[dict[str, JsonValue]],
        started: float,
    ) -> AdapterReply:
        """Request completions, running the model's tool calls, until it answers; appends to `followups`."""
        shortname = self._declaration.shortname
        model_options = self._options.for_model(call.options.model or self._options.model)
        rounds = 0
        usage: Usage | None = None  # summed over the rounds
        while True:
            if isinstance(call.tools, CallToolBox):
                await call.tools.refresh()
            body = request_body(
                call,
                self._options.model,
                produce=produce,
                prior=prior,
                followups=followups,
                strict=model_options.strict_schema,
                model_options=model_options,
            )
            # One budget for the whole exchange, every tool round included.
            budget = None if call.time_budget is None else call.time_budget - (time.monotonic() - started)
            deadline = call_deadline(shortname, budget, self._options.timeout_seconds)
            status, response_headers, content = await self._post(body, headers, deadline)
            answer = read_response(shortname, status, response_headers, content, produce=produce)
            usage = _summed(usage, answer.usage)
            if isinstance(answer, AdapterReply):
                return answer if answer.usage is usage else replace(answer, usage=usage)
            rounds += 1
            if rounds > MAX_TOOL_ROUNDS:
                raise errors.AdapterInternal(
                    shortname, f"no final answer after {MAX_TOOL_ROUNDS} rounds of tool calls"
                )
            followups.append(answer.assistant_message)
            followups.extend(await self._run_tools(call, answer.calls))

    async def _run_tools(
        self, call: AdapterCall, calls: tuple[ModelToolCall, ...]
    ) -> list[dict[str, JsonValue]]:
        """Run the model's tool calls in order through the call's ToolBox; the tool messages."""
        if call.tools is None:
            raise errors.AdapterInternal(
                self._declaration.shortname, "the model called tools, but this call offered none"
            )
        messages = []
        for model_call in calls:
            try:
                arguments = strict_json(model_call.arguments)
            except ValueError as exc:  # malformed, NaN / Infinity, or over a JSON limit
                outcome = ToolOutcome(error=f"the arguments are not valid JSON ({exc}); the tool did not run")
            else:
                outcome = await call.tools.call(model_call.name, arguments)
            messages.append(tool_message(model_call.id, outcome))
        return messages

    async def _post(
        self, body: dict[str, JsonValue], headers: dict[str, str], deadline: Deadline
    ) -> tuple[int, Mapping[str, str], bytes]:
        return await self._exchange("POST", self._endpoint, body, headers, deadline)

    async def _exchange(
        self,
        method: str,
        url: URL,
        body: JsonValue,
        headers: dict[str, str],
        deadline: Deadline,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """Send one request and read its body under the byte cap, within `deadline`; failures mapped."""
        shortname = self._declaration.shortname
        try:
            async with asyncio.timeout(deadline.seconds):
                response = await self._send(method, url, body, headers)
                try:
                    content = await self._read_capped(response)
                finally:
                    response.close()
        except TimeoutError as exc:
            raise deadline.expired(shortname) from exc
        except Exception as exc:
            failure = _http_failure(shortname, url, exc)
            if failure is None:
                raise
            raise failure from exc
        return response.status, response.headers, content

    async def _send(
        self,
        method: str,
        url: URL,
        body: JsonValue,
        headers: dict[str, str],
        *,
        identity: bool = False,
    ) -> aiohttp.ClientResponse:
        """Send one request (unary, streamed or probe); the response, its body unread.

        The request carries the session's default headers with the call's
        `headers` in place of any of the same name (`identity`: with
        `Accept-Encoding: identity` too), the body as httpx encodes JSON,
        URL credentials as Basic auth, the cookies the session holds, and
        goes through the proxy the environment named; a redirect is returned,
        not followed.
        """
        if self._closed:
            # Checked here, not left to the session: a call may outlive the adapter's close.
            raise errors.AdapterUnavailable(self._declaration.shortname, "the adapter is closed")
        session = self._session if self._session is not None else self._open_session()
        http = self._http
        own = dict(headers)
        if http.authorization is not None:
            own["Authorization"] = http.authorization
        if identity:
            own["Accept-Encoding"] = "identity"
        data = None
        if body is not None:
            data = _json_bytes(body)
            own["Content-Type"] = "application/json"
        return await session.request(
            method, url, data=data, headers=own, allow_redirects=False, proxy=http.proxy
        )

    def _open_session(self) -> aiohttp.ClientSession:
        import aiohttp

        http = self._http
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=HTTP_MAX_CONNECTIONS,
                keepalive_timeout=HTTP_KEEPALIVE_SECONDS,
                ssl=http.tls_context if http.tls_context is not None else True,
            ),
            headers=http.default_headers,
            # unsafe: cookies from a provider addressed by IP are kept too, as httpx keeps them;
            # values are sent back as they were set.
            cookie_jar=aiohttp.CookieJar(unsafe=True, quote_cookie=False),
            timeout=http.timeout,
            # The proxy was read from the environment with the adapter; trust_env would also
            # read ~/.netrc and look the proxy up again on every request.
            trust_env=False,
        )
        return self._session

    async def _read_capped(self, response: aiohttp.ClientResponse) -> bytes:
        """The decoded body, read chunk by chunk; past max_response_bytes, ADAPTER_REPLY_TOO_LARGE.

        Closing a response that was not read to its end drops its connection,
        so the rest of the body is never received.
        """
        cap = self._options.max_response_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise self._too_large(f"declares a {declared}-byte body")
        chunks: list[bytes] = []
        received = 0
        content = response.content
        while chunk := await content.readany():
            received += len(chunk)
            if received > cap:
                raise self._too_large(f"sent more than {cap} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self, what: str) -> errors.AdapterReplyTooLarge:
        return errors.AdapterReplyTooLarge(
            self._declaration.shortname,
            f"the provider's response {what}, over max_response_bytes "
            f"({self._options.max_response_bytes}); nothing more was read",
        )


def stream_body(body: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """A chat-completions request body asking for server-sent events, usage in the last chunk."""
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


async def collect_stream(items: AsyncGenerator[StreamItem, None]) -> AdapterReply:
    """A stream's reply with the events it yielded (deltas dropped: the reply holds the whole text)."""
    events: list[StreamEvent] = []
    async with contextlib.aclosing(items):
        async for item in items:
            if isinstance(item, StreamEvent):
                events.append(item)
            elif isinstance(item, AdapterReply):
                return AdapterReply(
                    text=item.text, events=tuple(events), conversation_state=item.conversation_state
                )
    raise AssertionError("OpenAIAdapter.stream ends with its reply")


def _call_event(model_call: ModelToolCall) -> str:
    return json.dumps({"id": model_call.id, "name": model_call.name, "arguments": model_call.arguments})


def _result_event(model_call: ModelToolCall, message: dict[str, JsonValue]) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    denied = text.startswith("denied: ")
    error = (
        text.removeprefix("denied: ").removeprefix("error: ")
        if denied or text.startswith("error: ")
        else None
    )
    return json.dumps({"id": model_call.id, "name": model_call.name, "denied": denied, "error": error})


_UTF8_DECODER = codecs.getincrementaldecoder("utf-8")


class SseReader:
    """Server-sent events from a byte stream: the `data` of each complete event. Pure.

    Lines end in LF, CR LF or CR; an event ends at a blank line; its `data:`
    lines are joined with LF (one space after the colon dropped); comments
    and other fields are skipped, as the SSE format defines.
    """

    __slots__ = ("_data", "_decoder", "_ignoring", "_rest")

    def __init__(self) -> None:
        self._decoder = _UTF8_DECODER(errors="replace")
        self._rest = ""
        self._data: list[str] = []
        self._ignoring = False

    def feed(self, chunk: bytes) -> list[str]:
        if self._ignoring:
            return []
        text = self._rest + self._decoder.decode(chunk)
        # A CR at the end may be the first half of a CR LF: it ends no line until the next chunk.
        held = "\r" if text.endswith("\r") else ""
        *lines, rest = _LINE_BREAK.split(text[: len(text) - len(held)])
        self._rest = rest + held
        return self._events(lines)

    def finish(self) -> list[str]:
        """The events still pending at the end of the stream (an unterminated last one included)."""
        if self._ignoring:
            return []
        rest = self._rest + self._decoder.decode(b"", final=True)
        self._rest = ""
        return self._events([rest, ""] if rest else [""])

    def ignore_rest(self) -> None:
        """Yield nothing more (the stream's end marker was read)."""
        self._ignoring = True

    def _events(self, lines: list[str]) -> list[str]:
        events: list[str] = []
        data = self._data
        for line in lines:
            if line.startswith("data:"):
                data.append(line[6:] if line.startswith("data: ") else line[5:])
            elif not line and data:
                events.append("\n".join(data))
                data.clear()
        return events


_LINE_BREAK = re.compile("\r\n|\r|\n")


@dataclass(slots=True)
class _PartialToolCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class StreamAssembly:
    """What the chunks of one streamed completion add up to. Pure: fed parsed `data:` payloads.

    `content` and `refusal` are concatenated, tool calls assembled per
    `index` (their id and name from the first piece that carries them, the
    argument pieces joined), `finish_reason` kept from the chunk that sets
    it, `usage` from the final chunk (`stream_options.include_usage`).
    """

    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    tool_calls: dict[int, _PartialToolCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, JsonValue] | None = None
    chunks: int = 0
    _whole: AdapterReply | ToolRound | None = None

    def whole(self, answer: AdapterReply | ToolRound) -> None:
        """The completion arrived whole (a server that ignored `stream: true`)."""
        self._whole = answer

    def add(self, adapter: str, payload: str) -> str:
        """Fold one chunk in; the content text it adds ("" for none)."""
        try:
            chunk = json.loads(payload)
        except ValueError as exc:
            raise errors.AdapterInternal(
                adapter, f"malformed stream chunk, not JSON ({exc}): {_quote(payload.encode())}"
            ) from exc
        if not isinstance(chunk, dict):
            raise errors.AdapterInternal(adapter, f"malformed stream chunk: {_quote(payload.encode())}")
        self.chunks += 1
        error = chunk.get("error")
        if error is not None:
            detail = error.get("message") if isinstance(error, dict) else error
            raise errors.AdapterUnavailable(adapter, f"the provider ended the stream with an error: {detail}")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices:
            return ""
        choice = choices[0]
        if not isinstance(choice, dict):
            return ""
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return ""
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        for piece in delta.get("tool_calls") or ():
            if not isinstance(piece, dict):
                continue
            index = piece.get("index", 0)
            partial = self.tool_calls.setdefault(index if isinstance(index, int) else 0, _PartialToolCall())
            if isinstance(piece.get("id"), str) and piece["id"]:
                partial.id = piece["id"]
            function = piece.get("function")
            if isinstance(function, dict):
                if isinstance(function.get("name"), str) and function["name"]:
                    partial.name = function["name"]
                if isinstance(function.get("arguments"), str):
                    partial.arguments.append(function["arguments"])
        text = delta.get("content")
        if isinstance(text, str) and text:
            self.content.append(text)
            return text
        return ""

    def answer(self, adapter: str, *, produce: bool) -> AdapterReply | ToolRound:
        """The completion as `read_response` would have read it whole."""
        if self._whole is not None:
            return self._whole
        if self.refusal:
            raise errors.AdapterRefused(adapter, f"the model refused: {''.join(self.refusal)}")
        if self.finish_reason == "content_filter":
            raise errors.AdapterRefused(adapter, "the provider's content filter stopped the output")
        content = "".join(self.content)
        if self.tool_calls:
            message: dict[str, JsonValue] = {
                "content": content or None,
                "tool_calls": [
                    {
                        "id": partial.id,
                        "type": "function",
                        "function": {"name": partial.name, "arguments": "".join(partial.arguments)},
                    }
                    for _, partial in sorted(self.tool_calls.items())
                ],
            }
            return _tool_round(adapter, message)
        if self.chunks == 0:
            raise errors.AdapterInternal(adapter, "the stream ended before any chunk")
        if self.finish_reason is None:
            raise errors.AdapterUnavailable(adapter, "the stream ended before the completion finished")
        if produce and self.finish_reason == "length":
            raise errors.AdapterInternal(adapter, "output truncated by max tokens")
        return AdapterReply(text=content)
