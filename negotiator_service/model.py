"""Negotiator values: declarations, calls, requirements and verdicts.

Pure data; no grpc, no I/O. The servicer converts protos to and from these,
the core (`negotiation.py`) judges a `CallRequest` against a `Declaration`,
and adapters receive an `AdapterCall` only after the judgement accepted it.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Protocol

from agentsidecar.sidecar_runtime.wire_names import SET_CAPABILITY_NAMES

JsonValue = Any  # a value that json.dumps accepts


def _not_a_json_number(name: str) -> JsonValue:
    raise ValueError(f"{name} is not a JSON number")


# What JSON from callers and adapters may hold (tool results, edited
# arguments, schemas, Produce output). Deeper documents would exhaust the
# recursion of the parser and of schema validation; longer integers cost
# quadratic time to convert (Python refuses beyond 4300 digits anyway).
MAX_JSON_DEPTH = 64
MAX_JSON_INTEGER_DIGITS = 128


class JsonLimitExceeded(ValueError):
    """Well-formed JSON over one of the documented limits (MAX_JSON_DEPTH, MAX_JSON_INTEGER_DIGITS)."""


def _bounded_int(text: str) -> int:
    if len(text) - text.startswith("-") > MAX_JSON_INTEGER_DIGITS:
        raise JsonLimitExceeded(f"holds an integer of more than {MAX_JSON_INTEGER_DIGITS} digits")
    return int(text)


# The parser strict_json applies: a JSONDecoder holds nothing but this
# configuration and keeps nothing between documents, so one serves every call
# (`json.loads` with these arguments would build its like per call).
_STRICT_DECODER = json.JSONDecoder(parse_constant=_not_a_json_number, parse_int=_bounded_int)


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (a scalar is 1)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return deepest


def strict_json(text: str | bytes) -> JsonValue:
    """Parse JSON as RFC 8259 defines it, within the documented limits.

    NaN and ±Infinity are refused: Python's json reads and writes them, but
    no other JSON parser does (a model provider, a Node adapter), so text
    that holds one must fail here, at the edge, not at the far end. Nesting
    beyond MAX_JSON_DEPTH and integers beyond MAX_JSON_INTEGER_DIGITS raise
    JsonLimitExceeded. Raises ValueError (json.JSONDecodeError for
    malformed text).
    """
    try:
        if type(text) is str and not text.startswith("\ufeff"):
            value = _STRICT_DECODER.decode(text)
        else:  # bytes are decoded, and a byte order mark refused, as json.loads does
            value = json.loads(text, parse_constant=_not_a_json_number, parse_int=_bounded_int)
    except RecursionError:
        raise JsonLimitExceeded(f"is nested more than {MAX_JSON_DEPTH} levels deep") from None
    # Fewer brackets than the limit cannot nest past it: most documents skip the walk.
    if isinstance(text, bytes):
        brackets = text.count(b"[") + text.count(b"{")
    else:
        brackets = text.count("[") + text.count("{")
    if brackets > MAX_JSON_DEPTH and json_depth(value) > MAX_JSON_DEPTH:
        raise JsonLimitExceeded(f"is nested more than {MAX_JSON_DEPTH} levels deep")
    return value


def json_problem(exc: ValueError) -> str:
    """How to describe a `strict_json` failure after a field name."""
    return str(exc) if isinstance(exc, JsonLimitExceeded) else f"is not valid JSON: {exc}"


class Capability(enum.Enum):
    """What a declaration states and a call may need (docs/negotiation.md, "Deriving requirements")."""

    STRUCTURED_OUTPUT = "structured_output"
    TOOL_REGISTRATION = "tool_registration"
    MCP = "mcp"
    PROFILE_OVERRIDE = "profile_override"
    MODEL_OVERRIDE = "model_override"
    EFFORT = "effort"
    SETTINGS = "settings"
    CODEMODE = "codemode"
    NATIVE_APPROVALS = "native_approvals"
    NATIVE_APPROVAL_HANDLER = "native_approval_handler"
    SUBAGENTS = "subagents"
    BACKGROUND_SUBAGENTS = "background_subagents"
    STREAM_EVENTS = "stream_events"
    HOOKS = "hooks"
    STATEFUL_HISTORY = "stateful_history"
    HISTORY_REPLAY = "history_replay"
    NATIVE_ARTIFACTS = "native_artifacts"
    DEPTH_LIMIT = "depth_limit"
    TOOL_FILTER = "tool_filter"
    PERSONA = "persona"


class CapabilityState(enum.Enum):
    """Tri-state support: a capability the declaration omits is UNKNOWN."""

    UNKNOWN = "unknown"
    UNSUPPORTED = "unsupported"
    SUPPORTED = "supported"


class AdapterKind(enum.Enum):
    FRAMEWORK = "agent-framework"  # selected with `adapter`
    HARNESS = "agent-harness"  # selected with `agent`


class TypedSet(enum.Enum):
    # Each value is also the name of the Declaration field holding that set (Declaration.members).
    MCP_TRANSPORTS = "mcp_transports"
    ACCEPTED_SETTINGS = "accepted_settings"
    STRING_FORMATS = "string_formats"
    HOOK_EVENTS = "hook_events"
    # Levels of `options.effort`. A declaration listing none leaves the level
    # to the effort capability's state (negotiation._state).
    EFFORT_LEVELS = "effort_levels"


# The capability a typed set belongs to: a set member needs both. Clients read the same
# table by wire name, so it is written once, in agentsidecar.sidecar_runtime.wire_names.
SET_CAPABILITY: Mapping[TypedSet, Capability] = MappingProxyType(
    {TypedSet(typed_set): Capability(capability) for typed_set, capability in SET_CAPABILITY_NAMES.items()}
)

MCP_TRANSPORTS = frozenset({"stdio", "sse", "http"})


@dataclass(frozen=True, slots=True)
class Declaration:
    """What an adapter declares it can honour.

    The declaration rule (protos/README.md, "Declarations"): UNSUPPORTED is
    what the adapter's code cannot carry; UNKNOWN is what the code carries
    but only the upstream can honour or ignore; SUPPORTED is what the code
    carries and the operator's config (or a probe) states for that upstream
    or model, or what the negotiator enforces itself.

    `models` holds complete declarations for particular models (each with an
    empty `models` of its own): a call whose model, `options.model` or else
    `default_model`, is listed there is judged by that entry, any other call
    by this declaration (`for_model`).
    """

    shortname: str
    kind: AdapterKind
    capabilities: Mapping[Capability, CapabilityState] = field(default_factory=lambda: MappingProxyType({}))
    mcp_transports: frozenset[str] = frozenset()
    accepted_settings: frozenset[str] = frozenset()
    string_formats: frozenset[str] = frozenset()
    hook_events: frozenset[str] = frozenset()
    scripted: bool = False  # canned replies: demos and tests only
    effort_levels: frozenset[str] = frozenset()  # empty: any level the effort state allows
    default_model: str = ""  # the model of a call that names none; "" when the adapter has no default
    models: Mapping[str, Declaration] = field(default_factory=lambda: MappingProxyType({}))
    # `version`, once computed: a pure function of the fields above, which never change.
    _version: str = field(default="", init=False, repr=False, compare=False)

    def state(self, capability: Capability) -> CapabilityState:
        return self.capabilities.get(capability, CapabilityState.UNKNOWN)

    def members(self, typed_set: TypedSet) -> frozenset[str]:
        members: frozenset[str] = getattr(self, typed_set._value_)  # each set is the field of its name
        return members

    def selected_model(self, model: str | None) -> str:
        """The model a call with `options.model` = `model` goes to ("" when neither names one)."""
        return model if model is not None else self.default_model

    def for_model(self, model: str | None) -> tuple[str, Declaration]:
        """The declaration that judges a call with `options.model` = `model`, and the model it is for.

        The model is "" when no entry of `models` matches: the adapter-level
        declaration (this one) judges.
        """
        selected = self.selected_model(model)
        entry = self.models.get(selected) if self.models else None
        if entry is None:
            return "", self
        return selected, entry

    def canonical(self) -> dict[str, JsonValue]:
        """A stable JSON form: the input of `version`.

        Effort levels, the default model and the per-model declarations
        appear only when set, so a declaration without them keeps the
        version it always had.
        """
        form: dict[str, JsonValue] = {
            "shortname": self.shortname,
            "kind": self.kind.value,
            "capabilities": {
                c.value: s.value for c, s in sorted(self.capabilities.items(), key=lambda kv: kv[0].value)
            },
            "mcp_transports": sorted(self.mcp_transports),
            "accepted_settings": sorted(self.accepted_settings),
            "string_formats": sorted(self.string_formats),
            "hook_events": sorted(self.hook_events),
            "scripted": self.scripted,
        }
        if self.effort_levels:
            form["effort_levels"] = sorted(self.effort_levels)
        if self.default_model:
            form["default_model"] = self.default_model
        if self.models:
            form["models"] = {name: self.models[name].canonical() for name in sorted(self.models)}
        return form

    @property
    def version(self) -> str:
        version = self._version
        if not version:
            text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
            version = "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
            object.__setattr__(self, "_version", version)  # frozen: set once, then only read
        return version


@dataclass(frozen=True, slots=True)
class McpServer:
    name: str
    transport: str  # "stdio" | "sse" | "http" ("streamable-http" normalized to "http")
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Set only by the config file (profiles): the operator wrote this server, so
    # it may use stdio and its per-tool settings below apply. A request's servers
    # never carry it (convert builds them with the defaults).
    operator: bool = False
    # Operator-set risk per MCP tool name; an annotation can raise it, never lower it.
    tool_risks: Mapping[str, ToolRisk] = field(default_factory=lambda: MappingProxyType({}))
    # MCP tool names that run without asking when the call has no ToolSession.
    preapproved: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class MaxDepth:
    depth: int | None = None  # 0 forbids delegation
    provider_managed: bool = False


@dataclass(frozen=True, slots=True)
class ToolFilter:
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CallOptions:
    model: str | None = None
    effort: str | None = None
    settings: Mapping[str, JsonValue] = field(default_factory=lambda: MappingProxyType({}))
    profile: str | None = None
    mcp_servers: tuple[McpServer, ...] = ()
    max_depth: MaxDepth | None = None
    tool_filter: ToolFilter | None = None
    persona: str | None = None
    stream_events: bool = False
    allow_unknown: frozenset[Capability] = frozenset()
    # Calls sharing a conversation id run one at a time, as transactions
    # (conversations.py); needs stateful_history.
    conversation_id: str | None = None
    no_wait: bool = False  # fail with ConversationBusy instead of waiting for the conversation
    new_conversation: bool = False  # drop the conversation's state and pinned declaration
    # The servicer replaces it by a generated conversation_id before anything judges the call.
    generate_conversation_id: bool = False
    # Capabilities the caller requires beyond those the fields above need, as
    # sent: "codemode" or "<typed set>:<member>" ("hook_events:pre_tool_use").
    # validate_request checks each; derive_requirements judges each as
    # `options.requires[i]`.
    requires: tuple[str, ...] = ()
    # What these options need of an adapter, once negotiation.options_requirements
    # has derived it: a pure function of the fields above, which never change.
    derived_requirements: tuple[Requirement, ...] | None = field(
        default=None, init=False, repr=False, compare=False
    )


class CallKind(enum.Enum):
    PRODUCE = "produce"
    INVOKE = "invoke"


@dataclass(frozen=True, slots=True)
class CallRequest:
    """A Produce or Invoke call as the caller sent it."""

    kind: CallKind
    prompt: str
    adapter: str | None = None  # frameworks only
    agent: str | None = None  # harnesses only
    output_schema: str | None = None  # JSON text; Produce only
    options: CallOptions = field(default_factory=CallOptions)
    # Caller tools of a ToolSession (validated by tools.py); any at all needs tool_registration.
    tools: tuple[ToolSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class Requirement:
    """One thing a call needs; `member`/`typed_set` are set for set members."""

    capability: Capability
    request_field: str
    typed_set: TypedSet | None = None
    member: str = ""

    def describe(self) -> str:
        if self.typed_set is None:
            return self.capability.value
        return f"{self.typed_set.value}:{self.member}"


@dataclass(frozen=True, slots=True)
class Verdict:
    requirement: Requirement
    state: CapabilityState
    allowed_unknown: bool = False

    @property
    def accepted(self) -> bool:
        return self.state is CapabilityState.SUPPORTED or self.allowed_unknown


@dataclass(frozen=True, slots=True)
class Decision:
    adapter: str
    declaration_version: str  # the version of the adapter's whole declaration, its models included
    verdicts: tuple[Verdict, ...]
    model: str = ""  # the entry of Declaration.models that judged; "" for the adapter-level declaration
    # Derived once: a decision is judged once and then read on every call that shares it.
    gaps: tuple[Verdict, ...] = field(init=False, repr=False, compare=False)
    accepted: bool = field(init=False, repr=False, compare=False)
    # The capabilities the verdicts judged (what an adapter's code must implement to honour the call).
    capabilities: frozenset[Capability] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        gaps = tuple(v for v in self.verdicts if not v.accepted)
        object.__setattr__(self, "gaps", gaps)
        object.__setattr__(self, "accepted", not gaps)
        object.__setattr__(self, "capabilities", frozenset(v.requirement.capability for v in self.verdicts))

    @property
    def allowed_unknowns(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.allowed_unknown)


@dataclass(frozen=True, slots=True)
class StreamEvent:
    type: str
    text: str = ""


class ToolRisk(enum.Enum):
    READ_ONLY = "read_only"  # called without asking
    MUTATING = "mutating"  # needs the caller's approval per call
    SENSITIVE = "sensitive"  # needs the caller's approval per call


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool that lives in the caller, scoped to one call."""

    name: str
    arguments_schema: Mapping[str, JsonValue]
    description: str = ""
    return_schema: Mapping[str, JsonValue] | None = None
    metadata: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    risk: ToolRisk = ToolRisk.MUTATING


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a tool call gave back to the model: a result, or why there is none."""

    result: JsonValue = None
    error: str | None = None  # the tool failed, or the caller denied the call
    denied: bool = False


class ToolBox(Protocol):
    """The tools of one call. Adapters call tools only through this.

    The implementation (the ToolSession handler) asks the caller for
    approval when the risk requires it, validates arguments and results
    against the tool's schemas, and carries the call over the caller's
    stream. There is no shared registry: each call has its own ToolBox.
    """

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        """The tools visible to the model (after the call's tool filter)."""
        ...

    async def call(self, name: str, arguments: JsonValue) -> ToolOutcome: ...


# The broker's judgement of the call it dispatches: the decision, and the very
# objects it judged (the declaration, the call's kind, options, parsed output
# schema and ToolBox). An adapter whose own check finds these same objects in
# the call it receives reads the decision instead of judging the call again
# (adapters/_calls.check_call); any other call is judged afresh.
BrokerJudgement = tuple[
    Decision, Declaration, CallKind, CallOptions, Mapping[str, JsonValue] | None, ToolBox | None
]


@dataclass(frozen=True, slots=True)
class AdapterCall:
    """What an adapter receives, only after the decision accepted the call."""

    prompt: str
    options: CallOptions
    # Produce only: parsed and read-only (negotiation.frozen_json, shared by like calls);
    # adapters/_calls.plain_json copies it as plain JSON to change or dump.
    output_schema: Mapping[str, JsonValue] | None = None
    time_budget: float | None = None  # seconds the caller has left; None = no deadline
    delegation_depth: int = 0
    tools: ToolBox | None = None  # set only when the call brought tools
    # The conversation's committed adapter state (adapter-specific JSON);
    # None outside a conversation or on its first call.
    conversation_state: JsonValue = None
    # Where the call's tool calls are recorded for its audit record (the broker sets it);
    # a ToolBox an adapter builds itself (MCP tools) records there too.
    tool_log: ToolCallLog | None = field(default=None, compare=False)  # a sink, not part of the call
    # Set only by the broker, for the call it judged (BrokerJudgement); None: judged by the adapter alone.
    judgement: BrokerJudgement | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens an upstream reported for a call (a count it did not report is 0)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens
    cached_tokens: int = 0  # of prompt_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.cached_tokens + other.cached_tokens,
        )

    def counts(self) -> tuple[tuple[str, int], ...]:
        """(kind, tokens) per kind, as metrics and the audit log name them."""
        return (
            ("prompt", self.prompt_tokens),
            ("completion", self.completion_tokens),
            ("reasoning", self.reasoning_tokens),
            ("cached", self.cached_tokens),
        )


