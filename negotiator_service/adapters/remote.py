"""The remote adapter: a process in any language implementing agentsidecar.adapter.v1.

The remote process declares itself (GetDeclaration); config may only narrow
that. Every call carries the caller's remaining time both as the gRPC
deadline and in `AdapterCallOptions.time_budget`, and the delegation depth
both in the options and as `x-delegation-depth` metadata, and with --otel the
trace context (`traceparent`), so the remote's spans join the caller's
trace. Every gRPC failure
is mapped to the negotiator's taxonomy; no AioRpcError leaves this module.

A call in a conversation carries its id and the committed state, and the
reply's state is what the conversation commits. A call with tools goes over
CallWithTools instead of Produce/Invoke: each tool call the remote sends is
run through the call's ToolBox (approval, validation, the filter) and its
outcome sent back, until the reply arrives.

Streaming (`stream`, model.StreamingAdapter) is used only for a remote whose
declaration (for the call's model) says stream_events SUPPORTED; any other is
served by its unary RPC, its events then its reply. A streamed call goes over
InvokeStream / ProduceStream, or with tools over CallWithTools with
`start.stream` set, and yields the remote's deltas and events as they arrive.
A remote that answers the stream RPC UNIMPLEMENTED before sending anything
lacks it: it is served unary, and that is remembered until the remote is
registered or connected to again. Deltas and events together are held to the
byte cap of one reply (MAX_REPLY_BYTES); a stream without its final, with a
second one or anything after it is ADAPTER_INTERNAL. Closing the stream
cancels the remote's RPC.

Once registered, the adapter keeps its declaration current (`monitor`): it
re-reads it (GetDeclaration, after the remote's grpc.health.v1 Check when the
remote serves one) every `refresh_seconds` and whenever its channel is READY
again after losing the connection. A remote that stops answering, answers
health with anything but SERVING, or now sends a declaration that cannot be
registered (invalid, another shortname, wider than the config allows) is
NOT_SERVING: its calls fail at once with AdapterUnavailable, without
reaching for the remote, until a re-read succeeds. A re-read that brings
another version replaces the declaration, so calls judged from then on are
judged by it (and conversations pinned to the old version refuse to go on).

Config options:
    target:          unix:PATH, unix:///PATH or HOST:PORT (required)
    timeout_seconds: the longest any call may take (default: the caller's budget only)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar, cast

import grpc
import grpc.aio
from google.protobuf import json_format, struct_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentsidecar.adapter.v1 import adapter_pb2, adapter_pb2_grpc
from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters._calls import (
    ALL_CAPABILITIES,
    Deadline,
    call_deadline,
    check_call,
    plain_json,
)
from agentsidecar.negotiator_service.adapters._options import OptionReader
from agentsidecar.negotiator_service.declarations import narrow, validate_shortname
from agentsidecar.negotiator_service.model import (
    MCP_TRANSPORTS,
    AdapterCall,
    AdapterKind,
    AdapterReply,
    AdapterSpec,
    CallKind,
    Capability,
    CapabilityState,
    Declaration,
    DeclarationOverride,
    JsonValue,
    StreamDelta,
    StreamEvent,
    StreamItem,
    ToolBox,
    ToolOutcome,
    strict_json,
)
from agentsidecar.sidecar_runtime.tracing import trace_metadata

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")

DECLARATION_TIMEOUT_SECONDS = 5.0
# How often a registered remote's health and declaration are checked, unless the operator says otherwise.
DEFAULT_REFRESH_SECONDS = 30.0
# grpc's reconnect backoff grows to 120 s by default; capped here, a remote that comes back is
# connected to again within this long, and its declaration re-read as soon as it is.
MAX_RECONNECT_BACKOFF_SECONDS = 5.0
INITIAL_RECONNECT_BACKOFF_SECONDS = 0.2
_LOGGER = logging.getLogger("agentsidecar.negotiator_service.adapters.remote")
# The largest GetDeclarationResponse registered, serialized. Every declaration
# travels in each ListAdapters page and WatchAdapters event, so one must stay
# small beside the 4 MiB message limit; real ones are a few hundred bytes.
MAX_DECLARATION_BYTES = 64 * 1024
DELEGATION_DEPTH_METADATA = "x-delegation-depth"
# What each revision of the contract carries (GetDeclarationResponse.contract_revision).
# Revision 1 added CallWithTools (whose ToolBox applies the tool filter to the
# caller's tools), conversation state, MCP servers, the tool filter itself (for
# MCP servers' tools) and provider-managed depth. An adapter built for revision 0
# would ignore those fields, an accept-then-ignore: for it they stay UNSUPPORTED,
# whatever it declares, and provider-managed depth is refused.
CONTRACT_REVISION = 1
_IMPLEMENTED_BY_REVISION: Mapping[int, frozenset[Capability]] = MappingProxyType(
    {
        0: ALL_CAPABILITIES
        - {Capability.MCP, Capability.TOOL_FILTER, Capability.TOOL_REGISTRATION, Capability.STATEFUL_HISTORY},
        1: ALL_CAPABILITIES,
    }
)


def implemented_in(revision: int) -> frozenset[Capability]:
    """The capabilities a remote adapter of that contract revision can be sent (a later one: as ours)."""
    return _IMPLEMENTED_BY_REVISION[min(revision, CONTRACT_REVISION)]


# Tool calls one CallWithTools stream may make; past it the call fails (INTERNAL).
MAX_TOOL_CALLS = 64
# The largest message the channel to a remote receives (grpc's default, stated once): a unary
# reply is held to it whole, and a streamed call's deltas and events together are held to it,
# so a stream never brings more than one reply could.
MAX_REPLY_BYTES = 4 * 1024 * 1024

_KINDS: Mapping[int, AdapterKind] = MappingProxyType(
    {
        common_pb2.ADAPTER_KIND_AGENT_FRAMEWORK: AdapterKind.FRAMEWORK,
        common_pb2.ADAPTER_KIND_AGENT_HARNESS: AdapterKind.HARNESS,
    }
)
_STATES: Mapping[int, CapabilityState] = MappingProxyType(
    {
        common_pb2.CAPABILITY_STATE_UNKNOWN: CapabilityState.UNKNOWN,
        common_pb2.CAPABILITY_STATE_UNSUPPORTED: CapabilityState.UNSUPPORTED,
        common_pb2.CAPABILITY_STATE_SUPPORTED: CapabilityState.SUPPORTED,
    }
)
_CAPABILITIES: Mapping[int, Capability] = MappingProxyType(
    {common_pb2.Capability.Value(f"CAPABILITY_{capability.name}"): capability for capability in Capability}
)

# How a remote status maps onto the taxonomy; anything else is AdapterInternal.
_STATUS_FAILURES: Mapping[grpc.StatusCode, type[errors.AdapterFailure]] = MappingProxyType(
    {
        grpc.StatusCode.UNAVAILABLE: errors.AdapterUnavailable,
        grpc.StatusCode.CANCELLED: errors.AdapterUnavailable,  # the remote side gave up, e.g. shutting down
        grpc.StatusCode.DEADLINE_EXCEEDED: errors.AdapterTimeout,
        grpc.StatusCode.RESOURCE_EXHAUSTED: errors.AdapterRateLimited,
        grpc.StatusCode.FAILED_PRECONDITION: errors.AdapterRefused,
        grpc.StatusCode.INVALID_ARGUMENT: errors.AdapterRefused,
        grpc.StatusCode.UNIMPLEMENTED: errors.AdapterRefused,
        grpc.StatusCode.UNAUTHENTICATED: errors.AdapterMisconfigured,
        grpc.StatusCode.PERMISSION_DENIED: errors.AdapterMisconfigured,
    }
)


def grpc_target(target: str) -> str | None:
    """The gRPC form of a target, or None when it is none of the accepted forms."""
    if target.startswith("unix:"):
        path = target.removeprefix("unix:")
        if path.startswith("//") and not path.startswith("///"):
            return None  # unix://host/... has an authority; only local paths are meaningful
        return target if path.strip("/") else None
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return target


_Declared = common_pb2.Declaration | common_pb2.ModelDeclaration


def _declared_fields(
    message: _Declared, contract_revision: int, where: str, problems: list[str]
) -> tuple[dict[Capability, CapabilityState], dict[str, frozenset[str]]]:
    """The capabilities and typed sets of a declaration or one model's entry; problems appended."""
    capabilities: dict[Capability, CapabilityState] = {}
    for index, entry in enumerate(message.capabilities):
        capability = _CAPABILITIES.get(entry.capability)
        state = _STATES.get(entry.state)
        if capability is None:
            problems.append(
                f"{where}capabilities[{index}].capability is unspecified or unknown ({entry.capability})"
            )
        if state is None:
            problems.append(f"{where}capabilities[{index}].state is unspecified or unknown ({entry.state})")
        if capability is None or state is None:
            continue
        if capability in capabilities and capabilities[capability] is not state:
            problems.append(f"{where}capabilities[{index}] declares {capability.value} twice, differently")
        capabilities[capability] = state
    sets = {
        "mcp_transports": frozenset(message.mcp_transports),
        "accepted_settings": frozenset(message.accepted_settings),
        "string_formats": frozenset(message.string_formats),
        "hook_events": frozenset(message.hook_events),
        "effort_levels": frozenset(message.effort_levels),
    }
    for name, members in sets.items():
        if any(not member.strip() for member in members):
            problems.append(f"{where}{name} contains an empty member")
    for transport in sorted(sets["mcp_transports"] - MCP_TRANSPORTS):
        problems.append(
            f'{where}mcp_transports contains "{transport}", not one of {", ".join(sorted(MCP_TRANSPORTS))}'
        )
    # An explicit UNKNOWN says what omission says; dropping it keeps the version stable.
    # What the contract cannot carry is UNSUPPORTED whatever the adapter claims, so
    # Negotiate and the pre-dispatch check refuse it instead of the adapter's edge.
    states: dict[Capability, CapabilityState] = {
        c: s for c, s in capabilities.items() if s is not CapabilityState.UNKNOWN
    }
    states.update(
        dict.fromkeys(ALL_CAPABILITIES - implemented_in(contract_revision), CapabilityState.UNSUPPORTED)
    )
    return states, sets


