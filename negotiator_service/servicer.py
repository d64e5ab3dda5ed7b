"""NegotiatorService over grpc.aio: converts protos, calls the Broker or the registry.

Each method converts the request, calls the core and converts the answer
back; its errors leave through one decorator per method shape
(agentsidecar.sidecar_runtime.rpcerrors) with the status table `status.ERRORS`: the
taxonomy's statuses, INTERNAL for anything else, never UNKNOWN. A timeout of
the budget the sidecar's default deadline gave is DEFAULT_TIMEOUT_EXCEEDED.

Brokered calls carry the caller's clock and place in a delegation chain:
- `time_budget` is `context.time_remaining()` minus a small margin (so the
  adapter's answer can still travel back before the caller gives up), or None
  when the caller set no deadline;
- `delegation_depth` comes from the request metadata `x-delegation-depth`
  (a non-negative integer, 0 when absent; the largest value wins if repeated).
When a client cancels, grpc.aio cancels the handler task, and with it the
broker's await on the adapter, so the adapter sees CancelledError.

Calls naming `options.conversation_id` run through `conversations.ConversationManager`:
one at a time per conversation, at max(incoming, stored) delegation depth,
with the adapter state committed only when the whole call succeeded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Collection, Iterator
from dataclasses import replace
from typing import Any, Generic, TypeVar

import grpc

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from agentsidecar.negotiator_service import convert, tools
from agentsidecar.negotiator_service.bootstrap import Bootstrapper
from agentsidecar.negotiator_service.broker import Broker
from agentsidecar.negotiator_service.conversations import (
    ConversationManager,
    Turn,
    new_conversation_id,
    owner_of,
)
from agentsidecar.negotiator_service.errors import (
    AdapterTargetNotAllowed,
    AdapterTimeout,
    InvalidRequest,
    NegotiatorError,
    ReplyTooLarge,
    SeedCommandTimeout,
    ShuttingDown,
)
from agentsidecar.negotiator_service.model import (
    Adapter,
    AdapterReply,
    AuditRecord,
    CallKind,
    CallRequest,
    Decision,
    JsonValue,
    StreamDelta,
    StreamEvent,
    ToolBox,
)
from agentsidecar.negotiator_service.prober import Prober
from agentsidecar.negotiator_service.registrations import RuntimeRegistrations
from agentsidecar.negotiator_service.registry import AdapterRegistry, Change, RegisteredAdapter
from agentsidecar.negotiator_service.status import ERRORS
from agentsidecar.negotiator_service.tools import CallerMessage, StartMessage
from agentsidecar.sidecar_runtime.addresses import Address
from agentsidecar.sidecar_runtime.auth import bearer_values, is_loopback, require_token
from agentsidecar.sidecar_runtime.handlers import call_metadata
from agentsidecar.sidecar_runtime.limits import default_timeout_exceeded, default_timeout_of
from agentsidecar.sidecar_runtime.richstatus import RichError
from agentsidecar.sidecar_runtime.rpcerrors import stream_stream, unary_stream, unary_unary

SERVICE_NAME = "agentsidecar.negotiator.v1.NegotiatorService"
DELEGATION_DEPTH_KEY = "x-delegation-depth"
# Time kept back from the caller's deadline for the reply's trip home.
DEFAULT_DEADLINE_MARGIN_SECONDS = 0.02

ConnectRemote = Callable[[str, str], Awaitable[Adapter]]  # (target, expected shortname or "")
Context = grpc.aio.ServicerContext[Any, Any]

_LOGGER = logging.getLogger("agentsidecar.negotiator_service.servicer")


def _default_timeout(
    servicer: NegotiatorServicer, error: NegotiatorError, context: Context
) -> RichError | None:
    return servicer._default_timeout_error(context, error)


# Every method's errors leave through the status table (status.ERRORS), one decorator per shape.
_unary = unary_unary(ERRORS, refine=_default_timeout)
_server_stream = unary_stream(ERRORS, refine=_default_timeout)
_bidi = stream_stream(ERRORS, refine=_default_timeout)


class NegotiatorServicer(negotiator_pb2_grpc.NegotiatorServiceServicer):
    def __init__(
        self,
        broker: Broker,
        registry: AdapterRegistry,
        connect_remote: ConnectRemote,
        conversations: ConversationManager,
        *,
        deadline_margin: float = DEFAULT_DEADLINE_MARGIN_SECONDS,
        logger: logging.Logger | None = None,
        bootstrapper: Bootstrapper | None = None,
        client_certificates: bool = True,
        adapter_hosts: Collection[str] = (),
        max_reply_bytes: int | None = None,
        bind_conversations: bool = False,
        registrations: RuntimeRegistrations | None = None,
        prober: Prober | None = None,
    ) -> None:
        """`conversations` runs the calls that name a conversation (server.py builds its store).

        `bootstrapper` serves Bootstrap (default: one without a seedstore, which refuses every request).

        `client_certificates` False says no listener asks callers for a TLS
        client certificate (no mutual TLS), so callers are named by their
        peer address without reading the call's auth context (grpc.aio
        builds it afresh on every read, at more cost than a dry run's
        judgement).

        `max_reply_bytes` is the largest message the server sends (None: no
        check); a Produce/Invoke/ToolSession reply over it fails with
        ReplyTooLarge before its conversation commits.

        `bind_conversations` (set when bearer tokens are configured) keys
        each conversation by the token of the calls that use it, so a caller
        with another token never reaches it (conversations.owner_of).

        `adapter_hosts` are the TCP hosts RegisterAdapter may reach besides
        Unix sockets and loopback ("*": any host); see `check_adapter_target`.

        `registrations` adds and removes runtime adapters in `registry` (default:
        in memory only; the server's keeps them in the state directory).

        `prober` serves ProbeAdapter (default: one over `registry` with no schedule).
        """
        self._broker = broker
        # Convert with the broker's call caches, so like calls share their options object.
        self._calls = broker.caches
        self._bootstrapper = bootstrapper or Bootstrapper(None, audit=broker.audit)
        self._conversations = conversations
        self._registry = registry
        self._registrations = registrations or RuntimeRegistrations(registry)
        self._prober = prober or Prober(registry)
        self._connect_remote = connect_remote
        self._deadline_margin = deadline_margin
        self._logger = logger or _LOGGER
        self._closing = asyncio.Event()
        self._client_certificates = client_certificates
        self._adapter_hosts = frozenset(normal_host(host) for host in adapter_hosts)
        self._max_reply_bytes = max_reply_bytes
        self._bind_conversations = bind_conversations

    def begin_shutdown(self) -> None:
        """End every open WatchAdapters stream (UNAVAILABLE: watch again elsewhere).

        Called before the server drains, because a watch never ends by itself
        and would otherwise hold shutdown for the whole grace period.
        """
        self._closing.set()

    # -- adapters --------------------------------------------------------

    @_unary
    async def ListAdapters(
        self, request: negotiator_pb2.ListAdaptersRequest, context: Context
    ) -> negotiator_pb2.ListAdaptersResponse:
        size = _page_size(request.page_size)
        after = _page_start(request.page_token)
        return _adapters_page([entry for entry in self._registry.list() if entry.shortname > after], size)

    @_unary
    async def GetAdapter(
        self, request: negotiator_pb2.GetAdapterRequest, context: Context
    ) -> negotiator_pb2.GetAdapterResponse:
        entry = self._registry.get(_required_shortname(request.shortname))
        return negotiator_pb2.GetAdapterResponse(adapter=convert.adapter_to_proto(entry))

    @_server_stream
    async def WatchAdapters(
        self, request: negotiator_pb2.WatchAdaptersRequest, context: Context
    ) -> AsyncIterator[negotiator_pb2.WatchAdaptersResponse]:
        changes = self._registry.watch()
        closing = asyncio.ensure_future(self._closing.wait())
        next_change: asyncio.Future[tuple[Change, RegisteredAdapter]] | None = None
        try:
            while True:
                next_change = asyncio.ensure_future(anext(changes))
                await asyncio.wait({next_change, closing}, return_when=asyncio.FIRST_COMPLETED)
                if not next_change.done():
                    raise ShuttingDown()
                try:
                    change, entry = next_change.result()
                except StopAsyncIteration:  # the registry closed
                    raise ShuttingDown() from None
                yield convert.watch_response(change, entry)
        finally:
            closing.cancel()
            if next_change is not None and not next_change.done():
                next_change.cancel()
                await asyncio.wait({next_change})  # let the generator unwind before closing it
            if isinstance(changes, AsyncGenerator):
                await changes.aclose()

    @_unary
    async def RegisterAdapter(
        self, request: negotiator_pb2.RegisterAdapterRequest, context: Context
    ) -> negotiator_pb2.RegisterAdapterResponse:
        registration = convert.register_adapter_request(request)
        target = registration.address.target
        check_adapter_target(registration.address, self._adapter_hosts)
        adapter = await self._connect_remote(target, registration.shortname)
        entry = RegisteredAdapter(adapter=adapter, source="runtime", target=target)
        try:
            await self._registrations.register(entry)
        except BaseException:
            await adapter.close()
            raise
        self._logger.info("registered remote adapter %s at %s", entry.shortname, target)
        return negotiator_pb2.RegisterAdapterResponse(adapter=convert.adapter_to_proto(entry))

    @_unary
    async def DeregisterAdapter(
        self, request: negotiator_pb2.DeregisterAdapterRequest, context: Context
    ) -> negotiator_pb2.DeregisterAdapterResponse:
        entry = await self._registrations.deregister(_required_shortname(request.shortname))
        response = negotiator_pb2.DeregisterAdapterResponse(adapter=convert.adapter_to_proto(entry))
        await entry.adapter.close()
        self._logger.info("deregistered adapter %s", entry.shortname)
        return response

    @_unary
    async def ProbeAdapter(
        self, request: negotiator_pb2.ProbeAdapterRequest, context: Context
    ) -> negotiator_pb2.ProbeAdapterResponse:
        shortname = _required_shortname(request.shortname)
        model = convert.probe_model(request)
        entry, evidence = await self._prober.probe(shortname, model)
        verdicts = ", ".join(f"{e.kind.value}={e.verdict.value}" for e in evidence)
        self._logger.info("probed adapter %s: %s", shortname, verdicts)
        return negotiator_pb2.ProbeAdapterResponse(
            adapter=convert.adapter_to_proto(entry),
            evidence=[convert.probe_evidence_to_proto(item) for item in evidence],
        )

    # -- calls -----------------------------------------------------------

    @_unary
    async def Negotiate(
        self, request: negotiator_pb2.NegotiateRequest, context: Context
    ) -> negotiator_pb2.NegotiateResponse:
        # The call is nested in the request: its field paths are pointed at from the top
        # (`_prefixed`, spelled out: a generator context manager per call costs more than the call).
        try:
            call = with_conversation_id(self._calls.negotiate_request(request))
            decision = self._broker.negotiate(call, caller=self._caller(context))
        except InvalidRequest as error:
            field = request.WhichOneof("call")
            if field is None:
                raise
            raise InvalidRequest([(f"{field}.{f}", d) for f, d in error.violations]) from error
        return self._calls.negotiate_response(decision)

    @_unary
    async def Produce(
        self, request: negotiator_pb2.ProduceRequest, context: Context
    ) -> negotiator_pb2.ProduceResponse:
        call = with_conversation_id(self._calls.produce_request(request))
        return await self._brokered(call, context, self._calls.produce_response)

    @_unary
    async def Invoke(
        self, request: negotiator_pb2.InvokeRequest, context: Context
    ) -> negotiator_pb2.InvokeResponse:
        call = with_conversation_id(self._calls.invoke_request(request))
        return await self._brokered(call, context, self._calls.invoke_response)

    # grpc.aio serves a server-streaming method that writes with `context.write` and returns None;
    # the generated stub types only the generator form.
    @_server_stream
    async def ProduceStream(  # type: ignore[override]
        self, request: negotiator_pb2.ProduceStreamRequest, context: Context
    ) -> None:
        with _nested("produce", request.HasField("produce")):
            call = with_conversation_id(self._calls.produce_request(request.produce))
            await self._streamed(
                call, context, self._calls.produce_response, negotiator_pb2.ProduceStreamResponse
            )

    @_server_stream
    async def InvokeStream(  # type: ignore[override]
        self, request: negotiator_pb2.InvokeStreamRequest, context: Context
    ) -> None:
        with _nested("invoke", request.HasField("invoke")):
            call = with_conversation_id(self._calls.invoke_request(request.invoke))
            await self._streamed(
                call, context, self._calls.invoke_response, negotiator_pb2.InvokeStreamResponse
            )

    @_bidi
    async def ToolSession(
        self, request_iterator: AsyncIterator[negotiator_pb2.ToolSessionRequest], context: Context
    ) -> AsyncIterator[negotiator_pb2.ToolSessionResponse]:
        """A Produce/Invoke whose tools live in the caller; the session itself is tools.run_session.

        A streamed session (`start.stream`) runs through the broker's stream,
        handing the decision, deltas and events to the session as they come;
        the session cancels this work (closing the adapter's stream) when the
        caller goes away.
        """
        delegation_depth = _delegation_depth(context)

        async def dispatch(
            call: CallRequest, toolbox: ToolBox | None, emit: tools.Emit | None
        ) -> tuple[AdapterReply, Decision]:
            # The final message wraps the response: its tag and length prefix.
            sized: _SizedReply[Any] = (
                _sized(convert.produce_response, call, self._max_reply_bytes, _FIELD_FRAMING_BYTES)
                if call.kind is CallKind.PRODUCE
                else _sized(convert.invoke_response, call, self._max_reply_bytes, _FIELD_FRAMING_BYTES)
            )

            def turn_dispatch(turn: Turn) -> Awaitable[tuple[AdapterReply, Decision]]:
                if emit is not None:
                    return streamed_turn(turn, emit)
                return self._broker.call(
                    call,
                    time_budget=self._time_budget(context),
                    delegation_depth=turn.delegation_depth,
                    conversation_state=turn.state,
                    tools=toolbox,
                    caller=self._caller(context),
                    audit_operation="tool_session",
                    check_reply=sized.check,
                )

            async def streamed_turn(turn: Turn, emit: tools.Emit) -> tuple[AdapterReply, Decision]:
                stream = self._broker.stream(
                    call,
                    time_budget=self._time_budget(context),
                    delegation_depth=turn.delegation_depth,
                    conversation_state=turn.state,
                    tools=toolbox,
                    caller=self._caller(context),
                    audit_operation="tool_session",
                    check_reply=sized.check,
                )
                decision: Decision | None = None
                reply: AdapterReply | None = None
                # Closed with this task: the adapter's upstream must not outlive the session.
                async with contextlib.aclosing(stream):
                    async for item in stream:
                        if isinstance(item, AdapterReply):
                            reply = item
                            continue
                        if isinstance(item, Decision):
                            decision = item
                        emit(item)
                assert reply is not None  # the broker's stream ends with the reply or raises
                assert decision is not None
                return reply, decision

            refused = self._conversation_refused("tool_session", call, context, delegation_depth)
            try:
                return await self._conversations.run(
                    call, delegation_depth, turn_dispatch, refused=refused, owner=self._owner(context)
                )
            except InvalidRequest as error:
                # The broker's own checks (setting values) name fields of the call inside `start`.
                which = f"start.{call.kind.value}"
                raise InvalidRequest([(f"{which}.{f}", d) for f, d in error.violations]) from error

        incoming = (
            _with_generated_id(convert.tool_session_request(message)) async for message in request_iterator
        )
        async for message in tools.run_session(incoming, dispatch):
            yield convert.tool_session_response(message)

    # -- audit and capability bootstrap -----------------------------------

    @_server_stream
    async def WatchAudit(
        self, request: negotiator_pb2.WatchAuditRequest, context: Context
    ) -> AsyncIterator[negotiator_pb2.WatchAuditResponse]:
        """Every audit record from now on, as the broker emits it.

        Initial metadata is sent once the watch is registered, so a caller
        that awaits it misses no later decision. A watcher that falls behind
        its buffer ends with AUDIT_WATCHER_DROPPED; shutdown ends it with
        UNAVAILABLE, as WatchAdapters.
        """
        subscription = self._broker.audit.subscribe()
        closing = asyncio.ensure_future(self._closing.wait())
        next_record: asyncio.Future[AuditRecord] | None = None
        try:
            await context.send_initial_metadata(())
            while True:
                next_record = asyncio.ensure_future(subscription.next())
                await asyncio.wait({next_record, closing}, return_when=asyncio.FIRST_COMPLETED)
                if not next_record.done():
                    raise ShuttingDown()
                try:
                    # AuditWatcherDropped when this watcher fell behind its buffer.
                    record = next_record.result()
                except StopAsyncIteration:  # the audit log closed: the server is stopping
                    raise ShuttingDown() from None
                yield convert.watch_audit_response(record)
        finally:
            closing.cancel()
            if next_record is not None and not next_record.done():
                next_record.cancel()
            subscription.close()

    @_unary
    async def Bootstrap(
        self, request: negotiator_pb2.BootstrapRequest, context: Context
    ) -> negotiator_pb2.BootstrapResponse:
        """Seeds for a capability, and a gated run of one; the rules are bootstrap.py's."""
        if request.run:
            # The token layer leaves Bootstrap open with --open-reads; a run executes a command.
            await require_token(context, "with `run` set")
        result = await self._bootstrapper.bootstrap(
            convert.bootstrap_request(request),
            time_budget=self._time_budget(context),
            caller=self._caller(context),
            delegation_depth=_delegation_depth(context),
        )
        return convert.bootstrap_response(result)

    # -- plumbing --------------------------------------------------------

    async def _brokered(
        self, call: CallRequest, context: Context, respond: Callable[[AdapterReply, Decision], _Message]
    ) -> _Message:
        """A Produce/Invoke through the broker, as a conversation turn when it names a conversation.

        The response is built, and its size checked, inside the broker call,
        before the conversation commits: a reply too large to send fails the
        call whole.
        """
        sized = _sized(respond, call, self._max_reply_bytes, bound=self._calls.reply_size_bound)
        depth = _delegation_depth(context)
        if call.options.conversation_id is None:
            # What the conversation manager does with such a call, without its turn and callbacks.
            await self._broker_call(call, context, depth, None, sized.check)
            return sized.message()

        def dispatch(turn: Turn) -> Awaitable[tuple[AdapterReply, Decision]]:
            # The budget is read only now: waiting for a busy conversation spends it.
            return self._broker_call(call, context, turn.delegation_depth, turn.state, sized.check)

        refused = self._conversation_refused(call.kind.value, call, context, depth)
        await self._conversations.run(call, depth, dispatch, refused=refused, owner=self._owner(context))
        return sized.message()

    async def _streamed(
        self,
        call: CallRequest,
        context: Context,
        respond: Callable[[AdapterReply, Decision], _Message],
        wrap: Callable[..., Any],
    ) -> None:
        """A ProduceStream/InvokeStream: the broker's stream written as it comes, the final message last.

        The handler writes rather than yields, so a caller's cancellation
        lands inside the broker's stream, which closes the adapter's
        upstream before the handler ends. The final message is built and its
        size checked inside the broker stream, and sent only after the
        conversation (if any) committed, as for the unary calls.
        """
        sized = _sized(
            respond, call, self._max_reply_bytes, _FIELD_FRAMING_BYTES, bound=self._calls.reply_size_bound
        )
        depth = _delegation_depth(context)

        async def dispatch(turn: Turn) -> tuple[AdapterReply, Decision]:
            stream = self._broker.stream(
                call,
                time_budget=self._time_budget(context),
                delegation_depth=turn.delegation_depth,
                conversation_state=turn.state,
                caller=self._caller(context),
                check_reply=sized.check,
            )
            decision: Decision | None = None
            reply: AdapterReply | None = None
            # The decision is written while the adapter starts its upstream work, so the first
            # delta waits for that write only if it arrives before the write completes.
            sending: asyncio.Future[None] | None = None
            try:
                async with contextlib.aclosing(stream):
                    async for item in stream:
                        if isinstance(item, Decision):
                            decision = item
                            sending = asyncio.ensure_future(
                                context.write(wrap(decision=convert.decision_to_proto(item)))
                            )
                            continue
                        if sending is not None:
                            await sending
                            sending = None
                        if isinstance(item, StreamDelta):
                            await context.write(wrap(delta=item.text))
                        elif isinstance(item, StreamEvent):
                            await context.write(
                                wrap(event=negotiator_pb2.StreamEvent(type=item.type, text=item.text))
                            )
                        else:
                            reply = item
            finally:
                if sending is not None:
                    # Sent before any error status; a write that failed (the caller left) says no more.
                    await asyncio.wait({sending})
                    if not sending.cancelled():
                        sending.exception()
            assert reply is not None
            assert decision is not None
            return reply, decision

        if call.options.conversation_id is None:
            await dispatch(Turn(None, None, depth))
        else:
            refused = self._conversation_refused(call.kind.value, call, context, depth)
            await self._conversations.run(call, depth, dispatch, refused=refused, owner=self._owner(context))
        await context.write(wrap(final=sized.message()))

    def _owner(self, context: Context) -> str:
        """Whose conversations a call reaches: with tokens configured, its bearer token's."""
        if not self._bind_conversations:
            return ""
        tokens = bearer_values(call_metadata(context))
        return owner_of(tokens[0] if tokens else None)

    def _broker_call(
        self,
        call: CallRequest,
        context: Context,
        delegation_depth: int,
        conversation_state: JsonValue,
        check_reply: Callable[[AdapterReply, Decision], None],
    ) -> Awaitable[tuple[AdapterReply, Decision]]:
        return self._broker.call(
            call,
            time_budget=self._time_budget(context),
            delegation_depth=delegation_depth,
            conversation_state=conversation_state,
            caller=self._caller(context),
            check_reply=check_reply,
        )

    def _conversation_refused(
        self, operation: str, call: CallRequest, context: Context, delegation_depth: int
    ) -> Callable[[NegotiatorError], None]:
        """Audits a call its conversation refused before the broker saw it (busy, pinned, bound)."""

        def refused(error: NegotiatorError) -> None:
            self._broker.audit_refusal(
                operation, call, error, caller=self._caller(context), delegation_depth=delegation_depth
            )

        return refused

    def _caller(self, context: Context) -> str:
        if self._client_certificates:
            return caller_identity(context)
        return peer_identity(context)

    def _time_budget(self, context: Context) -> float | None:
        remaining: float | None = context.time_remaining()
        if remaining is None:
            return None
        return max(remaining - self._deadline_margin, 0.0)

    def _default_timeout_error(self, context: Context, error: NegotiatorError) -> RichError | None:
        """DEFAULT_TIMEOUT_EXCEEDED for a timeout of the budget the sidecar's default deadline gave.

        The budget ends `deadline_margin` before the deadline, so once it is
        spent no more than the margin remains; a timeout with more time left
        is the adapter's own limit, and keeps its reason.
        """
        if not isinstance(error, AdapterTimeout | SeedCommandTimeout):
            return None
        seconds = default_timeout_of(context)
        if seconds is None or context.time_remaining() > self._deadline_margin:
            return None
        return default_timeout_exceeded(seconds)


ANY_HOST = "*"
# ListAdapters paging (AIP-158): page_size 0 is the default, larger than the maximum is the maximum.
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
# A page stops before this many bytes of adapters (always holding at least
# one; a remote declaration is at most 64 KiB).
LIST_PAGE_BYTES = 1024 * 1024
_TOKEN_PREFIX = b"after:"


def _page_size(requested: int) -> int:
    if requested < 0:
        raise InvalidRequest([("page_size", f"must not be negative, got {requested}")])
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def _adapters_page(entries: list[RegisteredAdapter], size: int) -> negotiator_pb2.ListAdaptersResponse:
    """A ListAdapters page: up to `size` of `entries` within LIST_PAGE_BYTES, and the token after it."""
    response = negotiator_pb2.ListAdaptersResponse()
    budget = LIST_PAGE_BYTES
    for entry in entries[:size]:
        adapter = convert.adapter_to_proto(entry)
        cost = adapter.ByteSize() + _FIELD_FRAMING_BYTES
        if response.adapters and cost > budget:
            break
        response.adapters.append(adapter)
        budget -= cost
    if len(response.adapters) < len(entries):
        response.next_page_token = _page_token(response.adapters[-1].declaration.shortname)
    return response


def _page_token(last_shortname: str) -> str:
    """An opaque token resuming after `last_shortname`."""
    return base64.urlsafe_b64encode(_TOKEN_PREFIX + last_shortname.encode()).decode()


def _page_start(token: str) -> str:
    """The shortname a page token resumes after ("" for the first page)."""
    if not token:
        return ""
    try:
        raw = base64.urlsafe_b64decode(token.encode("ascii"))
        if not raw.startswith(_TOKEN_PREFIX):
            raise ValueError("no prefix")
        return raw.removeprefix(_TOKEN_PREFIX).decode()
    except ValueError:  # binascii.Error, UnicodeError
        raise InvalidRequest([("page_token", "is not a next_page_token this negotiator returned")]) from None


def with_conversation_id(call: CallRequest) -> CallRequest:
    """`call` with a generated conversation id when it asked for one (generate_conversation_id)."""
    options = call.options
    if not options.generate_conversation_id:
        return call
    if options.conversation_id is not None:
        raise InvalidRequest(
            [("options.generate_conversation_id", "set either it or options.conversation_id, not both")]
        )
    generated = replace(options, conversation_id=new_conversation_id(), generate_conversation_id=False)
    return replace(call, options=generated)


def _with_generated_id(message: CallerMessage) -> CallerMessage:
    if isinstance(message, StartMessage):
        try:
            return replace(message, call=with_conversation_id(message.call))
        except InvalidRequest as error:
            prefix = message.call_field
            raise InvalidRequest([(f"{prefix}.{f}", d) for f, d in error.violations]) from error
    return message


# At least the size of the response `convert` builds from a reply, its decision and conversation id
# (CallCaches.reply_size_bound).
SizeBound = Callable[[AdapterReply, Decision, str | None], int]


def _sized(
    respond: Callable[[AdapterReply, Decision], _Message],
    call: CallRequest,
    limit: int | None,
    framing: int = 0,
    *,
    bound: SizeBound | None = None,
) -> _SizedReply[_Message]:
    """The response builder of `call`: its size checked, its conversation id (if any) set.

    `bound`, for a `respond` that is convert's Produce or Invoke response: a reply
    whose bound fits the limit is not measured.
    """
    conversation_id = call.options.conversation_id
    if conversation_id is not None:
        respond = _naming_conversation(respond, conversation_id)
    return _SizedReply(respond, limit, framing=framing, bound=bound, conversation_id=conversation_id)


def _naming_conversation(
    respond: Callable[[AdapterReply, Decision], _Message], conversation_id: str
) -> Callable[[AdapterReply, Decision], _Message]:
    def named(reply: AdapterReply, decision: Decision) -> _Message:
        message = respond(reply, decision)
        message.conversation_id = conversation_id
        return message

    return named


# A message field's tag and length prefix, at most: one byte of tag, five of length.
_FIELD_FRAMING_BYTES = 6
_Message = TypeVar("_Message", negotiator_pb2.ProduceResponse, negotiator_pb2.InvokeResponse)


class _SizedReply(Generic[_Message]):
    """Builds a call's response from the broker's reply, refusing one larger than the server sends."""

    __slots__ = ("_bound", "_built", "_conversation_id", "_framing", "_limit", "_respond")

    def __init__(
        self,
        respond: Callable[[AdapterReply, Decision], _Message],
        limit: int | None,
        *,
        framing: int = 0,
        bound: SizeBound | None = None,
        conversation_id: str | None = None,
    ) -> None:
        self._respond: Callable[[AdapterReply, Decision], _Message] = respond
        self._limit = limit
        self._framing = framing
        self._bound = bound
        self._conversation_id = conversation_id
        self._built: _Message | None = None

    def check(self, reply: AdapterReply, decision: Decision) -> None:
        message = self._respond(reply, decision)
        limit = self._limit
        if limit is not None and (
            self._bound is None or self._bound(reply, decision, self._conversation_id) + self._framing > limit
        ):
            size = message.ByteSize() + self._framing
            if size > limit:
                raise ReplyTooLarge(decision.adapter, size, limit)
        self._built = message

    def message(self) -> _Message:
        assert self._built is not None  # the broker ran `check` before returning
        return self._built


def normal_host(host: str) -> str:
    """A host as `check_adapter_target` compares it: lower case, IPv6 without brackets."""
    return host.strip().strip("[]").lower()


def check_adapter_target(address: Address, allowed_hosts: Collection[str]) -> None:
    """Raise AdapterTargetNotAllowed unless a runtime registration may connect to `address`.

    A Unix socket and a loopback address reach only this host; any other
    host must be one the operator listed (`allowed_hosts`, normalised by
    `normal_host`; "*" allows every host). A host name is compared as
    written, never resolved: resolving would already reach out.
    """
    if address.is_unix or is_loopback(address) or ANY_HOST in allowed_hosts:
        return
    host = normal_host(address.target.rpartition(":")[0])
    if host not in allowed_hosts:
        raise AdapterTargetNotAllowed(address.target, host)


def _required_shortname(shortname: str) -> str:
    if not shortname:
        raise InvalidRequest([("shortname", "is required")])
    return shortname


def _delegation_depth(context: Context) -> int:
    depth = 0
    for key, value in call_metadata(context) or ():
        if key != DELEGATION_DEPTH_KEY:
            continue
        text = value.decode() if isinstance(value, bytes) else value
        if not text.isdigit():
            raise InvalidRequest(
                [(f"metadata.{DELEGATION_DEPTH_KEY}", f"must be a non-negative integer, got {text!r}")]
            )
        # Repeated values: the deepest wins, so a hop can never reset the count.
        depth = max(depth, int(text))
    return depth


def caller_identity(context: Context) -> str:
    """Who is calling, for the audit: the TLS client certificate's name when there is one, else the peer."""
    auth = context.auth_context() or {}
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        names = auth.get(key)
        if names:
            name = next(iter(names))
            return f"x509:{name.decode() if isinstance(name, bytes) else name}"
    return peer_identity(context)


@contextlib.contextmanager
def _nested(field: str, present: bool) -> Iterator[None]:
    """Field paths of a call nested in its request's `field`, pointed at from the top of that request."""
    if not present:
        raise InvalidRequest([(field, "is required: the call to stream")])
    with _prefixed(field):
        yield


@contextlib.contextmanager
def _prefixed(field: str | None) -> Iterator[None]:
    """InvalidRequest field paths raised inside, prefixed with `field` (unchanged when None)."""
    try:
        yield
    except InvalidRequest as error:
        if field is None:
            raise
        raise InvalidRequest([(f"{field}.{f}", d) for f, d in error.violations]) from error


def peer_identity(context: Context) -> str:
    """The caller as its peer address (`unix:`, `ipv4:HOST:PORT`, ...)."""
    peer: str = context.peer() or ""
    return peer or "unknown"