@dataclass(frozen=True, slots=True)
class AdapterReply:
    """An adapter's answer: `text` for Invoke, JSON text for Produce."""

    text: str
    events: tuple[StreamEvent, ...] = ()
    # The adapter state to commit if, and only if, the whole call succeeds.
    conversation_state: JsonValue = None
    # Tokens the upstream reported, summed over the call's requests; None when it reported none.
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """Text an adapter produced since its previous delta (for Produce, a piece of the JSON text)."""

    text: str


# What a streaming adapter yields: deltas and events as they happen, then one AdapterReply, last.
StreamItem = StreamDelta | StreamEvent | AdapterReply


class StreamingAdapter(Protocol):
    """An adapter that reports its work as it happens (declares stream_events).

    `stream` yields StreamDelta and StreamEvent values while the call runs
    and ends with exactly one AdapterReply, the same reply `produce` or
    `invoke` would have returned (its `events` are ignored: they were
    yielded). It receives calls only after `check_call`-style judgement, as
    `produce`/`invoke` do, and yields events only when
    `call.options.stream_events` is set. Closing the iterator early (the
    caller cancelled) must stop the upstream work at once. Adapters without
    `stream` are served by their unary method: its events, then its reply.
    """

    def stream(self, call: AdapterCall, kind: CallKind) -> AsyncIterator[StreamItem]: ...