def declaration_from_proto(
    message: common_pb2.Declaration, contract_revision: int = CONTRACT_REVISION
) -> tuple[Declaration | None, list[str]]:
    """The declaration a remote adapter sent, its per-model entries included, or every reason it cannot be.

    Each model's entry is complete (as the contract says) and is held to the
    same contract revision as the adapter-level fields.
    """
    problems: list[str] = []
    try:
        validate_shortname(message.shortname)
    except errors.ConfigError as exc:
        problems.append(exc.message)
    kind = _KINDS.get(message.kind)
    if kind is None:
        problems.append(f"kind must be agent-framework or agent-harness, not {message.kind}")
    capabilities, sets = _declared_fields(message, contract_revision, "", problems)
    entries: dict[str, tuple[dict[Capability, CapabilityState], dict[str, frozenset[str]]]] = {}
    for index, model_entry in enumerate(message.models):
        where = f"models[{index}]."
        if not model_entry.model.strip():
            problems.append(f"{where}model is empty")
        elif model_entry.model in entries:
            problems.append(f'{where}model "{model_entry.model}" is declared twice')
        fields = _declared_fields(model_entry, contract_revision, where, problems)
        entries.setdefault(model_entry.model, fields)
    if problems or kind is None:
        return None, problems

    def declared(
        states: dict[Capability, CapabilityState], members: dict[str, frozenset[str]]
    ) -> Declaration:
        return Declaration(
            shortname=message.shortname,
            kind=kind,
            capabilities=MappingProxyType(states),
            mcp_transports=members["mcp_transports"],
            accepted_settings=members["accepted_settings"],
            string_formats=members["string_formats"],
            hook_events=members["hook_events"],
            effort_levels=members["effort_levels"],
            scripted=message.scripted,
        )

    models = {name: declared(*fields) for name, fields in sorted(entries.items())}
    adapter_level = declared(capabilities, sets)
    return (
        dataclasses.replace(
            adapter_level, default_model=message.default_model, models=MappingProxyType(models)
        ),
        [],
    )


