"""The scripted adapter: canned, deterministic replies from config.

For demos and tests only, and labelled so (`Declaration.scripted`). Its
declaration comes from config, but config may declare only what this code
does (`IMPLEMENTED`); it still refuses, like any adapter, a call field its
declaration does not accept.

What the double does for each capability it may declare:
- behaviour: structured_output (the `produce` reply, which the negotiator
  validates against the caller's schema, string formats included),
  tool_registration and tool_filter (`tool_calls` go through the call's
  ToolBox, which hides and refuses filtered tools), stream_events (`events`),
  stateful_history (the conversation transcript below);
- recorded: model_override, effort, settings, profile_override and persona
  change no reply; the double records them with everything else it was sent
  (`ScriptedAdapter.received`, and the `{received: true}` reply), so a test
  asserts that they arrived.
Every other capability (mcp, codemode, native_approvals,
native_approval_handler, subagents, background_subagents, hooks,
history_replay, native_artifacts, depth_limit) has no behaviour here: config
may only declare it unsupported, a capability config leaves out is
unsupported, and `mcp_transports` / `hook_events` must stay empty. Anything
else is a ConfigError naming the adapter and the capability.

Options:
    invoke:  a reply (default `{echo: true}`)
    produce: a reply (required when the declaration supports structured_output)
    delay_seconds: seconds to wait before replying (default 0)
    events:  [{type, text}] returned when the call asks for stream_events
    tool_calls: [{name, arguments}] the "model" calls, in order, through the
             call's ToolBox before replying (skipped when the call brought no
             tools, as in a plain Produce/Invoke)
    reply_with_tool_results: true replaces the reply with the JSON text of
             `{"tool_results": [{name, result | error, denied?}], "persona": <persona or null>}`,
             so tests see what the tools gave back and which persona arrived
             (default false)

A reply is exactly one of `{text: "..."}`, `{echo: true}` (the prompt),
`{json: <value>}` (its JSON text), `{transcript: true}` (the JSON array of
the conversation's prompts so far, this one included), `{received: true}`
(the JSON text of this call's record, see `ScriptedAdapter.received`) or
`{error: {kind, message, retry_after?}}` with kind one of unavailable,
timeout, rate_limited, refused, misconfigured, internal.

In a conversation (which needs `stateful_history` declared) every
successful reply carries the next conversation state, `{turns, prompts}`:
the committed state plus this call's prompt. The negotiator commits it only
if the whole call succeeds, so `transcript` shows exactly what was committed.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters._calls import call_deadline, check_call, plain_json
from agentsidecar.negotiator_service.adapters._options import OptionReader, type_name
from agentsidecar.negotiator_service.declarations import declaration_from_override
from agentsidecar.negotiator_service.model import (
    SET_CAPABILITY,
    AdapterCall,
    AdapterReply,
    AdapterSpec,
    CallKind,
    CallOptions,
    Capability,
    CapabilityState,
    Declaration,
    DeclarationOverride,
    JsonValue,
    StreamEvent,
    ToolOutcome,
    TypedSet,
)

# Capabilities this code carries out (see the module docstring).
BEHAVIOUR = frozenset(
    {
        Capability.STRUCTURED_OUTPUT,
        Capability.TOOL_REGISTRATION,
        Capability.TOOL_FILTER,
        Capability.STREAM_EVENTS,
        Capability.STATEFUL_HISTORY,
    }
)
# Capabilities whose value changes no reply: the double records it, and nothing more.
RECORDED = frozenset(
    {
        Capability.MODEL_OVERRIDE,
        Capability.EFFORT,
        Capability.SETTINGS,
        Capability.PROFILE_OVERRIDE,
        Capability.PERSONA,
    }
)
IMPLEMENTED = BEHAVIOUR | RECORDED
# The records `ScriptedAdapter.received` keeps, newest last; older ones are dropped.
MAX_RECEIVED_RECORDS = 256

# Enum members as module constants: reading one off its class goes through the enum
# metaclass's __getattr__ hook on every call, a module global does not.
_PRODUCE = CallKind.PRODUCE
_INVOKE = CallKind.INVOKE

ERROR_KINDS: Mapping[str, Callable[[str, str], errors.AdapterFailure]] = MappingProxyType(
    {
        "unavailable": errors.AdapterUnavailable,
        "timeout": errors.AdapterTimeout,
        "rate_limited": errors.AdapterRateLimited,
        "refused": errors.AdapterRefused,
        "misconfigured": errors.AdapterMisconfigured,
        "internal": errors.AdapterInternal,
    }
)
_REPLY_FORMS = ("text", "echo", "json", "transcript", "received", "error")


@dataclass(frozen=True, slots=True)
class ScriptedError:
    kind: str
    message: str
    retry_after: float | None = None

    def exception(self, adapter: str) -> errors.AdapterFailure:
        if self.kind == "rate_limited":
            return errors.AdapterRateLimited(adapter, self.message, retry_after=self.retry_after)
        return ERROR_KINDS[self.kind](adapter, self.message)


@dataclass(frozen=True, slots=True)
class ScriptedReply:
    """One configured answer; exactly one field is set."""

    text: str | None = None
    echo: bool = False
    transcript: bool = False
    received: bool = False
    error: ScriptedError | None = None

    def answer(
        self, adapter: str, prompt: str, prompts: list[str], record: Callable[[], Mapping[str, JsonValue]]
    ) -> str:
        """The reply text; `prompts` is the conversation's transcript, this prompt included; `record`
        makes the call's record."""
        if self.error is not None:
            raise self.error.exception(adapter)
        if self.echo:
            return prompt
        if self.transcript:
            return json.dumps(prompts, ensure_ascii=False)
        if self.received:
            return json.dumps(record(), ensure_ascii=False)
        assert self.text is not None  # _read_reply sets exactly one form
        return self.text