class Adapter(Protocol):
    """An agent adapter. The code declares what it implements."""

    implementation: str  # "openai" | "command" | "remote" | "scripted"

    @property
    def declaration(self) -> Declaration: ...

    async def produce(self, call: AdapterCall) -> AdapterReply: ...

    async def invoke(self, call: AdapterCall) -> AdapterReply: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class DeclarationOverride:
    """What a config file says about an adapter's declaration.

    For code-declared adapters (openai, command, remote) this may narrow
    anything the code declares and state SUPPORTED for what the code
    declares UNKNOWN (it carries it; the operator vouches for the
    upstream), never anything the code declares UNSUPPORTED and never a
    typed-set member the code does not carry; `declarations.narrow` refuses
    the rest. For the scripted adapter it is the whole declaration.
    `models` are per-model overrides, applied on top of this one.
    """

    kind: AdapterKind | None = None
    capabilities: Mapping[Capability, CapabilityState] = field(default_factory=lambda: MappingProxyType({}))
    mcp_transports: frozenset[str] | None = None
    accepted_settings: frozenset[str] | None = None
    string_formats: frozenset[str] | None = None
    hook_events: frozenset[str] | None = None
    effort_levels: frozenset[str] | None = None
    models: Mapping[str, DeclarationOverride] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    """One adapter entry of the config file, before the adapter is built."""

    shortname: str
    implementation: str  # "openai" | "command" | "remote" | "scripted"
    declaration: DeclarationOverride | None = None
    # Implementation-specific options, as parsed from YAML (validated by the adapter).
    options: Mapping[str, JsonValue] = field(default_factory=lambda: MappingProxyType({}))
    source_path: str = ""  # config file, for error messages


