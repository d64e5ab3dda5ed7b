"""Caller tools over a ToolSession: one ToolBox per call, and the session that carries it.

No grpc here: `convert` turns the stream's protos into the messages below and
back, and the servicer only plugs the two together.

A session, as the caller sees it:

1. The caller sends `start` (a Produce or Invoke call plus its tools). The
   call is validated like Produce/Invoke, the tool specs are checked (names
   `[A-Za-z0-9_-]{1,64}`, unique; schemas valid draft 2020-12) and the tool
   filter must name only tools of the call (empty filters and unknown
   names fail loudly). Then the broker judges the call: a refusal ends the
   stream before any adapter code runs, with the same status Produce gives.
2. While the adapter runs, every tool call the model makes goes through this
   call's `SessionToolBox`:
   - a tool that does not exist, or that the filter hides, gets an error
     outcome; the caller never hears of it (visibility and execution are one
     set: a model cannot run what it was not shown);
   - arguments that break the tool's schema get an error outcome, unasked;
   - `read_only` tools are sent to the caller as a ToolCall at once;
     `mutating` and `sensitive` ones (and unspecified risk, which is
     `mutating`) first as an ApprovalRequest. Deny: the model gets a denied
     outcome with the caller's reason. Edit: the edited arguments are
     validated again; if they break the schema the model gets an error
     outcome and the tool does not run. The caller is not asked again: it
     wrote those arguments itself, and a loop of re-asking could go on
     forever. The model may call again, and that call is asked again;
   - a result is validated against the tool's return schema; a violation is
     an error outcome naming it;
   - every call, whatever became of it, leaves a ToolCallRecord in the
     call's audit record (`tool_calls`): decision, approval, risk, duration
     and the error the model was given.
3. The final message is the Produce or Invoke response, then the stream ends OK.

With `start.stream` the call runs as a stream (the broker's `stream`, as
ProduceStream / InvokeStream): the Decision goes out first, then the
adapter's deltas and events (events only with `options.stream_events`) as it
reports them, interleaved with the tool calls and approval requests in the
order they happen: every message goes through one queue, put there when it
happens. The final response comes after every message queued before it; its
output is validated once, at the end, and a violation is the stream's error.
Without `stream` only tool calls, approval requests and the result are sent.

The caller's protocol mistakes end the stream with InvalidRequest (and cancel
the adapter's work): a first message that is not `start`, a second `start`,
an answer for a call id nothing waits for (or of the wrong kind), malformed
JSON, an EDIT without arguments, and half-closing the stream before the
result (nothing could answer the model's next tool call). A caller that
cancels cancels the adapter's work too. The call's time budget covers the
whole session, tool round trips included.

Tool sets belong to one call: each session builds its own SessionToolBox,
and nothing here is shared between sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from agentsidecar.negotiator_service import negotiation
from agentsidecar.negotiator_service.errors import InvalidRequest
from agentsidecar.negotiator_service.model import (
    AdapterReply,
    CallKind,
    CallRequest,
    Decision,
    JsonValue,
    StreamDelta,
    StreamEvent,
    ToolApproval,
    ToolBox,
    ToolCallDecision,
    ToolCallLog,
    ToolCallRecord,
    ToolFilter,
    ToolOutcome,
    ToolRisk,
    ToolSpec,
    json_problem,
    strict_json,
)

if TYPE_CHECKING:
    from agentsidecar.negotiator_service.mcp_tools import McpTool, McpTools

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# What joins an MCP server's name to its tool's name (mcp_policy.SEPARATOR).
MCP_NAME_SEPARATOR = "__"
# Listed violations of one schema check, before "and N more".
_MAX_LISTED_PROBLEMS = 5
_MCP_LOGGER = logging.getLogger("agentsidecar.negotiator_service.mcp")


class ApprovalDecision(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"
    EDIT = "edit"


@dataclass(frozen=True, slots=True)
class ToolDraft:
    """A tool spec as the caller sent it: schemas still JSON text ("" = none)."""

    name: str
    arguments_schema: str
    description: str = ""
    return_schema: str = ""
    metadata: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    risk: ToolRisk = ToolRisk.MUTATING


# --- caller → negotiator -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartMessage:
    call: CallRequest  # without tools: `prepare_call` adds the validated ones
    tools: tuple[ToolDraft, ...]
    call_field: str  # where the call sits in the request: "start.produce" | "start.invoke"
    stream: bool = False  # send the decision, deltas and events as they happen


@dataclass(frozen=True, slots=True)
class ToolResultMessage:
    call_id: str
    result_json: str | None = None
    error: str | None = None  # neither set: the caller left the oneof empty


@dataclass(frozen=True, slots=True)
class ApprovalMessage:
    call_id: str
    decision: ApprovalDecision
    edited_arguments_json: str = ""
    reason: str = ""


CallerMessage = StartMessage | ToolResultMessage | ApprovalMessage


# --- negotiator → caller -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCallMessage:
    call_id: str
    name: str
    arguments_json: str
    risk: ToolRisk


@dataclass(frozen=True, slots=True)
class ApprovalRequestMessage:
    call_id: str
    tool_name: str
    arguments_json: str
    risk: ToolRisk
    adapter: str
    description: str
    metadata: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class FinalResult:
    kind: CallKind
    reply: AdapterReply
    decision: Decision
    conversation_id: str | None = None


# What a streamed session sends as it happens, besides tool calls and approval requests.
StreamedMessage = Decision | StreamDelta | StreamEvent
SessionMessage = ToolCallMessage | ApprovalRequestMessage | StreamedMessage | FinalResult
Emit = Callable[[StreamedMessage], None]

# Runs the prepared call (the broker, possibly inside a conversation) with its ToolBox. With an
# Emit (a streamed session) it runs as a stream and hands each decision, delta and event to it.
Dispatch = Callable[[CallRequest, ToolBox | None, Emit | None], Awaitable[tuple[AdapterReply, Decision]]]


# --- the pure part: validating a start -----------------------------------------------


def prepare_call(start: StartMessage) -> tuple[CallRequest, tuple[ToolSpec, ...]]:
    """The call with its validated tools, and the tools the model may see.

    Raises InvalidRequest listing every problem of the call and its tools at
    once; field paths start at the top of the ToolSessionRequest.
    """
    problems: list[tuple[str, str]] = []
    try:
        negotiation.validate_request(start.call)
    except InvalidRequest as error:
        problems.extend((f"{start.call_field}.{path}", text) for path, text in error.violations)
    specs, tool_problems = parse_tools(start.tools, "start.tools")
    problems.extend(tool_problems)
    visible = specs
    tool_filter = start.call.options.tool_filter
    if tool_filter is not None:
        filter_path = f"{start.call_field}.options.tool_filter"
        # MCP tools are listed only once their servers run: with MCP servers (the
        # request's or a profile's), a `<server>__<tool>` name may name one of them.
        may_have_mcp = bool(start.call.options.mcp_servers) or start.call.options.profile is not None
        problems.extend(
            unknown_filter_names(
                tool_filter, [d.name for d in start.tools], filter_path, mcp_names=may_have_mcp
            )
        )
        visible = visible_tools(specs, tool_filter)
    if problems:
        raise InvalidRequest(problems)
    return replace(start.call, tools=specs), visible


def parse_tools(drafts: Sequence[ToolDraft], path: str) -> tuple[tuple[ToolSpec, ...], list[tuple[str, str]]]:
    """Tool specs with parsed schemas, and every problem found on the way."""
    problems: list[tuple[str, str]] = []
    specs: list[ToolSpec] = []
    first_index: dict[str, int] = {}
    for index, draft in enumerate(drafts):
        here = f"{path}[{index}]"
        if not TOOL_NAME.fullmatch(draft.name):
            problems.append((f"{here}.name", f"{draft.name!r} must match [A-Za-z0-9_-]{{1,64}}"))
        elif draft.name in first_index:
            problems.append(
                (
                    f"{here}.name",
                    f'duplicate tool name "{draft.name}" (also {path}[{first_index[draft.name]}])',
                )
            )
        else:
            first_index[draft.name] = index
        if not draft.arguments_schema:
            problems.append((f"{here}.arguments_schema", "is required (a JSON Schema of the arguments)"))
        arguments_schema = _tool_schema(draft.arguments_schema, f"{here}.arguments_schema", problems)
        return_schema = _tool_schema(draft.return_schema, f"{here}.return_schema", problems)
        return_schema_ok = return_schema is not None or not draft.return_schema
        if arguments_schema is not None and return_schema_ok:
            specs.append(
                ToolSpec(
                    name=draft.name,
                    arguments_schema=arguments_schema,
                    description=draft.description,
                    return_schema=return_schema,
                    metadata=draft.metadata,
                    risk=draft.risk,
                )
            )
    return tuple(specs), problems


def _tool_schema(text: str, path: str, problems: list[tuple[str, str]]) -> Mapping[str, Any] | None:
    if not text:
        return None
    schema, schema_problems = tool_schema(text)
    problems.extend((path, description) for description in schema_problems)
    return schema


def tool_schema(text: str) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """A tool's schema text parsed, else every problem with it (each worded as for an output schema).

    The checks of a Produce output schema, compiling included (JSON, draft
    2020-12, every $ref resolvable inside the document, every `pattern` a
    regular expression the validator takes), so a schema `schema_problems`
    could not apply is refused here, when the tools are offered, never found
    out when the model calls the tool.
    """
    checked, schema = negotiation.check_schema_text(text, compile=True)
    return schema, tuple(description for _, description in checked.problems)


def unknown_filter_names(
    tool_filter: ToolFilter, tool_names: Sequence[str], path: str, *, mcp_names: bool = False
) -> list[tuple[str, str]]:
    """Filter entries naming no tool of the call (empty entries are validate_request's to report).

    With `mcp_names`, a name holding MCP_NAME_SEPARATOR counts as known.
    """
    known = set(tool_names)
    return [
        (f"{path}.{list_name}[{index}]", f'names no tool of this call: "{name}"')
        for list_name, names in (("allow", tool_filter.allow), ("deny", tool_filter.deny))
        for index, name in enumerate(names)
        if name and name not in known and not (mcp_names and MCP_NAME_SEPARATOR in name)
    ]


def visible_tools(specs: Sequence[ToolSpec], tool_filter: ToolFilter) -> tuple[ToolSpec, ...]:
    """`allow` (when given) keeps only its names, then `deny` removes its names.

    The rule: docs/negotiation.md, "Tool filter".
    """
    allowed = set(tool_filter.allow)
    denied = set(tool_filter.deny)
    return tuple(spec for spec in specs if (not allowed or spec.name in allowed) and spec.name not in denied)


def schema_problems(schema: Mapping[str, Any], instance: JsonValue) -> str:
    """The instance's violations of a schema as one line, "" when it conforms.

    The schema is one `tool_schema` passed, applied by the validator that
    checks Produce output, so what it accepted is what is applied.
    """
    found = [
        f"{pointer or '/'}: {message}"
        for pointer, message in negotiation.schema_violations(negotiation.schema_validator(schema), instance)
    ]
    listed = "; ".join(found[:_MAX_LISTED_PROBLEMS])
    if len(found) > _MAX_LISTED_PROBLEMS:
        listed += f"; and {len(found) - _MAX_LISTED_PROBLEMS} more"
    return listed


def call_target(request: CallRequest) -> str:
    return request.adapter if request.adapter is not None else request.agent or ""


# --- the ToolBox of one session ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Approval:
    decision: ApprovalDecision
    arguments: JsonValue = None  # the edited arguments, for EDIT
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ApprovalResult:
    """What asking the caller gave: the refusal for the model (None when it may run), the
    arguments to run with (the caller's, after an EDIT), and how it was approved."""

    refusal: ToolOutcome | None
    arguments: JsonValue
    approval: ToolApproval


def tool_call_record(
    function: str,
    spec: ToolSpec | None,
    decision: ToolCallDecision,
    approval: ToolApproval,
    outcome: ToolOutcome,
    started: float,
    *,
    server: str = "",
    tool: str = "",
) -> ToolCallRecord:
    """The audit record of one tool call that started at `started` (time.monotonic) and ended now."""
    return ToolCallRecord(
        function=function,
        decision=decision,
        approval=approval,
        server=server,
        tool=tool or (spec.name if spec is not None else ""),
        risk=spec.risk if spec is not None else None,
        duration_seconds=max(0.0, time.monotonic() - started),
        error=outcome.error or "",
    )


@dataclass(slots=True)
class _Waiting:
    """A question put to the caller, and the answer it waits for."""

    answer: Literal["approval", "result"]
    future: asyncio.Future[Any]


class SessionToolBox:
    """The ToolBox of one ToolSession (see the module docstring for the rules).

    `send` puts a message on the session's outgoing stream; `answer` is fed
    the caller's tool results and approvals, and raises InvalidRequest for an
    answer nothing waits for. `log` holds a record of every call of a caller
    tool (the broker puts it in the call's audit record; a CallToolBox adds
    the MCP tools' records to it).
    """

    def __init__(
        self, visible: Sequence[ToolSpec], adapter: str, send: Callable[[SessionMessage], None]
    ) -> None:
        self._visible = tuple(visible)
        self._by_name = {spec.name: spec for spec in self._visible}
        self._adapter = adapter
        self._send = send
        self._ids = itertools.count(1)
        self._waiting: dict[str, _Waiting] = {}
        self._closed = False
        self.log = ToolCallLog()

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return self._visible

    async def call(self, name: str, arguments: JsonValue) -> ToolOutcome:
        started = time.monotonic()
        spec = self._by_name.get(name)
        if spec is None:
            # Hidden and nonexistent tools look the same: the filter is visibility.
            outcome = ToolOutcome(error=f'there is no tool named "{name}" in this call')
            return self._logged(name, None, ToolCallDecision.FILTERED, ToolApproval.NONE, outcome, started)
        problems = schema_problems(spec.arguments_schema, arguments)
        if problems:
            outcome = ToolOutcome(error=f'the arguments do not match the schema of "{name}": {problems}')
            return self._logged(
                name, spec, ToolCallDecision.INVALID_ARGUMENTS, ToolApproval.NONE, outcome, started
            )
        call_id = f"call_{next(self._ids)}"
        approval = ToolApproval.NOT_REQUIRED
        if spec.risk is not ToolRisk.READ_ONLY:
            approved = await self._approve(call_id, spec, arguments)
            approval, arguments = approved.approval, approved.arguments
            if approved.refusal is not None:
                return self._logged(
                    name, spec, refusal_decision(approved), approval, approved.refusal, started
                )
        arguments_json = json.dumps(arguments, ensure_ascii=False)
        outcome = await self._ask(
            call_id, "result", ToolCallMessage(call_id, name, arguments_json, spec.risk)
        )
        if outcome.error is None and spec.return_schema is not None:
            problems = schema_problems(spec.return_schema, outcome.result)
            if problems:
                outcome = ToolOutcome(error=f'the result of "{name}" violates its return schema: {problems}')
        return self._logged(name, spec, ToolCallDecision.RAN, approval, outcome, started)

    def _logged(
        self,
        name: str,
        spec: ToolSpec | None,
        decision: ToolCallDecision,
        approval: ToolApproval,
        outcome: ToolOutcome,
        started: float,
    ) -> ToolOutcome:
        self.log.add(tool_call_record(name, spec, decision, approval, outcome, started))
        return outcome

    async def approve(self, spec: ToolSpec, arguments: JsonValue) -> ApprovalResult:
        """Ask the caller to approve a call of a tool that runs elsewhere (an MCP tool).

        Records nothing: the ToolBox that runs the tool records the call.
        """
        return await self._approve(f"call_{next(self._ids)}", spec, arguments)

    async def _approve(self, call_id: str, spec: ToolSpec, arguments: JsonValue) -> ApprovalResult:
        name = spec.name
        approval: _Approval = await self._ask(
            call_id,
            "approval",
            ApprovalRequestMessage(
                call_id=call_id,
                tool_name=name,
                arguments_json=json.dumps(arguments, ensure_ascii=False),
                risk=spec.risk,
                adapter=self._adapter,
                description=spec.description,
                metadata=spec.metadata,
            ),
        )
        if approval.decision is ApprovalDecision.DENY:
            denied = ToolOutcome(
                denied=True, error=approval.reason or f'the caller denied the call of "{name}"'
            )
            return ApprovalResult(denied, None, ToolApproval.DENIED)
        if approval.decision is ApprovalDecision.EDIT:
            problems = schema_problems(spec.arguments_schema, approval.arguments)
            if problems:
                refusal = ToolOutcome(
                    error=f'the caller edited the arguments of "{name}" into ones that do not match '
                    f"its schema ({problems}); the tool did not run"
                )
                return ApprovalResult(refusal, None, ToolApproval.EDITED)
            return ApprovalResult(None, approval.arguments, ToolApproval.EDITED)
        return ApprovalResult(None, arguments, ToolApproval.ALLOWED)

    def answer(self, message: ToolResultMessage | ApprovalMessage) -> None:
        """Deliver a caller's answer to the tool call waiting for it."""
        if isinstance(message, ToolResultMessage):
            waiting = self._waiting_for(message.call_id, "result", "tool_result")
            waiting.future.set_result(_tool_outcome(message))
        else:
            waiting = self._waiting_for(message.call_id, "approval", "approval")
            waiting.future.set_result(_approval(message))
        del self._waiting[message.call_id]

    def close(self) -> None:
        """End the session: any question still open is cancelled."""
        self._closed = True
        for waiting in self._waiting.values():
            waiting.future.cancel()
        self._waiting.clear()

    async def _ask(self, call_id: str, answer: Literal["approval", "result"], message: SessionMessage) -> Any:
        if self._closed:
            raise RuntimeError("the tool session has ended")
        waiting = _Waiting(answer, asyncio.get_running_loop().create_future())
        self._waiting[call_id] = waiting
        self._send(message)
        try:
            return await waiting.future
        finally:
            # Answered questions are gone already; a cancelled one must not linger.
            if self._waiting.get(call_id) is waiting:
                del self._waiting[call_id]

    def _waiting_for(self, call_id: str, answer: str, message_field: str) -> _Waiting:
        waiting = self._waiting.get(call_id)
        if waiting is None:
            raise InvalidRequest(
                [(f"{message_field}.call_id", f'no tool call "{call_id}" is waiting for an answer')]
            )
        if waiting.answer != answer:
            raise InvalidRequest(
                [
                    (
                        f"{message_field}.call_id",
                        f'tool call "{call_id}" waits for {_with_article(waiting.answer)}, '
                        f"not {_with_article(answer)}",
                    )
                ]
            )
        return waiting


# --- MCP tools beside the caller's ----------------------------------------------------


class CallToolBox:
    """One call's ToolBox when it has MCP servers: the caller's tools (if any) and the MCP tools.

    MCP tools get the same treatment as caller tools: the call's tool filter
    decides which the model sees and may run (hidden ones and unknown names
    look the same), arguments are checked against the tool's inputSchema,
    and `read_only` tools run at once. A `mutating` or `sensitive` one needs
    approval: with a ToolSession the caller is asked (ApprovalRequest; DENY
    and EDIT as for caller tools), and the negotiator runs the tool itself,
    so no ToolCall is sent. Without a ToolSession there is nobody to ask: the
    model gets a denied outcome and the tool never reaches its server, unless
    the operator preapproved it on a config server (`preapproved`).

    Every MCP tool call the model makes is recorded in `log` (the call's
    ToolCallLog, which the broker puts in the call's audit record; caller
    tools record themselves through their own ToolBox) and logged as one
    `negotiator.mcp_tool_call` JSON line (logger agentsidecar.negotiator_service.mcp).
    """

    def __init__(
        self,
        caller: ToolBox | None,
        mcp: McpTools,
        tool_filter: ToolFilter | None,
        adapter: str,
        log: ToolCallLog | None = None,
    ) -> None:
        self._caller = caller
        self._mcp = mcp
        self._filter = tool_filter
        self._adapter = adapter
        self._log = log if log is not None else ToolCallLog()

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        own = self._caller.specs if self._caller is not None else ()
        return own + self._visible_mcp()

    async def refresh(self) -> None:
        """Re-list the MCP servers whose tools changed (before the next request to the model)."""
        await self._mcp.refresh()

    async def call(self, name: str, arguments: JsonValue) -> ToolOutcome:
        started = time.monotonic()
        tool = self._mcp.tool(name)
        if tool is None or tool.spec not in self._visible_mcp():
            if self._caller is not None:
                return await self._caller.call(name, arguments)
            outcome = ToolOutcome(error=f'there is no tool named "{name}" in this call')
            if tool is None:
                self._log.add(
                    tool_call_record(
                        name, None, ToolCallDecision.FILTERED, ToolApproval.NONE, outcome, started
                    )
                )
                return outcome
            return self._audit(tool, ToolCallDecision.FILTERED, ToolApproval.NONE, outcome, started)
        spec = tool.spec
        problems = schema_problems(spec.arguments_schema, arguments)
        if problems:
            outcome = ToolOutcome(error=f'the arguments do not match the schema of "{name}": {problems}')
            return self._audit(tool, ToolCallDecision.INVALID_ARGUMENTS, ToolApproval.NONE, outcome, started)
        approval = ToolApproval.NOT_REQUIRED
        if spec.risk is not ToolRisk.READ_ONLY:
            if tool.preapproved:
                approval = ToolApproval.PREAPPROVED
            elif isinstance(self._caller, SessionToolBox):
                approved = await self._caller.approve(spec, arguments)
                approval, arguments = approved.approval, approved.arguments
                if approved.refusal is not None:
                    return self._audit(tool, refusal_decision(approved), approval, approved.refusal, started)
            else:
                outcome = ToolOutcome(
                    denied=True,
                    error=f'"{name}" is a {spec.risk.value} tool and this call has no ToolSession to '
                    "approve it; it did not run",
                )
                return self._audit(tool, ToolCallDecision.DENIED, ToolApproval.NO_CHANNEL, outcome, started)
        outcome = await self._mcp.call(name, arguments)
        return self._audit(tool, ToolCallDecision.RAN, approval, outcome, started)

    def _visible_mcp(self) -> tuple[ToolSpec, ...]:
        specs = self._mcp.specs
        return specs if self._filter is None else visible_tools(specs, self._filter)

    def _audit(
        self,
        tool: McpTool,
        decision: ToolCallDecision,
        approval: ToolApproval,
        outcome: ToolOutcome,
        started: float,
    ) -> ToolOutcome:
        """Record the call in the call's log and the operators' log line; the outcome, for the model."""
        record = tool_call_record(
            tool.spec.name,
            tool.spec,
            decision,
            approval,
            outcome,
            started,
            server=tool.server,
            tool=tool.tool,
        )
        self._log.add(record)
        if _MCP_LOGGER.isEnabledFor(logging.INFO):
            line = {
                "event": "negotiator.mcp_tool_call",
                "adapter": self._adapter,
                "server": tool.server,
                "tool": tool.tool,
                "function": tool.spec.name,
                "risk": tool.spec.risk.value,
                "decision": decision.value,
                "approval": approval.value,
                "duration_seconds": round(record.duration_seconds, 6),
                "error": record.error,
            }
            _MCP_LOGGER.info(json.dumps(line))
        return outcome


def refusal_decision(approved: ApprovalResult) -> ToolCallDecision:
    """What a refused approval made of the call: denied, or an EDIT that broke the schema."""
    return (
        ToolCallDecision.DENIED
        if approved.approval is ToolApproval.DENIED
        else ToolCallDecision.INVALID_ARGUMENTS
    )


def _with_article(answer: str) -> str:
    return "an approval" if answer == "approval" else "a tool result"


def _tool_outcome(message: ToolResultMessage) -> ToolOutcome:
    if message.result_json is not None:
        return ToolOutcome(result=_parse_json(message.result_json, "tool_result.result_json"))
    if message.error is not None:
        return ToolOutcome(error=message.error or "the tool failed without a message")
    raise InvalidRequest([("tool_result.outcome", "exactly one of result_json or error is required")])


def _approval(message: ApprovalMessage) -> _Approval:
    if message.decision is ApprovalDecision.EDIT:
        if not message.edited_arguments_json:
            raise InvalidRequest([("approval.edited_arguments_json", "is required when decision is EDIT")])
        arguments = _parse_json(message.edited_arguments_json, "approval.edited_arguments_json")
        return _Approval(ApprovalDecision.EDIT, arguments=arguments, reason=message.reason)
    if message.edited_arguments_json:
        # Edited arguments beside ALLOW or DENY would otherwise be silently dropped.
        raise InvalidRequest(
            [("approval.edited_arguments_json", f"is only for EDIT, not {message.decision.name}")]
        )
    return _Approval(message.decision, reason=message.reason)


def _parse_json(text: str, path: str) -> JsonValue:
    try:
        return strict_json(text)
    except ValueError as exc:  # malformed, NaN / Infinity, or over a JSON limit
        raise InvalidRequest([(path, json_problem(exc))]) from exc


# --- the session ---------------------------------------------------------------------


async def run_session(
    incoming: AsyncIterator[CallerMessage], dispatch: Dispatch
) -> AsyncIterator[SessionMessage]:
    """Run one ToolSession: the messages to send, ending with the FinalResult.

    Raises the NegotiatorError the stream must end with. Cancelling the
    consumer, or any error, cancels the adapter's work (for a streamed
    session, its upstream stream with it).
    """
    start = await _first(incoming)
    request, visible = prepare_call(start)
    outgoing: asyncio.Queue[SessionMessage] = asyncio.Queue()
    # MCP servers (the request's or a profile's) need the session as their approval channel.
    may_have_mcp = bool(request.options.mcp_servers) or request.options.profile is not None
    toolbox = (
        SessionToolBox(visible, call_target(request), outgoing.put_nowait)
        if request.tools or may_have_mcp
        else None
    )
    emit = outgoing.put_nowait if start.stream else None
    work = asyncio.ensure_future(dispatch(request, toolbox, emit))
    reader = asyncio.ensure_future(_read_answers(incoming, toolbox))
    next_message: asyncio.Future[SessionMessage] | None = None
    try:
        while True:
            if next_message is None:
                next_message = asyncio.ensure_future(outgoing.get())
            waiting_on: set[asyncio.Future[Any]] = {work, reader, next_message}
            await asyncio.wait(waiting_on, return_when=asyncio.FIRST_COMPLETED)
            if work.done() and work.exception() is not None:
                # What the call reported before it failed goes out first; a question it
                # left queued waits for nothing any more and is not sent.
                for message in _reports(next_message, outgoing):
                    yield message
                work.result()
            if next_message.done():
                yield next_message.result()
                next_message = None
                continue
            if work.done():
                # Messages queued before the call ended go out before its result, in order.
                # A cancelled get leaves its item in the queue.
                next_message.cancel()
                await asyncio.wait({next_message})
                if not next_message.cancelled():
                    yield next_message.result()
                next_message = None
                while not outgoing.empty():
                    yield outgoing.get_nowait()
                reply, decision = work.result()
                yield FinalResult(request.kind, reply, decision, request.options.conversation_id)
                return
            reader.result()  # the caller's protocol error, if that is why it ended
            raise InvalidRequest(
                [
                    (
                        "stream",
                        "the caller half-closed the stream before the result, so no tool call could be "
                        "answered; the call was cancelled (keep the stream open until the result)",
                    )
                ]
            )
    finally:
        if toolbox is not None:
            toolbox.close()
        tasks: tuple[asyncio.Future[Any] | None, ...] = (work, reader, next_message)
        pending = [task for task in tasks if task is not None and not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait(pending)


def _reports(
    next_message: asyncio.Future[SessionMessage], outgoing: asyncio.Queue[SessionMessage]
) -> list[SessionMessage]:
    """The decision, deltas and events still to send, in order (a streamed session's, else none)."""
    queued = [next_message.result()] if next_message.done() else []
    while not outgoing.empty():
        queued.append(outgoing.get_nowait())
    return [message for message in queued if isinstance(message, Decision | StreamDelta | StreamEvent)]


async def _first(incoming: AsyncIterator[CallerMessage]) -> StartMessage:
    try:
        first = await anext(incoming)
    except StopAsyncIteration:
        raise InvalidRequest([("start", "the stream ended before start was sent")]) from None
    if not isinstance(first, StartMessage):
        raise InvalidRequest([("start", "the first message must be start")])
    return first


async def _read_answers(incoming: AsyncIterator[CallerMessage], toolbox: SessionToolBox | None) -> None:
    async for message in incoming:
        if isinstance(message, StartMessage):
            raise InvalidRequest([("start", "only the first message may be start")])
        if toolbox is None:
            where = "tool_result" if isinstance(message, ToolResultMessage) else "approval"
            raise InvalidRequest(
                [(f"{where}.call_id", "this session has no tools, so nothing waits for an answer")]
            )
        toolbox.answer(message)
