"""Brokered calls: judge first, run the adapter only if every requirement is met.

The broker is the one place adapter code runs from. It refuses before
dispatch (no adapter code runs on a refusal), bounds the run by the caller's
time budget, maps every adapter failure into the taxonomy, and checks
structured output against the caller's schema rather than trusting the
adapter's declaration.

Before dispatch it also expands the call's negotiator profile (the adapter
gets the merged options; negotiation.py) and holds the call to its
delegation depth limit (depth.py). Every call it judges leaves exactly one
audit record (audit.py): a dry run "accepted" or "refused"; a brokered call
"refused" when it never reached the adapter, else "succeeded" or "failed".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii as _json_text
from typing import Any

import jsonschema_rs

from agentsidecar.negotiator_service import negotiation
from agentsidecar.negotiator_service.audit import AuditLog
from agentsidecar.negotiator_service.call_caches import MAX_SCHEMA_BYTES, CallCaches
from agentsidecar.negotiator_service.depth import DEFAULT_MAX_DEPTH, check_depth
from agentsidecar.negotiator_service.errors import (
    AdapterInternal,
    AdapterTimeout,
    InvalidRequest,
    NegotiatorError,
    OutputSchemaViolation,
    UnsupportedCapability,
)
from agentsidecar.negotiator_service.mcp_policy import McpPolicy, check_servers
from agentsidecar.negotiator_service.model import (
    Adapter,
    AdapterCall,
    AdapterReply,
    AuditOutcome,
    AuditRecord,
    CallKind,
    CallRequest,
    Capability,
    Decision,
    JsonValue,
    Profile,
    StreamDelta,
    StreamEvent,
    StreamItem,
    ToolBox,
    ToolCallLog,
    Usage,
)
from agentsidecar.negotiator_service.negotiation import CheckedSchema
from agentsidecar.negotiator_service.registry import AdapterRegistry
from agentsidecar.negotiator_service.tools import visible_tools
from agentsidecar.negotiator_service.usage import count_tokens, model_label
from agentsidecar.sidecar_runtime.metrics import record_refusals

_LOGGER = logging.getLogger("agentsidecar.negotiator_service.broker")
# A judged call: the decision, the schema parsed for this call, the call with
# its profile expanded, and the schema's CheckedSchema (None for an Invoke).
_Judged = tuple[Decision, Mapping[str, Any] | None, CallRequest, CheckedSchema | None]

# Enum members as module constants: reading one off its class goes through the enum
# metaclass's __getattr__ hook on every call, a module global does not.
_PRODUCE = CallKind.PRODUCE
_SUCCEEDED = AuditOutcome.SUCCEEDED


class Broker:
    def __init__(
        self,
        registry: AdapterRegistry,
        logger: logging.Logger | None = None,
        *,
        profiles: Mapping[str, Profile] | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
        audit: AuditLog | None = None,
        decision_sink: Callable[[str], None] | None = None,
        mcp_policy: McpPolicy | None = None,
        caches: CallCaches | None = None,
    ) -> None:
        """`profiles` are the config's (None: profile names are the adapters' own);
        `max_depth` is the negotiator's delegation limit (config `limits.max_depth`);
        `audit` receives a record of every decision (default: a stream-only log).

        Each decision's `negotiator.decision` record (one JSON line) goes to
        `decision_sink` when given, else to `logger` at INFO. `negotiator
        serve` hands it a batched stderr writer: the logging module's
        per-record work and flushed write cost more than the rest of a
        dry run.

        `mcp_policy` (config `mcp:`) admits the MCP servers a request brings;
        the default admits none. Servers from the config's profiles are always
        admitted. A refused server raises McpServerNotAllowed before dispatch.

        `caches` keeps judgements and decision lines between calls (call_caches.py;
        default: this broker's own).
        """
        self.registry = registry
        self.profiles = profiles
        self.max_depth = max_depth
        self.mcp_policy = mcp_policy if mcp_policy is not None else McpPolicy()
        self.audit = audit if audit is not None else AuditLog()
        self._logger = logger or _LOGGER
        self._decision_sink = decision_sink
        self.caches = caches if caches is not None else CallCaches()

    def negotiate(self, request: CallRequest, *, caller: str = "") -> Decision:
        """The dry run: the decision a call would get. Runs no adapter code.

        Audited as "accepted" or "refused"; a call that cannot be judged
        (invalid, no such adapter) is audited as refused and raises. An
        accepted call whose MCP servers the `mcp:` admission refuses raises
        McpServerNotAllowed, as Produce and Invoke do at the same point.
        """
        if not self.audit.listening:
            # Judged without awaiting anything, so nobody can start listening
            # before it ends: no record to draft.
            return self._negotiate(request)
        audit = _AuditDraft(self, "negotiate", caller, request, delegation_depth=0)
        try:
            decision = self._negotiate(request)
        except BaseException as error:
            audit.ended(error, dispatched=False)
            raise
        audit.decision = decision
        if decision.accepted:
            audit.emit(AuditOutcome.ACCEPTED)
        else:
            audit.emit(AuditOutcome.REFUSED, UnsupportedCapability.reason)
        return decision

    def _negotiate(self, request: CallRequest) -> Decision:
        decision, _, expanded, _ = self._decide(request, operation="negotiate", dispatch=False)
        # The admission applies to what dispatch would start, so only to an accepted call
        # (a refused one is refused by its gaps first, in Produce as here), and only to the
        # servers it brings. Negotiate's field paths start at the call (`invoke.`/`produce.`).
        if decision.accepted and expanded.options.mcp_servers:
            self._admit_mcp_servers(expanded, f"{request.kind.value}.options")
        return decision

    def _admit_mcp_servers(self, expanded: CallRequest, field_prefix: str = "options") -> None:
        """Raise McpServerNotAllowed for a caller-supplied MCP server the `mcp:` section does not admit."""
        if expanded.options.mcp_servers:
            check_servers(expanded.options.mcp_servers, self.mcp_policy, field_prefix)

    async def call(
        self,
        request: CallRequest,
        *,
        time_budget: float | None,
        delegation_depth: int = 0,
        conversation_state: JsonValue = None,
        tools: ToolBox | None = None,
        caller: str = "",
        audit_operation: str | None = None,
        check_reply: Callable[[AdapterReply, Decision], None] | None = None,
    ) -> tuple[AdapterReply, Decision]:
        """Judge the call, then run it; refusals raise UnsupportedCapability listing every gap.

        `time_budget` is the seconds the caller has left (None: no deadline).
        `delegation_depth` is the call's depth (0: top level); a call deeper
        than its limit (depth.py) raises DelegationDepthExceeded before dispatch.
        `conversation_state` is the conversation's committed adapter state; the
        reply's next state is returned untouched for `conversations` to commit.
        `tools` is the call's own ToolBox (a ToolSession's), handed to the adapter.
        `caller` (identity) and `audit_operation` (default: the call's kind)
        go into the audit record: "refused" when the call never reached the
        adapter, else "succeeded" or "failed" (cancelled calls too).
        `check_reply` runs last, after output validation, and may raise (a
        reply too large to send): the call then fails and is audited so.
        Cancelling the task cancels the adapter's work.
        """
        operation: str = request.kind._value_  # `.value` without the enum descriptor's call
        audit = _AuditDraft(
            self, audit_operation or operation, caller, request, delegation_depth=delegation_depth
        )
        dispatched = False
        try:
            decision, checked, adapter, adapter_call = self._prepare(
                request, operation, audit, time_budget, delegation_depth, conversation_state, tools
            )
            dispatched = True
            reply = await self._run(adapter, decision.adapter, request.kind, adapter_call)
            self._count_usage(audit, adapter, decision, adapter_call, reply)
            if not request.options.stream_events and reply.events:
                # Events were not negotiated; returning them anyway would be an
                # undeclared surface.
                reply = replace(reply, events=())
            if checked is not None:
                check_checked_output(decision.adapter, checked, reply.text)
            if check_reply is not None:
                check_reply(reply, decision)
        except BaseException as error:
            audit.ended(error, dispatched=dispatched)
            raise
        audit.emit(_SUCCEEDED)
        return reply, decision

    async def stream(
        self,
        request: CallRequest,
        *,
        time_budget: float | None,
        delegation_depth: int = 0,
        conversation_state: JsonValue = None,
        tools: ToolBox | None = None,
        caller: str = "",
        audit_operation: str | None = None,
        check_reply: Callable[[AdapterReply, Decision], None] | None = None,
    ) -> AsyncGenerator[Decision | StreamDelta | StreamEvent | AdapterReply, None]:
        """`call` as it happens: the Decision, then deltas and events, then the final AdapterReply.

        The same judgement, checks, audit and error mapping as `call`; a
        refusal raises before anything is yielded (and before any adapter code
        runs). An adapter with a `stream` method (model.StreamingAdapter) is
        read as it yields; any other is run by its unary method and its
        events and reply follow. Events are yielded only with
        `options.stream_events`. The final reply's text is validated against
        the output schema, and `check_reply` run, before it is yielded: a
        violation is the stream's error. `time_budget` bounds the whole
        stream. Closing the iterator (the caller went away) closes the
        adapter's stream at once and audits the call as cancelled.
        """
        operation: str = request.kind._value_
        audit = _AuditDraft(
            self, audit_operation or operation, caller, request, delegation_depth=delegation_depth
        )
        dispatched = False
        try:
            decision, checked, adapter, adapter_call = self._prepare(
                request, operation, audit, time_budget, delegation_depth, conversation_state, tools
            )
            yield decision
            dispatched = True
            want_events = request.options.stream_events
            reply: AdapterReply | None = None
            items = self._stream_adapter(adapter, decision.adapter, request.kind, adapter_call)
            # Closed as soon as this stream is: the adapter's upstream must not outlive the caller.
            async with contextlib.aclosing(items):
                async for item in items:
                    if isinstance(item, AdapterReply):
                        reply = item
                    elif isinstance(item, StreamDelta) or want_events:
                        yield item
            assert reply is not None  # _stream_adapter ends with the reply or raises
            reply = replace(reply, events=())
            self._count_usage(audit, adapter, decision, adapter_call, reply)
            if checked is not None:
                check_checked_output(decision.adapter, checked, reply.text)
            if check_reply is not None:
                check_reply(reply, decision)
        except BaseException as error:
            audit.ended(error, dispatched=dispatched)
            raise
        audit.emit(AuditOutcome.SUCCEEDED)
        yield reply

    @staticmethod
    def _count_usage(
        audit: _AuditDraft, adapter: Adapter, decision: Decision, call: AdapterCall, reply: AdapterReply
    ) -> None:
        """The tokens a reply reports, into its audit record and the token counter (spent even when
        the output then fails validation)."""
        if reply.usage is None:
            return
        audit.usage = reply.usage
        count_tokens(decision.adapter, model_label(adapter.declaration, call.options.model), reply.usage)

    def _prepare(
        self,
        request: CallRequest,
        operation: str,
        audit: _AuditDraft,
        time_budget: float | None,
        delegation_depth: int,
        conversation_state: JsonValue,
        tools: ToolBox | None,
    ) -> tuple[Decision, CheckedSchema | None, Adapter, AdapterCall]:
        """Judge a brokered call and hold it to the rules that refuse before dispatch; what to run."""
        decision, schema, expanded, checked = self._decide(request, operation=operation, dispatch=True)
        audit.decision = decision
        # Before the capability verdict: no adapter could serve a call this deep. A top-level call
        # without a limit of its own is within any limit that is not negative: nothing to check.
        if delegation_depth != 0 or expanded.options.max_depth is not None or self.max_depth < 0:
            check_depth(delegation_depth, expanded.options, self.max_depth)
        if not decision.accepted:
            record_refusals(gap.requirement.capability.value for gap in decision.gaps)
            raise UnsupportedCapability(decision)
        self._admit_mcp_servers(expanded)

        entry = self.registry.get(decision.adapter)
        # One log per call: a ToolSession's ToolBox brings its own, which its records already go to.
        tool_log = getattr(tools, "log", None)
        if not isinstance(tool_log, ToolCallLog):
            tool_log = ToolCallLog()
        audit.tool_log = tool_log
        if checked is not None and expanded.output_schema:
            checked, schema = checked.for_dispatch(expanded.output_schema, schema)
        options = expanded.options
        # The declaration `_decide` judged by: the target's, as the registry held it (nothing was
        # awaited since).
        target = request.adapter if request.adapter is not None else request.agent
        judged = self.registry.find_declaration(target) if target is not None else None
        adapter_call = AdapterCall(
            prompt=expanded.prompt,
            options=options,
            output_schema=schema,
            time_budget=time_budget,
            delegation_depth=delegation_depth,
            conversation_state=conversation_state,
            tools=tools,
            tool_log=tool_log,
            judgement=None if judged is None else (decision, judged, request.kind, options, schema, tools),
        )
        return decision, checked, entry.adapter, adapter_call

    async def _stream_adapter(
        self, adapter: Adapter, shortname: str, kind: CallKind, adapter_call: AdapterCall
    ) -> AsyncGenerator[StreamItem, None]:
        """The adapter's stream under the call's deadline and error mapping; ends with its AdapterReply."""
        stream_method = getattr(adapter, "stream", None)
        if stream_method is None:
            reply = await self._run(adapter, shortname, kind, adapter_call)
            for event in reply.events:
                yield event
            yield reply
            return
        time_budget = adapter_call.time_budget
        if time_budget is not None and time_budget <= 0:
            raise AdapterTimeout(shortname, f"deadline of {time_budget:g}s exceeded before dispatch")
        loop = asyncio.get_running_loop()
        # One deadline for the whole stream, applied to each wait for the adapter's next item.
        when = None if time_budget is None else loop.time() + time_budget
        items: AsyncIterator[StreamItem] = stream_method(adapter_call, kind)
        try:
            while True:
                deadline = asyncio.timeout_at(when) if when is not None else None
                try:
                    if deadline is None:
                        item = await anext(items)
                    else:
                        async with deadline:
                            item = await anext(items)
                except StopAsyncIteration:
                    raise AdapterInternal(shortname, "the stream ended without a final reply") from None
                except TimeoutError as exc:
                    if deadline is not None and deadline.expired():
                        raise AdapterTimeout(shortname, f"deadline of {time_budget:g}s exceeded") from exc
                    raise AdapterInternal(shortname, f"{type(exc).__name__}: {exc}") from exc
                except NegotiatorError:
                    raise
                except Exception as exc:
                    raise AdapterInternal(shortname, f"{type(exc).__name__}: {exc}") from exc
                if isinstance(item, AdapterReply):
                    yield item
                    return
                if not isinstance(item, StreamDelta | StreamEvent):
                    raise AdapterInternal(
                        shortname, f"streamed {type(item).__name__}, not a delta, event or reply"
                    )
                yield item
        finally:
            closer = getattr(items, "aclose", None)
            if closer is not None:
                await closer()

    def audit_refusal(
        self,
        operation: str,
        request: CallRequest,
        error: NegotiatorError,
        *,
        caller: str = "",
        delegation_depth: int = 0,
    ) -> None:
        """Audit a call refused outside the broker (a busy conversation), so every call leaves a record."""
        _AuditDraft(self, operation, caller, request, delegation_depth=delegation_depth).ended(
            error, dispatched=False
        )

    def preview(self, request: CallRequest) -> Decision:
        """The decision `call` would reach, profiles expanded, without logging or auditing it.

        For code that must know the verdict before calling (conversations
        skip their lease for a refused call); raises as `negotiate` does.
        """
        return self._judge_checked(request)[0]

    def _decide(self, request: CallRequest, *, operation: str, dispatch: bool) -> _Judged:
        judged = self._judge_checked(request, dispatch=dispatch)
        self._log_decision(operation, judged[0], request)
        return judged

    def _judge(self, request: CallRequest) -> tuple[Decision, Mapping[str, Any] | None, CallRequest]:
        """The decision, the parsed schema, and the call with its profile expanded (what the adapter gets)."""
        decision, schema, expanded, checked = self._judge_checked(request)
        if checked is not None and expanded.output_schema:
            checked, schema = checked.for_dispatch(expanded.output_schema, schema)
        return decision, schema, expanded

    def _judge_checked(self, request: CallRequest, *, dispatch: bool = False) -> _Judged:
        """`_judge`, with the output schema's CheckedSchema (None for an Invoke).

        The schema is None also for a Produce whose text was checked before
        (`CheckedSchema.for_dispatch` gives the one a dispatched call hands
        its adapter): a dry run never needs it.

        A judgement is a pure function of the call's options, target, kind,
        schema text and whether it has a prompt, of the profiles (fixed per
        broker), and of the target's declaration, so it is kept in
        `caches.judgements` per the options and declaration objects (the rule:
        call_caches.py): a call like an earlier one skips validation, profile
        expansion, derivation and judging.
        """
        if request.tools:
            return self._judge_afresh(request, dispatch)
        target = request.adapter if request.adapter is not None else request.agent
        declaration = self.registry.find_declaration(target) if target is not None else None
        if declaration is None:
            return self._judge_afresh(request, dispatch)  # raises, naming what is missing
        options = request.options
        # The kind as a bool: hashing an enum member runs Python code, hashing a bool does not.
        produce = request.kind is _PRODUCE
        shape = (produce, request.adapter, request.agent, request.output_schema, request.prompt == "")
        judgements = self.caches.judgements
        known = judgements.get((options, declaration), shape, None)
        if known is None:
            judged = self._judge_afresh(request, dispatch)
            decision, _, expanded, checked = judged
            if checked is not None and len(request.output_schema or "") > MAX_SCHEMA_BYTES:
                # As the schema cache: a larger schema's validator lives for one call.
                checked = checked.without_validator()
            judgements.put((options, declaration), shape, (decision, expanded.options, checked))
            return judged
        decision, expanded_options, checked = known
        if expanded_options is not options:
            request = replace(request, options=expanded_options)
        return decision, None, request, checked

    def _judge_afresh(self, request: CallRequest, dispatch: bool) -> _Judged:
        # A call to dispatch has its schema compiled by the check itself (negotiation.check_schema_text).
        check = self.caches.dispatch_schema if dispatch else self.caches.checked_schema
        schema, checked = negotiation.validate_call(request, self.profiles, check)
        expanded, origins = negotiation.expand_profile(request, self.profiles)
        declaration = negotiation.select(expanded, self.registry.declaration)
        if expanded.options.settings:
            self._check_settings(declaration.shortname, expanded)
        formats = checked.formats if checked is not None else None
        derived = negotiation.derive_checked_requirements(expanded, formats)
        requirements = negotiation.relabel(derived, origins)
        decision = negotiation.judge(
            declaration, requirements, request.options.allow_unknown, expanded.options.model
        )
        # An equal decision judged before brings its kept line and proto (call_caches.py).
        return self.caches.shared_decision(decision), schema, expanded, checked

    def _check_settings(self, shortname: str, request: CallRequest) -> None:
        """Refuse setting values the adapter's own pure rules reject (InvalidRequest), before judging.

        An adapter with typed settings (openai) states its rules as
        `setting_problems(options, tool_names)`; one without them leaves the
        values to its edge. The tools are those the model would be offered;
        None while MCP servers (listed only once they run) may add some.
        """
        check = getattr(self.registry.get(shortname).adapter, "setting_problems", None)
        if check is None:
            return
        options = request.options
        tool_names: list[str] | None = None
        if not options.mcp_servers:
            specs = request.tools
            if options.tool_filter is not None:
                specs = visible_tools(specs, options.tool_filter)
            tool_names = [spec.name for spec in specs]
        problems = check(options, tool_names)
        if problems:
            raise InvalidRequest(problems)

    async def _run(
        self, adapter: Adapter, shortname: str, kind: CallKind, adapter_call: AdapterCall
    ) -> AdapterReply:
        time_budget = adapter_call.time_budget
        if time_budget is not None and time_budget <= 0:
            raise AdapterTimeout(shortname, f"deadline of {time_budget:g}s exceeded before dispatch")
        method = adapter.produce if kind is _PRODUCE else adapter.invoke
        if time_budget is None:
            # No deadline to enforce: no timer and none of its bookkeeping.
            try:
                reply = await method(adapter_call)
            except NegotiatorError:
                raise
            except Exception as exc:  # a TimeoutError too: only our own deadline is a timeout
                raise AdapterInternal(shortname, f"{type(exc).__name__}: {exc}") from exc
        else:
            reply = await _within(time_budget, shortname, method, adapter_call)
        if not isinstance(reply, AdapterReply):
            raise AdapterInternal(shortname, f"returned {type(reply).__name__}, not an AdapterReply")
        return reply

    def _log_decision(self, operation: str, decision: Decision, request: CallRequest) -> None:
        sink = self._decision_sink
        if sink is None and not self._logger.isEnabledFor(logging.INFO):
            return
        allow_unknown = request.options.allow_unknown
        # A kept judgement hands out the same decision object call after call,
        # and with it the same line (call_caches.py).
        details = (operation, frozenset(allow_unknown))
        lines = self.caches.decision_lines
        line = lines.get((decision,), details, None)
        if line is None:
            line = decision_line(operation, decision, details[1])
            lines.put((decision,), details, line)
        if sink is not None:
            sink(line)
        else:
            self._logger.info(line)


class _Expiry:
    """The timer of one adapter call's deadline: when it fires, the call's task is cancelled."""

    __slots__ = ("fired", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.fired = False

    def fire(self) -> None:
        self.fired = True
        self.task.cancel()


async def _within(
    seconds: float,
    shortname: str,
    method: Callable[[AdapterCall], Awaitable[AdapterReply]],
    call: AdapterCall,
) -> AdapterReply:
    """`method(call)` awaited for at most `seconds`, its failures mapped as `Broker._run` says.

    What `async with asyncio.timeout(seconds)` around it does, with one timer
    and no context manager: when the timer fires the task is cancelled; the
    cancellation that timer caused (no other pending: `Task.uncancel`) becomes
    AdapterTimeout, as does a TimeoutError raised after it fired, and a reply
    that arrives although the timer fired (the adapter swallowed the
    cancellation). A TimeoutError the adapter raised by itself before then is
    an unmapped adapter failure; a cancellation from anyone else passes on.
    """
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("an adapter call's deadline needs a task")
    cancelling = task.cancelling()
    loop = asyncio.get_running_loop()
    expiry = _Expiry(task)
    timer = loop.call_at(loop.time() + seconds, expiry.fire)
    exceeded = f"deadline of {seconds:g}s exceeded"
    try:
        reply = await method(call)
    except asyncio.CancelledError as exc:
        timer.cancel()
        if expiry.fired and task.uncancel() <= cancelling:
            raise AdapterTimeout(shortname, exceeded) from exc
        raise
    except NegotiatorError:
        timer.cancel()
        if expiry.fired:
            task.uncancel()
        raise
    except Exception as exc:
        timer.cancel()
        if expiry.fired:
            task.uncancel()
            if isinstance(exc, TimeoutError):
                raise AdapterTimeout(shortname, exceeded) from exc
        raise AdapterInternal(shortname, f"{type(exc).__name__}: {exc}") from exc
    timer.cancel()
    if expiry.fired:
        task.uncancel()
        raise AdapterTimeout(shortname, exceeded)
    return reply


def decision_line(operation: str, decision: Decision, allow_unknown: frozenset[Capability]) -> str:
    """`json.dumps(decision_record(...))`, written out: the same text, built without the record.

    Every string goes through the encoder `json.dumps` applies to strings
    (ASCII only, escaped alike); states, outcomes and booleans are fixed
    ASCII words, written as they are.
    """
    requirements: list[str] = []
    verdicts: list[str] = []
    allowed: list[str] = []
    for verdict in decision.verdicts:
        requirement = verdict.requirement
        name = _json_text(requirement.describe())
        requirements.append(
            f'{{"requirement": {name}, "request_field": {_json_text(requirement.request_field)}}}'
        )
        flag = "true" if verdict.allowed_unknown else "false"
        verdicts.append(
            f'{{"requirement": {name}, "state": "{verdict.state._value_}", "allowed_unknown": {flag}}}'
        )
        if verdict.allowed_unknown:
            capability = _json_text(requirement.capability._value_)
            if capability not in allowed:
                allowed.append(capability)
    gaps = ", ".join([_json_text(verdict.requirement.describe()) for verdict in decision.gaps])
    requested = ", ".join([_json_text(value) for value in sorted(c._value_ for c in allow_unknown)])
    outcome = "accepted" if decision.accepted else "refused"
    return (
        f'{{"event": "negotiator.decision", "operation": {_json_text(operation)}, '
        f'"adapter": {_json_text(decision.adapter)}, '
        f'"declaration_version": {_json_text(decision.declaration_version)}, "outcome": "{outcome}", '
        f'"requirements": [{", ".join(requirements)}], "verdicts": [{", ".join(verdicts)}], '
        f'"gaps": [{gaps}], "allowed_unknown": [{", ".join(allowed)}], '
        f'"allow_unknown_requested": [{requested}]}}'
    )


def decision_record(
    operation: str, decision: Decision, allow_unknown: frozenset[Capability]
) -> dict[str, JsonValue]:
    """The `negotiator.decision` log record of one judged call."""
    allowed: list[str] = []
    for verdict in decision.allowed_unknowns:
        if verdict.requirement.capability.value not in allowed:
            allowed.append(verdict.requirement.capability.value)
    record: dict[str, JsonValue] = {
        "event": "negotiator.decision",
        "operation": operation,
        "adapter": decision.adapter,
        "declaration_version": decision.declaration_version,
        "outcome": "accepted" if decision.accepted else "refused",
        "requirements": [
            {"requirement": v.requirement.describe(), "request_field": v.requirement.request_field}
            for v in decision.verdicts
        ],
        "verdicts": [
            {
                "requirement": v.requirement.describe(),
                "state": v.state.value,
                "allowed_unknown": v.allowed_unknown,
            }
            for v in decision.verdicts
        ],
        "gaps": [v.requirement.describe() for v in decision.gaps],
        # Capabilities the caller let through although the declaration is silent on them.
        "allowed_unknown": allowed,
        "allow_unknown_requested": sorted(c.value for c in allow_unknown),
    }
    return record


class _AuditDraft:
    """The audit record of one call, filled in as the call goes and emitted once when it ends."""

    __slots__ = (
        "_caller",
        "_delegation_depth",
        "_log",
        "_operation",
        "_request",
        "decision",
        "tool_log",
        "usage",
    )

    def __init__(
        self, broker: Broker, operation: str, caller: str, request: CallRequest, *, delegation_depth: int
    ) -> None:
        self._log = broker.audit
        self._operation = operation
        self._caller = caller
        self._request = request
        self._delegation_depth = delegation_depth
        self.decision: Decision | None = None  # set once the call was judged
        self.usage: Usage | None = None  # set once the adapter returned a reply with usage
        self.tool_log: ToolCallLog | None = None  # set once the call is about to be dispatched

    def ended(self, error: BaseException, *, dispatched: bool) -> None:
        """Emit the record of a call that raised `error`."""
        if isinstance(error, NegotiatorError):
            # A taxonomy error before dispatch is a refusal: no adapter code ran.
            self.emit(AuditOutcome.FAILED if dispatched else AuditOutcome.REFUSED, error.reason)
        elif isinstance(error, Exception):
            self.emit(AuditOutcome.FAILED, "INTERNAL")
        else:  # CancelledError: the caller went away
            self.emit(AuditOutcome.FAILED, "CANCELLED")

    def emit(self, outcome: AuditOutcome, error_reason: str = "") -> None:
        if not self._log.listening:
            return  # nobody would see the record: do not build it
        request, decision = self._request, self.decision
        named = request.adapter or request.agent or ""
        self._log.emit(
            AuditRecord(
                time=datetime.now(UTC),
                caller=self._caller,
                operation=self._operation,
                outcome=outcome,
                adapter=decision.adapter if decision is not None else named,
                declaration_version=decision.declaration_version if decision is not None else "",
                verdicts=decision.verdicts if decision is not None else (),
                error_reason=error_reason,
                conversation_id=request.options.conversation_id or "",
                delegation_depth=self._delegation_depth,
                usage=self.usage,
                tool_calls=self.tool_log.records if self.tool_log is not None else (),
            )
        )


def check_output(adapter: str, schema: Mapping[str, Any], text: str) -> Any:
    """Parse and validate Produce output; raise OutputSchemaViolation listing every error."""
    instance = _output_instance(adapter, text)
    try:
        validator = negotiation.schema_validator(schema)
    except jsonschema_rs.ValidationError as exc:
        raise _not_applicable(exc) from exc
    return _validated(adapter, validator, instance)


def check_checked_output(adapter: str, checked: CheckedSchema, text: str) -> Any:
    """`check_output` against a schema checked and compiled before dispatch (CheckedSchema.compiled)."""
    instance = _output_instance(adapter, text)
    return _validated(adapter, checked.validator(), instance)


def _output_instance(adapter: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise OutputSchemaViolation(adapter, [("", f"output is not valid JSON: {exc}")]) from exc
    except (RecursionError, ValueError) as exc:  # nested past the parser, or an integer past int()
        raise OutputSchemaViolation(
            adapter, [("", "output is not JSON this negotiator reads: too deep or too long a number")]
        ) from exc


def _not_applicable(error: jsonschema_rs.ValidationError) -> InvalidRequest:
    # validate_request checks the schema and resolves every $ref up front; this is the backstop.
    return InvalidRequest([("output_schema", f"cannot be applied: {error.message}")])


def _validated(adapter: str, validator: jsonschema_rs.Validator, instance: Any) -> Any:
    violations = negotiation.schema_violations(validator, instance)
    if violations:
        raise OutputSchemaViolation(adapter, violations)
    return instance