@dataclass(frozen=True, slots=True)
class Profile:
    """A named set of call options from the negotiator's config (`profiles:`).

    A call naming it with `options.profile` gets these fields merged in by the
    negotiator (`negotiation.expand_profile`) before its requirements are
    derived, so the adapter sees only the merged options.
    """

    name: str
    mcp_servers: tuple[McpServer, ...] = ()
    model: str | None = None
    effort: str | None = None
    settings: Mapping[str, JsonValue] = field(default_factory=lambda: MappingProxyType({}))
    # A profile of the adapter's own that the adapter applies itself: sent as
    # the call's `profile`, so it needs profile_override.
    adapter_profile: str | None = None


class AuditOutcome(enum.Enum):
    ACCEPTED = "accepted"  # a dry run the declaration meets
    REFUSED = "refused"  # judged and refused before any adapter code ran
    SUCCEEDED = "succeeded"  # dispatched, and the adapter's answer was returned
    FAILED = "failed"  # dispatched, and the call failed (or was cancelled) after that


class ToolCallDecision(enum.Enum):
    """What became of one tool call the model made."""

    RAN = "ran"  # the tool ran (its error, if it failed, is on the record)
    # The tool did not run:
    DENIED = "denied"  # the caller denied it, or nobody could approve it
    FILTERED = "filtered"  # not offered to the model (the tool filter hides it, or no such tool)
    INVALID_ARGUMENTS = "invalid_arguments"  # the arguments (or the caller's edit) broke its schema