@dataclass(frozen=True, slots=True)
class ScriptedToolCall:
    name: str
    arguments: JsonValue


@dataclass(frozen=True, slots=True)
class ScriptedOptions:
    invoke: ScriptedReply
    produce: ScriptedReply | None
    delay_seconds: float
    events: tuple[StreamEvent, ...]
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    reply_with_tool_results: bool = False


def read_options(spec: AdapterSpec, declaration: Declaration) -> ScriptedOptions:
    reader = OptionReader(spec, spec.options)
    invoke = _read_reply(reader, "invoke") if reader.has("invoke") else ScriptedReply(echo=True)
    produce = _read_reply(reader, "produce") if reader.has("produce") else None
    delay_seconds = reader.non_negative_number("delay_seconds", 0.0)
    events = _read_events(reader)
    tool_calls = _read_tool_calls(reader)
    reply_with_tool_results = reader.boolean("reply_with_tool_results", False)
    reader.finish()
    if produce is None and declaration.state(Capability.STRUCTURED_OUTPUT) is CapabilityState.SUPPORTED:
        reader.fail("produce", "is required when the declaration supports structured_output")
    return ScriptedOptions(
        invoke=invoke,
        produce=produce,
        delay_seconds=delay_seconds,
        events=events,
        tool_calls=tool_calls,
        reply_with_tool_results=reply_with_tool_results,
    )