def call_options(call: AdapterCall) -> adapter_pb2.AdapterCallOptions:
    """The options a remote adapter receives; only what the call set."""
    options = adapter_pb2.AdapterCallOptions(
        stream_events=call.options.stream_events, delegation_depth=call.delegation_depth
    )
    if call.options.model is not None:
        options.model = call.options.model
    if call.options.effort is not None:
        options.effort = call.options.effort
    if call.options.profile is not None:
        options.profile = call.options.profile
    if call.options.persona is not None:
        options.persona = call.options.persona
    if call.options.settings:
        settings = plain_json(call.options.settings)
        assert isinstance(settings, dict)  # plain_json keeps a mapping a mapping
        options.settings.CopyFrom(_struct(settings))
    max_depth = call.options.max_depth
    if max_depth is not None and max_depth.depth is not None:
        options.max_depth = max_depth.depth
    options.max_depth_provider_managed = max_depth is not None and max_depth.provider_managed
    for server in call.options.mcp_servers:
        options.mcp_servers.add(
            name=server.name,
            transport=server.transport,
            command=server.command,
            args=server.args,
            env=server.env,
            url=server.url,
            headers=server.headers,
        )
    if call.options.tool_filter is not None:
        options.tool_filter.allow.extend(call.options.tool_filter.allow)
        options.tool_filter.deny.extend(call.options.tool_filter.deny)
    if call.time_budget is not None:
        options.time_budget.FromNanoseconds(int(call.time_budget * 1e9))
    if call.options.conversation_id is not None:
        options.conversation_id = call.options.conversation_id
    return options


def _json_text(value: JsonValue) -> str:
    """JSON text for the remote: compact, and strict (ValueError for NaN or Infinity, which no
    JSON parser but Python's would read at the far end)."""
    return json.dumps(plain_json(value), separators=(",", ":"), allow_nan=False)


def _state(call: AdapterCall) -> dict[str, struct_pb2.Value]:
    """The request's `conversation_state` field: the committed state, when the conversation has one."""
    if call.conversation_state is None:
        return {}
    value = struct_pb2.Value()
    json_format.ParseDict(plain_json(call.conversation_state), value)
    return {"conversation_state": value}


def adapter_tools(tools: ToolBox) -> list[adapter_pb2.AdapterTool]:
    """The tools the model may see, as the remote is told of them."""
    return [
        adapter_pb2.AdapterTool(
            name=spec.name,
            description=spec.description,
            arguments_schema=_json_text(spec.arguments_schema),
        )
        for spec in tools.specs
    ]


def tool_outcome(call_id: str, outcome: ToolOutcome) -> adapter_pb2.ToolOutcome:
    message = adapter_pb2.ToolOutcome(call_id=call_id, denied=outcome.denied)
    if outcome.error is not None:
        message.error = outcome.error
        return message
    try:
        message.result_json = _json_text(outcome.result)
    except ValueError as exc:  # NaN or Infinity
        message.error = f"the tool's result is not valid JSON ({exc})"
    return message


def reply_state(
    adapter: str, response: adapter_pb2.InvokeResponse | adapter_pb2.ProduceResponse
) -> JsonValue:
    """The conversation state a reply carries, as JSON values (None when it has none)."""
    if not response.HasField("conversation_state"):
        return None
    try:
        return json_format.MessageToDict(response.conversation_state)
    except ValueError as exc:  # NaN or Infinity in a number_value
        raise errors.AdapterInternal(adapter, f"conversation_state is not valid JSON: {exc}") from exc


def _struct(values: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


# What grpc's C core says when it ends a call for breaking this channel's own
# limits (the metadata size, the message size). Such a RESOURCE_EXHAUSTED is
# raised here, not sent by the remote, so it is no throttling; the remote's
# own status, if it had one, is lost.
_LOCAL_LIMIT_MARKERS = (
    "received metadata size exceeds",
    "received message larger than max",
    "sent message larger than max",
)


def local_limit(error: grpc.aio.AioRpcError) -> str | None:
    """What the negotiator's own channel limit refused, when grpc ended `error` for one; else None."""
    if error.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    details = error.details() or ""
    if any(marker in details.lower() for marker in _LOCAL_LIMIT_MARKERS):
        return details
    return None


def failure_from_status(
    adapter: str, error: grpc.aio.AioRpcError, deadline: Deadline
) -> errors.AdapterFailure:
    code = error.code()
    details = error.details() or "(no details)"
    limit = local_limit(error)
    if limit is not None:
        return errors.AdapterReplyTooLarge(
            adapter, f"the remote's reply or status exceeds the negotiator's limits: {limit}"
        )
    failure = _STATUS_FAILURES.get(code, errors.AdapterInternal)
    cause = f"gRPC {code.name}: {details}"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and deadline.seconds is not None:
        cause += f" (deadline {deadline.seconds:g} s: {deadline.limit})"
    if failure is errors.AdapterRateLimited:
        return errors.AdapterRateLimited(adapter, cause, retry_after=_retry_delay(error))
    return failure(adapter, cause)


def _retry_delay(error: grpc.aio.AioRpcError) -> float | None:
    """RetryInfo.retry_delay from the rich status trailer, when the remote sent one."""
    # grpc-stubs types this as the sync tuple form; an aio call carries grpc.aio.Metadata.
    metadata = cast("grpc.aio.Metadata | None", error.trailing_metadata())
    for value in metadata.get_all("grpc-status-details-bin") if metadata is not None else ():
        if not isinstance(value, bytes):
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value)
        except Exception:  # a broken trailer must not hide the status it came with
            return None
        for detail in status.details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                seconds: float = retry.retry_delay.ToNanoseconds() / 1e9
                return seconds
    return None