class ToolApproval(enum.Enum):
    """How a tool call was approved, or why it was not."""

    NONE = ""  # the call ended before approval was considered (filtered, invalid arguments)
    NOT_REQUIRED = "not_required"  # a read_only tool
    PREAPPROVED = "preapproved"  # the operator's config preapproved the MCP tool
    ALLOWED = "allowed"  # the caller answered ALLOW
    EDITED = "edited"  # the caller answered EDIT
    DENIED = "denied"  # the caller answered DENY
    NO_CHANNEL = "no_channel"  # mutating or sensitive, and no ToolSession to ask


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One tool call the model made inside a brokered call, as its audit record carries it."""

    function: str  # the name the model called
    decision: ToolCallDecision
    approval: ToolApproval = ToolApproval.NONE
    server: str = ""  # the MCP server; "" for a caller tool
    tool: str = ""  # the tool's own name (an MCP server's name for it); "" when none matched
    risk: ToolRisk | None = None  # None when no tool matched
    duration_seconds: float = 0.0  # from the model's call reaching the ToolBox to its outcome
    error: str = ""  # the outcome's error for the model, when there was one


class ToolCallLog:
    """The tool call records of one call, in the order the calls ended (one log per call)."""

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: list[ToolCallRecord] = []

    def add(self, record: ToolCallRecord) -> None:
        self._records.append(record)

    @property
    def records(self) -> tuple[ToolCallRecord, ...]:
        return tuple(self._records)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One decision the negotiator made, as the audit stream and log carry it."""

    time: datetime  # when the call ended; timezone-aware UTC
    caller: str  # the authenticated identity, else the peer address
    operation: str  # "negotiate" | "produce" | "invoke" | "tool_session" | "bootstrap"
    outcome: AuditOutcome
    adapter: str = ""  # the adapter the call named, when it named one
    declaration_version: str = ""  # set once an adapter was selected
    verdicts: tuple[Verdict, ...] = ()  # every requirement with its verdict, in request order
    error_reason: str = ""  # ErrorInfo reason of a refusal or failure
    conversation_id: str = ""
    delegation_depth: int = 0
    seed: str = ""  # bootstrap: "<domain>/<id>" of the seed chosen to run, once one was chosen
    usage: Usage | None = None  # tokens the upstream reported, for a call that returned a reply
    tool_calls: tuple[ToolCallRecord, ...] = ()  # every tool call the model made, in order

    @property
    def allowed_unknown(self) -> tuple[Capability, ...]:
        """Capabilities the caller let through while the declaration was silent, each once."""
        return tuple(dict.fromkeys(v.requirement.capability for v in self.verdicts if v.allowed_unknown))