def _read_reply(parent: OptionReader, key: str) -> ScriptedReply:
    reader = parent.nested(key)
    forms = [form for form in _REPLY_FORMS if reader.has(form)]
    if len(forms) != 1:
        reader.fail(parent.path(key), f"must have exactly one of {', '.join(_REPLY_FORMS)}")
    form = forms[0]
    reply: ScriptedReply
    if form == "text":
        value = reader.raw("text")
        if not isinstance(value, str):
            reader.fail(reader.path("text"), f"must be a string, not {type_name(value)}")
        reply = ScriptedReply(text=value)
    elif form == "echo":
        if reader.raw("echo") is not True:
            reader.fail(reader.path("echo"), "must be true (omit it otherwise)")
        reply = ScriptedReply(echo=True)
    elif form == "transcript":
        if reader.raw("transcript") is not True:
            reader.fail(reader.path("transcript"), "must be true (omit it otherwise)")
        reply = ScriptedReply(transcript=True)
    elif form == "received":
        if reader.raw("received") is not True:
            reader.fail(reader.path("received"), "must be true (omit it otherwise)")
        reply = ScriptedReply(received=True)
    elif form == "json":
        try:
            text = json.dumps(reader.raw("json"), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            reader.fail(reader.path("json"), f"is not JSON-serializable: {exc}")
        reply = ScriptedReply(text=text)
    else:
        reply = ScriptedReply(error=_read_error(reader.nested("error")))
    reader.finish()
    return reply


def _read_error(reader: OptionReader) -> ScriptedError:
    kind = reader.required_string("kind")
    if kind not in ERROR_KINDS:
        reader.fail(reader.path("kind"), f'unknown kind "{kind}"; expected one of {", ".join(ERROR_KINDS)}')
    message = reader.string("message", default=f"scripted {kind} error")
    assert message is not None  # it has a default
    retry_after = reader.positive_number("retry_after", None)
    if retry_after is not None and kind != "rate_limited":
        reader.fail(reader.path("retry_after"), "is only for kind rate_limited")
    reader.finish()
    return ScriptedError(kind=kind, message=message, retry_after=retry_after)


def _read_events(reader: OptionReader) -> tuple[StreamEvent, ...]:
    raw = reader.raw("events")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        reader.fail("events", f"must be a list of {{type, text}}, not {type_name(raw)}")
    events = []
    for index, item in enumerate(raw):
        event = reader.child(item, f"events[{index}]")
        event_type = event.required_string("type")
        text = event.raw("text")
        if text is not None and not isinstance(text, str):
            event.fail(event.path("text"), f"must be a string, not {type_name(text)}")
        event.finish()
        events.append(StreamEvent(type=event_type, text=text or ""))
    return tuple(events)


def _read_tool_calls(reader: OptionReader) -> tuple[ScriptedToolCall, ...]:
    raw = reader.raw("tool_calls")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        reader.fail("tool_calls", f"must be a list of {{name, arguments}}, not {type_name(raw)}")
    calls = []
    for index, item in enumerate(raw):
        entry = reader.child(item, f"tool_calls[{index}]")
        name = entry.required_string("name")
        arguments = entry.raw("arguments")
        try:
            # A round trip leaves plain dicts and lists, whatever the YAML loader built.
            plain = json.loads(json.dumps({} if arguments is None else arguments))
        except (TypeError, ValueError) as exc:
            entry.fail(entry.path("arguments"), f"is not JSON-serializable: {exc}")
        entry.finish()
        calls.append(ScriptedToolCall(name=name, arguments=plain))
    return tuple(calls)


def tool_results_reply(outcomes: list[tuple[str, ToolOutcome]], persona: str | None) -> str:
    """The `reply_with_tool_results` reply: what each tool call gave back."""
    results: list[dict[str, JsonValue]] = []
    for name, outcome in outcomes:
        entry: dict[str, JsonValue] = {"name": name}
        if outcome.error is not None:
            entry["error"] = outcome.error
        else:
            entry["result"] = outcome.result
        if outcome.denied:
            entry["denied"] = True
        results.append(entry)
    return json.dumps({"tool_results": results, "persona": persona}, ensure_ascii=False)


def scripted_declaration(override: DeclarationOverride, shortname: str) -> Declaration:
    """The declaration config writes for a scripted adapter, held to what this code does.

    Raises ConfigError naming every capability (and typed set) the config
    declares beyond `IMPLEMENTED`; a capability outside it that config
    leaves out is declared unsupported.
    """
    problems = [
        f"capabilities.{capability.value}={state.value}: a scripted adapter has no behaviour for "
        f"{capability.value} (it may only be declared unsupported)"
        for capability, state in sorted(override.capabilities.items(), key=lambda kv: kv[0].value)
        if capability not in IMPLEMENTED and state is not CapabilityState.UNSUPPORTED
    ]
    for typed_set, members in (
        (TypedSet.MCP_TRANSPORTS, override.mcp_transports),
        (TypedSet.HOOK_EVENTS, override.hook_events),
    ):
        if members:
            problems.append(
                f"{typed_set.value} must be empty: a scripted adapter has no behaviour for "
                f"{SET_CAPABILITY[typed_set].value}"
            )
    if problems:
        raise errors.ConfigError(f'adapter "{shortname}": ' + "; ".join(problems))
    capabilities = {c: CapabilityState.UNSUPPORTED for c in Capability if c not in IMPLEMENTED}
    capabilities.update(override.capabilities)
    completed = dataclasses.replace(override, capabilities=MappingProxyType(capabilities))
    return declaration_from_override(completed, shortname=shortname, scripted=True)


# What a call's record (`_record_json`) reads of it, kept as the call brought it (nothing copied):
# its kind, prompt, parsed output schema, options and tool names. A plain tuple: one is kept per call.
_Received = tuple[CallKind, str, "Mapping[str, JsonValue] | None", CallOptions, tuple[str, ...]]


def _received_of(kind: CallKind, call: AdapterCall) -> _Received:
    tools = tuple(spec.name for spec in call.tools.specs) if call.tools is not None else ()
    return (kind, call.prompt, call.output_schema, call.options, tools)


def _record_json(received: _Received) -> dict[str, JsonValue]:
    """What one call brought the double, as JSON: every field it can carry, set or not."""
    kind, prompt, schema, options, tools = received
    tool_filter = options.tool_filter
    return {
        "kind": kind.value,
        "prompt": prompt,
        "output_schema": plain_json(schema) if schema is not None else None,
        "model": options.model,
        "effort": options.effort,
        "settings": plain_json(options.settings),
        "profile": options.profile,
        "persona": options.persona,
        "stream_events": options.stream_events,
        "conversation_id": options.conversation_id,
        "tool_filter": (
            None
            if tool_filter is None
            else {"allow": list(tool_filter.allow), "deny": list(tool_filter.deny)}
        ),
        "tools": list(tools),
        "requires": list(options.requires),
    }


class ScriptedAdapter:
    """Canned replies; see the module docstring for the options."""

    implementation = "scripted"

    def __init__(self, spec: AdapterSpec) -> None:
        if spec.declaration is None:
            raise errors.ConfigError(
                f'adapter "{spec.shortname}": a scripted adapter needs a declaration in config '
                "(there is no code to declare one)"
            )
        self._declaration = scripted_declaration(spec.declaration, spec.shortname)
        self._options = read_options(spec, self._declaration)
        # What each call that passed the adapter's own check brought, oldest first; turned into
        # JSON records only when asked for (`received`, a `{received: true}` reply).
        self._received: collections.deque[_Received] = collections.deque(maxlen=MAX_RECEIVED_RECORDS)

    @property
    def declaration(self) -> Declaration:
        return self._declaration

    @property
    def received(self) -> list[dict[str, JsonValue]]:
        """The record of each call that passed the adapter's own check, oldest first."""
        return [_record_json(received) for received in self._received]

    async def invoke(self, call: AdapterCall) -> AdapterReply:
        check_call(self._declaration, call, _INVOKE, implemented=IMPLEMENTED)
        return await self._reply(self._options.invoke, call, _INVOKE)

    async def produce(self, call: AdapterCall) -> AdapterReply:
        check_call(self._declaration, call, _PRODUCE, implemented=IMPLEMENTED)
        if self._options.produce is None:
            raise errors.AdapterRefused(
                self._declaration.shortname, "no scripted produce reply is configured"
            )
        return await self._reply(self._options.produce, call, _PRODUCE)

    async def close(self) -> None:
        return None

    async def _reply(self, reply: ScriptedReply, call: AdapterCall, kind: CallKind) -> AdapterReply:
        shortname = self._declaration.shortname
        received = _received_of(kind, call)
        self._received.append(received)
        if self._options.delay_seconds > 0:
            deadline = call_deadline(shortname, call.time_budget)
            try:
                async with asyncio.timeout(deadline.seconds):
                    await asyncio.sleep(self._options.delay_seconds)
            except TimeoutError as exc:
                raise deadline.expired(shortname) from exc
        state = call.conversation_state
        prompts = [call.prompt] if state is None else [*_committed_prompts(shortname, state), call.prompt]
        outcomes: list[tuple[str, ToolOutcome]] = []
        if call.tools is not None:
            for tool_call in self._options.tool_calls:
                outcomes.append((tool_call.name, await call.tools.call(tool_call.name, tool_call.arguments)))
        if self._options.reply_with_tool_results:
            text = tool_results_reply(outcomes, call.options.persona)
        else:
            text = reply.answer(shortname, call.prompt, prompts, lambda: _record_json(received))
        next_state: JsonValue = None
        if call.options.conversation_id is not None:
            next_state = {"turns": len(prompts), "prompts": prompts}
        return AdapterReply(
            text=text,
            events=self._options.events if call.options.stream_events else (),
            conversation_state=next_state,
        )


def _committed_prompts(adapter: str, state: JsonValue) -> list[str]:
    """The prompts of a committed scripted state (none at the start of a conversation)."""
    if state is None:
        return []
    prompts = state.get("prompts") if isinstance(state, dict) else None
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise errors.AdapterInternal(adapter, "the conversation state is not a scripted transcript")
    return list(prompts)