class RemoteAdapter:
    """A connected remote adapter. Build it with `connect_remote` (or `restore_remote`)."""

    implementation = "remote"

    def __init__(
        self,
        target: str,
        channel: grpc.aio.Channel,
        declaration: Declaration,
        timeout_seconds: float | None = None,
        contract_revision: int = CONTRACT_REVISION,
        *,
        response: adapter_pb2.GetDeclarationResponse | None = None,
        override: DeclarationOverride | None = None,
        declaration_timeout: float = DECLARATION_TIMEOUT_SECONDS,
        serving_detail: str = "",
    ) -> None:
        """`response` is the GetDeclaration reply `declaration` came from (what `declaration_response`
        gives back), `override` the config's narrowing, applied again to every re-read.
        A non-empty `serving_detail` starts the adapter NOT_SERVING for that reason."""
        self.target = target
        self.contract_revision = contract_revision
        self._implemented = implemented_in(contract_revision)
        self._channel = channel
        self._stub = adapter_pb2_grpc.AdapterServiceStub(channel)
        self._health = health_pb2_grpc.HealthStub(channel)
        self._declaration = declaration
        self._response = response
        self._override = override
        self._declaration_timeout = declaration_timeout
        self._timeout_seconds = timeout_seconds
        self._closed = False
        self._serving_detail = serving_detail
        # None until a Check answered: the remote may not serve grpc.health.v1 at all.
        self._health_served: bool | None = None
        self._refresh_seconds = DEFAULT_REFRESH_SECONDS
        self._changed: Callable[[], None] | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # The stream RPCs ("InvokeStream", "ProduceStream") this remote answered UNIMPLEMENTED:
        # served unary until it is connected to again (it may have been replaced by another build).
        self._unary_only: set[str] = set()

    @property
    def declaration(self) -> Declaration:
        return self._declaration

    @property
    def declaration_response(self) -> adapter_pb2.GetDeclarationResponse | None:
        """The GetDeclaration reply the current declaration came from, before any config narrowing."""
        return self._response

    @property
    def serving(self) -> bool:
        """Whether calls are dispatched to the remote; see `serving_detail` when not."""
        return not self._serving_detail

    @property
    def serving_detail(self) -> str:
        """Why the adapter is NOT_SERVING; "" while it serves."""
        return self._serving_detail

    def monitor(self, refresh_seconds: float, changed: Callable[[], None]) -> None:
        """Keep the declaration and serving status current; `changed` runs after either changes.

        Checks every `refresh_seconds`, and as soon as the channel is READY
        again after losing its connection. Runs until `close`.
        """
        if self._closed or self._tasks:
            return
        self._refresh_seconds = refresh_seconds
        self._changed = changed
        self._tasks = [
            asyncio.create_task(self._watch_connectivity(), name=f"remote {self.target} connectivity"),
            asyncio.create_task(self._refresh_loop(), name=f"remote {self.target} refresh"),
        ]

    async def refresh(self) -> None:
        """Check the remote now: its health, then its declaration (never raises).

        A probe waits at most the declaration timeout, and no longer than the
        refresh interval, so a remote that hangs is NOT_SERVING within one
        interval of the check.
        """
        timeout = min(self._declaration_timeout, self._refresh_seconds)
        shortname = self._declaration.shortname
        try:
            problem = await self._health_problem(timeout)
            if problem is not None:
                self._update(problem)
                return
            response, declaration = await fetch_declaration(
                self._channel, self.target, shortname, override=self._override, seconds=timeout
            )
        except errors.NegotiatorError as exc:
            self._update(_cause(exc))
            return
        except grpc.aio.BaseError as exc:  # a C-core fault, not a remote status
            self._update(f"gRPC client error: {exc!r}")
            return
        self._update("", response, declaration)

    async def _health_problem(self, seconds: float) -> str | None:
        """Why grpc.health.v1 says the remote cannot serve, or None (SERVING, or no health service)."""
        if self._health_served is False:
            return None
        try:
            reply = await self._health.Check(health_pb2.HealthCheckRequest(), timeout=seconds)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND):
                self._health_served = False
                return None
            return f"grpc.health.v1 Check failed: {exc.code().name}: {exc.details()}"
        self._health_served = True
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            return f"grpc.health.v1 Check answered {status}"
        return None

    def _update(
        self,
        problem: str,
        response: adapter_pb2.GetDeclarationResponse | None = None,
        declaration: Declaration | None = None,
    ) -> None:
        """Apply a check's outcome: NOT_SERVING for `problem`, else SERVING with what was read."""
        changed = problem != self._serving_detail
        if changed:
            if problem:
                _LOGGER.warning(
                    "remote adapter %s at %s is not serving: %s",
                    self._declaration.shortname,
                    self.target,
                    problem,
                )
            else:
                _LOGGER.info(
                    "remote adapter %s at %s is serving again", self._declaration.shortname, self.target
                )
        self._serving_detail = problem
        if response is not None and declaration is not None:
            self._response = response
            if declaration.version != self._declaration.version:
                _LOGGER.info(
                    "remote adapter %s at %s declares version %s (was %s)",
                    declaration.shortname,
                    self.target,
                    declaration.version,
                    self._declaration.version,
                )
                # A new object: judgements kept for the old declaration no longer apply.
                self._declaration = declaration
                self.contract_revision = response.contract_revision
                self._implemented = implemented_in(response.contract_revision)
                self._unary_only.clear()
                changed = True
        if changed and self._changed is not None:
            self._changed()

    async def _watch_connectivity(self) -> None:
        """Mark a lost connection NOT_SERVING, and wake a re-read when it is READY again.

        One watch at a time, for the channel's life: a watch is resolved
        only by a state change or the channel's close.
        """
        ready = grpc.ChannelConnectivity.READY
        state = self._channel.get_state(try_to_connect=True)
        while state is not grpc.ChannelConnectivity.SHUTDOWN:
            await self._channel.wait_for_state_change(state)
            # Asking to connect turns an IDLE channel (a dropped connection) into a new attempt.
            previous, state = state, self._channel.get_state(try_to_connect=True)
            if state is ready and previous is not ready:
                self._health_served = None  # the remote may have been replaced by another build
                self._unary_only.clear()
                self._wake.set()
            elif state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                self._update(f"cannot connect to {self.target} (channel in TRANSIENT_FAILURE)")

    async def _refresh_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._refresh_seconds):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.refresh()
            except Exception as exc:  # the loop must outlive any one check
                _LOGGER.exception("checking remote adapter at %s failed unexpectedly", self.target)
                self._update(f"the check failed unexpectedly: {exc!r}")

    async def invoke(self, call: AdapterCall) -> AdapterReply:
        request = self._invoke_request(call)
        if call.tools is not None and call.tools.specs:
            reply = await self._call_with_tools(adapter_pb2.CallWithToolsStart(invoke=request), call)
            response: adapter_pb2.InvokeResponse = reply.invoke
        else:
            response = await self._rpc(self._stub.Invoke, request, call)
        return self._reply(call, response.text, response)

    async def produce(self, call: AdapterCall) -> AdapterReply:
        request = self._produce_request(call)
        if call.tools is not None and call.tools.specs:
            reply = await self._call_with_tools(adapter_pb2.CallWithToolsStart(produce=request), call)
            response: adapter_pb2.ProduceResponse = reply.produce
        else:
            response = await self._rpc(self._stub.Produce, request, call)
        return self._reply(call, response.output_json, response)

    async def stream(self, call: AdapterCall, kind: CallKind) -> AsyncGenerator[StreamItem, None]:
        """The call as it happens: the remote's deltas and events as they arrive, then the reply.

        Streamed only when the declaration for the call's model says
        stream_events SUPPORTED; otherwise (or when the remote lacks the
        stream RPC) the unary call's events, then its reply. Closing this
        iterator, or cancelling its consumer, cancels the remote's RPC.
        """
        produce = kind is CallKind.PRODUCE
        request = self._produce_request(call) if produce else self._invoke_request(call)
        _, declared = self._declaration.for_model(call.options.model)
        streamed = declared.state(Capability.STREAM_EVENTS) is CapabilityState.SUPPORTED
        if call.tools is not None and call.tools.specs:
            start = (
                adapter_pb2.CallWithToolsStart(produce=request)
                if isinstance(request, adapter_pb2.ProduceRequest)
                else adapter_pb2.CallWithToolsStart(invoke=request)
            )
            start.stream = streamed
            tool_items = self._tool_stream(start, call)
            async with contextlib.aclosing(tool_items):
                async for tool_item in tool_items:
                    if isinstance(tool_item, adapter_pb2.CallWithToolsResponse):
                        final = tool_item.produce if produce else tool_item.invoke
                    else:
                        yield tool_item
            reply = self._reply(call, _reply_text(final), final)
        elif streamed and _STREAM_RPCS[kind] not in self._unary_only:
            shortname = self._declaration.shortname
            deadline = call_deadline(shortname, call.time_budget, self._timeout_seconds)
            started = asyncio.get_running_loop().time()
            items = self._streamed_rpc(kind, request, call, deadline)
            async with contextlib.aclosing(items):
                async for item in items:
                    if item is None:  # UNIMPLEMENTED before anything was sent: no stream RPC
                        break
                    yield item
                else:
                    return
            reply = await self._unary(request, call, _rest_of(shortname, deadline, started))
        else:
            reply = await self._unary(request, call)
        for event in reply.events:
            yield event
        yield reply

    def _invoke_request(self, call: AdapterCall) -> adapter_pb2.InvokeRequest:
        self._check(call, CallKind.INVOKE)
        return adapter_pb2.InvokeRequest(prompt=call.prompt, options=call_options(call), **_state(call))

    def _produce_request(self, call: AdapterCall) -> adapter_pb2.ProduceRequest:
        self._check(call, CallKind.PRODUCE)
        assert call.output_schema is not None  # _check refuses Produce without one
        return adapter_pb2.ProduceRequest(
            prompt=call.prompt,
            output_schema=_json_text(call.output_schema),
            options=call_options(call),
            **_state(call),
        )

    async def _unary(
        self,
        request: adapter_pb2.InvokeRequest | adapter_pb2.ProduceRequest,
        call: AdapterCall,
        deadline: Deadline | None = None,
    ) -> AdapterReply:
        """The reply of the unary RPC for `request` (no tools), within `deadline` (default: the call's)."""
        if isinstance(request, adapter_pb2.ProduceRequest):
            produced = await self._rpc(self._stub.Produce, request, call, deadline)
            return self._reply(call, produced.output_json, produced)
        invoked = await self._rpc(self._stub.Invoke, request, call, deadline)
        return self._reply(call, invoked.text, invoked)

    async def _streamed_rpc(
        self,
        kind: CallKind,
        request: adapter_pb2.InvokeRequest | adapter_pb2.ProduceRequest,
        call: AdapterCall,
        deadline: Deadline,
    ) -> AsyncGenerator[StreamDelta | StreamEvent | AdapterReply | None, None]:
        """InvokeStream / ProduceStream: deltas and events, then the reply's events and the reply.

        Yields None, and nothing else, when the remote answered UNIMPLEMENTED
        before any message (it lacks the RPC; remembered in `_unary_only`).
        """
        shortname = self._declaration.shortname
        method = _STREAM_RPCS[kind]
        metadata = ((DELEGATION_DEPTH_METADATA, str(call.delegation_depth)), *trace_metadata())
        rpc: grpc.aio.UnaryStreamCall[Any, Any]
        if isinstance(request, adapter_pb2.ProduceRequest):
            rpc = self._stub.ProduceStream(
                adapter_pb2.ProduceStreamRequest(produce=request), timeout=deadline.seconds, metadata=metadata
            )
        else:
            rpc = self._stub.InvokeStream(
                adapter_pb2.InvokeStreamRequest(invoke=request), timeout=deadline.seconds, metadata=metadata
            )
        received = _StreamTally(shortname, method)
        final: adapter_pb2.InvokeResponse | adapter_pb2.ProduceResponse | None = None
        try:
            while True:
                message = await rpc.read()
                if message is None:  # grpc.aio answers None for a message it could not decode
                    raise errors.AdapterInternal(
                        shortname, f"{method} sent a message that is not one of the adapter contract"
                    )
                if not isinstance(
                    message, adapter_pb2.InvokeStreamResponse | adapter_pb2.ProduceStreamResponse
                ):
                    break  # grpc.aio.EOF: the remote ended the stream OK
                which = message.WhichOneof("message")
                received.started = True
                if final is not None:
                    raise errors.AdapterInternal(
                        shortname, f"{method} sent {which or 'an empty message'} after its final"
                    )
                if which == "final":
                    final = message.final
                elif which is None:
                    raise errors.AdapterInternal(shortname, f"{method} sent an empty message")
                elif (item := received.item(message, which, call)) is not None:
                    yield item
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED and not received.started:
                _LOGGER.info(
                    "remote adapter %s at %s does not implement %s; served unary",
                    shortname,
                    self.target,
                    method,
                )
                self._unary_only.add(method)
                yield None
                return
            self._failed(exc)
            raise failure_from_status(shortname, exc, deadline) from exc
        except grpc.aio.BaseError as exc:
            raise errors.AdapterInternal(shortname, f"gRPC client error: {exc!r}") from exc
        finally:
            # A no-op once the stream has ended; on a failure here or the caller's cancel,
            # it ends the remote's call too.
            rpc.cancel()
        if final is None:
            raise errors.AdapterInternal(shortname, f"{method} ended without its final")
        reply = self._reply(call, _reply_text(final), final)
        for event in reply.events:
            yield event
        yield reply

    async def close(self) -> None:
        self._closed = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._channel.close(None)

    def _check(self, call: AdapterCall, kind: CallKind) -> None:
        if self._closed:
            raise errors.AdapterUnavailable(self._declaration.shortname, "the adapter is closed")
        if self._serving_detail:
            # Fail fast: a call would only wait for a connection, or for a remote that does not answer.
            raise errors.AdapterUnavailable(
                self._declaration.shortname, f"not serving: {self._serving_detail}"
            )
        check_call(self._declaration, call, kind, implemented=self._implemented)
        max_depth = call.options.max_depth
        if self.contract_revision < 1 and max_depth is not None and max_depth.provider_managed:
            raise errors.AdapterRefused(
                self._declaration.shortname,
                "options.max_depth.provider_managed: the adapter implements contract revision 0, "
                "which has no field to carry it",
            )

    def _reply(
        self, call: AdapterCall, text: str, response: adapter_pb2.InvokeResponse | adapter_pb2.ProduceResponse
    ) -> AdapterReply:
        state: JsonValue = None
        if call.options.conversation_id is not None:
            state = reply_state(self._declaration.shortname, response)
        return AdapterReply(text=text, events=self._events(call, response.events), conversation_state=state)

    async def _call_with_tools(
        self, start: adapter_pb2.CallWithToolsStart, call: AdapterCall
    ) -> adapter_pb2.CallWithToolsResponse:
        """Run the stream (`start.stream` unset): the start, an outcome per tool call, and the reply."""
        items = self._tool_stream(start, call)
        async with contextlib.aclosing(items):
            async for item in items:
                if isinstance(item, adapter_pb2.CallWithToolsResponse):
                    return item
        raise AssertionError("_tool_stream ends with the reply or raises")

    async def _tool_stream(
        self, start: adapter_pb2.CallWithToolsStart, call: AdapterCall
    ) -> AsyncGenerator[StreamDelta | StreamEvent | adapter_pb2.CallWithToolsResponse, None]:
        """Run the stream: the start, an outcome per tool call, and the reply it ends with, yielded
        last; with `start.stream`, the remote's deltas and events as they arrive before it."""
        assert call.tools is not None
        shortname = self._declaration.shortname
        reply_kind = start.WhichOneof("call")
        start.tools.extend(adapter_tools(call.tools))
        deadline = call_deadline(shortname, call.time_budget, self._timeout_seconds)
        metadata = ((DELEGATION_DEPTH_METADATA, str(call.delegation_depth)), *trace_metadata())
        stream = self._stub.CallWithTools(None, timeout=deadline.seconds, metadata=metadata)
        received = _StreamTally(shortname, "CallWithTools")
        try:
            await self._send(stream, adapter_pb2.CallWithToolsRequest(start=start))
            tool_calls = 0
            # read() answers grpc.aio.EOF, not a response, once the remote has ended the stream.
            while isinstance(message := await stream.read(), adapter_pb2.CallWithToolsResponse):
                kind = message.WhichOneof("message")
                if kind == reply_kind:
                    await stream.done_writing()
                    # The reply counts once the stream ends OK: a failing status raises here.
                    if isinstance(await stream.read(), adapter_pb2.CallWithToolsResponse):
                        raise errors.AdapterInternal(
                            shortname, f"CallWithTools sent more after the {reply_kind} reply"
                        )
                    yield message
                    return
                if start.stream and kind in ("delta", "event"):
                    if (item := received.item(message, kind, call)) is not None:
                        yield item
                    continue
                if kind != "tool_call":
                    raise errors.AdapterInternal(
                        shortname,
                        f"CallWithTools sent {kind or 'an empty message'}, "
                        f"neither a tool call nor the {reply_kind} reply",
                    )
                tool_calls += 1
                if tool_calls > MAX_TOOL_CALLS:
                    raise errors.AdapterInternal(
                        shortname, f"more than {MAX_TOOL_CALLS} tool calls in one call"
                    )
                outcome = await self._run_tool(call.tools, message.tool_call)
                await self._send(stream, adapter_pb2.CallWithToolsRequest(tool_outcome=outcome))
            raise errors.AdapterInternal(shortname, f"CallWithTools ended without the {reply_kind} reply")
        except grpc.aio.AioRpcError as exc:
            self._failed(exc)
            raise failure_from_status(shortname, exc, deadline) from exc
        except grpc.aio.BaseError as exc:
            raise errors.AdapterInternal(shortname, f"gRPC client error: {exc!r}") from exc
        finally:
            # A no-op once the stream has ended; on a failure here or the caller's cancel,
            # it ends the remote's call too.
            stream.cancel()

    async def _send(
        self,
        stream: grpc.aio.StreamStreamCall[
            adapter_pb2.CallWithToolsRequest, adapter_pb2.CallWithToolsResponse
        ],
        message: adapter_pb2.CallWithToolsRequest,
    ) -> None:
        try:
            await stream.write(message)
        except asyncio.InvalidStateError:
            # The remote ended its call while we worked (a tool call, an approval): its
            # status is the answer. Reading raises it as AioRpcError; an OK end reads EOF.
            while isinstance(await stream.read(), adapter_pb2.CallWithToolsResponse):
                pass
            raise errors.AdapterInternal(
                self._declaration.shortname, "CallWithTools ended before its tool call's outcome was sent"
            ) from None

    @staticmethod
    async def _run_tool(tools: ToolBox, tool_call: adapter_pb2.AdapterToolCall) -> adapter_pb2.ToolOutcome:
        try:
            arguments = strict_json(tool_call.arguments_json)
        except ValueError as exc:
            outcome = ToolOutcome(error=f"the arguments are not valid JSON ({exc}); the tool did not run")
        else:
            outcome = await tools.call(tool_call.name, arguments)
        return tool_outcome(tool_call.call_id, outcome)

    async def _rpc(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[_Request, _Response],
        request: _Request,
        call: AdapterCall,
        deadline: Deadline | None = None,
    ) -> _Response:
        shortname = self._declaration.shortname
        if deadline is None:
            deadline = call_deadline(shortname, call.time_budget, self._timeout_seconds)
        metadata = ((DELEGATION_DEPTH_METADATA, str(call.delegation_depth)), *trace_metadata())
        try:
            response = await method(request, timeout=deadline.seconds, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            self._failed(exc)
            raise failure_from_status(shortname, exc, deadline) from exc
        except grpc.aio.BaseError as exc:  # client-side misuse or a C-core fault, not a remote status
            raise errors.AdapterInternal(shortname, f"gRPC client error: {exc!r}") from exc
        if response is None:  # grpc.aio answers None for a reply its deserializer could not decode
            raise errors.AdapterInternal(
                shortname, "the reply is not a valid message of the adapter contract"
            )
        return response

    def _failed(self, error: grpc.aio.AioRpcError) -> None:
        """After a call failed UNAVAILABLE, check the remote now rather than at the next interval."""
        if error.code() is grpc.StatusCode.UNAVAILABLE:
            self._wake.set()

    @staticmethod
    def _events(call: AdapterCall, events: Iterable[adapter_pb2.AdapterEvent]) -> tuple[StreamEvent, ...]:
        if not call.options.stream_events:
            return ()  # not asked for; passing them on would widen the reply
        return tuple(StreamEvent(type=event.type, text=event.text) for event in events)


_GET_DECLARATION = "/agentsidecar.adapter.v1.AdapterService/GetDeclaration"
_STREAM_RPCS: Mapping[CallKind, str] = MappingProxyType(
    {CallKind.INVOKE: "InvokeStream", CallKind.PRODUCE: "ProduceStream"}
)


def _rest_of(shortname: str, deadline: Deadline, started: float) -> Deadline:
    """What is left of `deadline`, set at loop time `started`; AdapterTimeout when nothing is."""
    if deadline.seconds is None:
        return deadline
    left = deadline.seconds - (asyncio.get_running_loop().time() - started)
    if left <= 0:
        raise deadline.expired(shortname)
    return Deadline(left, deadline.limit)


def _reply_text(response: adapter_pb2.InvokeResponse | adapter_pb2.ProduceResponse) -> str:
    return response.output_json if isinstance(response, adapter_pb2.ProduceResponse) else response.text


class _StreamTally:
    """The deltas and events of one streamed call, as items, held together to MAX_REPLY_BYTES."""

    __slots__ = ("_method", "_shortname", "bytes", "started")

    def __init__(self, shortname: str, method: str) -> None:
        self._shortname = shortname
        self._method = method
        self.bytes = 0
        self.started = False  # any message arrived

    def item(
        self,
        message: adapter_pb2.InvokeStreamResponse
        | adapter_pb2.ProduceStreamResponse
        | adapter_pb2.CallWithToolsResponse,
        which: str,
        call: AdapterCall,
    ) -> StreamDelta | StreamEvent | None:
        """The delta or event `message` carries (None: an event the call did not ask for)."""
        self.bytes += message.ByteSize()
        if self.bytes > MAX_REPLY_BYTES:
            raise errors.AdapterReplyTooLarge(
                self._shortname,
                f"{self._method} streamed more than {MAX_REPLY_BYTES} bytes of deltas and events, "
                "the most one reply may hold; the remote's call was cancelled",
            )
        if which == "delta":
            return StreamDelta(message.delta)
        if not call.options.stream_events:
            return None  # not asked for; passing them on would widen the reply
        return StreamEvent(type=message.event.type, text=message.event.text)


def _declaration_response(
    raw: bytes, target: str, expected_shortname: str
) -> adapter_pb2.GetDeclarationResponse:
    """The GetDeclaration reply decoded, or AdapterRegistrationFailed when it is too large or undecodable."""
    if len(raw) > MAX_DECLARATION_BYTES:
        raise errors.AdapterRegistrationFailed(
            target,
            f"the declaration is {len(raw)} bytes, over the limit of {MAX_DECLARATION_BYTES} bytes",
            expected_shortname,
        )
    response = adapter_pb2.GetDeclarationResponse()
    try:
        response.ParseFromString(raw)
    except DecodeError as exc:
        raise errors.AdapterRegistrationFailed(
            target, f"GetDeclaration's reply is not a GetDeclarationResponse ({exc})", expected_shortname
        ) from exc
    return response


def _channel(resolved: str) -> grpc.aio.Channel:
    # A private subchannel: in grpc's global pool, a channel still open to a dead adapter at this
    # address would make a restarted one unreachable until its reconnect backoff expires.
    return grpc.aio.insecure_channel(
        resolved,
        options=[
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", int(INITIAL_RECONNECT_BACKOFF_SECONDS * 1000)),
            ("grpc.max_reconnect_backoff_ms", int(MAX_RECONNECT_BACKOFF_SECONDS * 1000)),
            ("grpc.max_receive_message_length", MAX_REPLY_BYTES),
        ],
    )


def _cause(error: errors.NegotiatorError) -> str:
    """What went wrong, without the "cannot register ..." framing of the error's message."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, str) and cause else error.message


async def fetch_declaration(
    channel: grpc.aio.Channel,
    target: str,
    expected_shortname: str = "",
    *,
    override: DeclarationOverride | None = None,
    seconds: float = DECLARATION_TIMEOUT_SECONDS,
) -> tuple[adapter_pb2.GetDeclarationResponse, Declaration]:
    """The remote's GetDeclaration reply and the declaration it makes, checked and narrowed by `override`.

    Unreachable → AdapterUnavailable; a declaration that is missing,
    undecodable, over MAX_DECLARATION_BYTES, invalid, or names another
    shortname → AdapterRegistrationFailed; `override` widening it → ConfigError.
    """
    name = expected_shortname or target
    # Read as bytes, so a reply that is no GetDeclarationResponse, or one
    # too large, is named here rather than lost in grpc's deserializer.
    get_declaration = channel.unary_unary(
        _GET_DECLARATION,
        request_serializer=adapter_pb2.GetDeclarationRequest.SerializeToString,
        response_deserializer=None,
    )
    try:
        raw = await get_declaration(adapter_pb2.GetDeclarationRequest(), timeout=seconds)
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise errors.AdapterUnavailable(
                name, f"cannot reach {target}: {code.name}: {exc.details()}"
            ) from exc
        limit = local_limit(exc)
        cause = (
            f"GetDeclaration's reply or status exceeds the negotiator's limits: {limit}"
            if limit is not None
            else f"GetDeclaration failed: {code.name}: {exc.details()}"
        )
        raise errors.AdapterRegistrationFailed(target, cause, expected_shortname) from exc
    response = _declaration_response(raw, target, expected_shortname)
    return response, checked_declaration(response, target, expected_shortname, override)


def checked_declaration(
    response: adapter_pb2.GetDeclarationResponse,
    target: str,
    expected_shortname: str = "",
    override: DeclarationOverride | None = None,
) -> Declaration:
    """The declaration a GetDeclaration reply makes; raises as `fetch_declaration` does."""
    if not response.HasField("declaration"):
        raise errors.AdapterRegistrationFailed(
            target, "GetDeclaration returned no declaration", expected_shortname
        )
    declaration, problems = declaration_from_proto(response.declaration, response.contract_revision)
    if declaration is None:
        raise errors.AdapterRegistrationFailed(
            target, "invalid declaration: " + "; ".join(problems), expected_shortname
        )
    if expected_shortname and declaration.shortname != expected_shortname:
        raise errors.AdapterRegistrationFailed(
            target,
            f'it declares shortname "{declaration.shortname}", expected "{expected_shortname}"',
            expected_shortname,
        )
    if override is not None:
        declaration = narrow(declaration, override, shortname=declaration.shortname, implementation="remote")
    return declaration


async def connect_remote(
    target: str,
    expected_shortname: str = "",
    *,
    override: DeclarationOverride | None = None,
    timeout_seconds: float | None = None,
    declaration_timeout: float = DECLARATION_TIMEOUT_SECONDS,
) -> RemoteAdapter:
    """Connect, fetch and check the declaration, and return the adapter.

    Unreachable → AdapterUnavailable (worth retrying); a declaration that is
    missing, undecodable, over MAX_DECLARATION_BYTES, invalid, or names
    another shortname → AdapterRegistrationFailed;
    `override` widening the declaration → ConfigError.
    """
    resolved = grpc_target(target)
    if resolved is None:
        raise errors.AdapterRegistrationFailed(
            target, "the target must be unix:PATH, unix:///PATH or HOST:PORT", expected_shortname
        )
    channel = _channel(resolved)
    try:
        response, declaration = await fetch_declaration(
            channel, target, expected_shortname, override=override, seconds=declaration_timeout
        )
    except BaseException:
        await channel.close(None)
        raise
    return RemoteAdapter(
        target,
        channel,
        declaration,
        timeout_seconds,
        contract_revision=response.contract_revision,
        response=response,
        override=override,
        declaration_timeout=declaration_timeout,
    )


async def restore_remote(
    target: str,
    shortname: str,
    response: adapter_pb2.GetDeclarationResponse,
    *,
    declaration_timeout: float = DECLARATION_TIMEOUT_SECONDS,
) -> RemoteAdapter:
    """A remote registered before, from its last known GetDeclaration reply, checked once.

    The adapter exists whether or not the remote answers: NOT_SERVING (with
    the last known declaration) until a check succeeds, so a registration
    outlives a remote that is down when the negotiator starts. A stored
    reply that is not a valid declaration of `shortname`, or an invalid
    target → AdapterRegistrationFailed.
    """
    resolved = grpc_target(target)
    if resolved is None:
        raise errors.AdapterRegistrationFailed(
            target, "the target must be unix:PATH, unix:///PATH or HOST:PORT", shortname
        )
    declaration = checked_declaration(response, target, shortname)
    adapter = RemoteAdapter(
        target,
        _channel(resolved),
        declaration,
        contract_revision=response.contract_revision,
        response=response,
        declaration_timeout=declaration_timeout,
        serving_detail="not checked yet since the negotiator started",
    )
    await adapter.refresh()
    return adapter


async def connect_from_spec(spec: AdapterSpec) -> RemoteAdapter:
    """A config-defined remote adapter: options `target` and `timeout_seconds`."""
    reader = OptionReader(spec, spec.options)
    target = reader.required_string("target")
    if grpc_target(target) is None:
        reader.fail("target", f'"{target}" is not unix:PATH, unix:///PATH or HOST:PORT')
    timeout = reader.positive_number("timeout_seconds", None)
    reader.finish()
    validate_shortname(spec.shortname)
    return await connect_remote(target, spec.shortname, override=spec.declaration, timeout_seconds=timeout)
