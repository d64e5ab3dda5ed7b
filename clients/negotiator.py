"""A typed, synchronous client for the negotiator service (the asyncio twin is in `agentsidecar.clients.aio`).

    with NegotiatorClient("unix:run/negotiator.sock") as negotiator:
        decision = negotiator.negotiate(adapter="demo", prompt="hi", output_schema=schema)
        reply = negotiator.produce(adapter="demo", prompt="hi", output_schema=schema,
                                   options=call_options(settings={"temperature": 0.2}))

One method per RPC. Each takes the request as keyword arguments (Python
values: a schema may be a dict) or, positionally, as a request proto. Replies
with a single field are unwrapped: `get_adapter` returns the `Adapter`,
`negotiate` the `Decision`, `list_adapters` a list; Produce, Invoke and
Bootstrap return their response protos. A failed call raises the
`agentsidecar.clients.errors` tree, never a raw `grpc.RpcError`; a refusal is an
`UnsupportedCapabilityError` whose `.gaps` lists every unmet requirement.

Streams: `watch()` yields adapter changes and `watch_audit()` audit records;
leaving the loop (or closing the generator) cancels the call.
`tool_session(call, tools=..., run_tool=..., approve=...)` drives the
bidirectional ToolSession to its result, answering each tool call and
approval request with the caller's functions; with `on_delta` (and
`on_event`) the session streams, and each delta (event) is handed to it as it
arrives, in order with the tool calls.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any, Literal, overload

import grpc
from google.protobuf import json_format, struct_pb2

from agentsidecar.clients.channel import CLIENT_TIMEOUT, SyncClient, Timeout
from agentsidecar.clients.errors import (
    GAP_STATES,
    UNSUPPORTED_CAPABILITY,
    Gap,
    SidecarError,
    UnsupportedCapabilityError,
    decode_gaps,
    from_decoded,
    from_rpc_error,
    mapped_stream,
)
from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.sidecar_runtime.statusdecode import DecodedError

DELEGATION_DEPTH_KEY = "x-delegation-depth"
PROVIDER_MANAGED = "provider-managed"

JsonSchema = str | bool | Mapping[str, Any]
"""A JSON Schema: JSON text, or the parsed document (a dict, or true/false)."""


def refusal_gaps(error: SidecarError) -> list[Gap]:
    """The gaps of an UNSUPPORTED_CAPABILITY refusal, in request order; [] for any other error."""
    if isinstance(error, UnsupportedCapabilityError):
        return list(error.gaps)
    if error.reason != UNSUPPORTED_CAPABILITY:
        return []
    return list(decode_gaps(error.precondition_violations))


def _enum_value(enum_type: Any, prefix: str, name: str) -> int:
    wire = name.strip().upper().replace("-", "_")
    wire = wire if wire.startswith(prefix) else f"{prefix}{wire}"
    if wire not in enum_type.keys() or wire.endswith("_UNSPECIFIED"):  # noqa: SIM118 - not a dict
        choices = ", ".join(n.removeprefix(prefix).lower() for n in enum_type.keys()[1:])
        raise ValueError(f"{name!r} is not one of: {choices}")
    value: int = enum_type.Value(wire)
    return value


def capability(name: str | common_pb2.Capability.ValueType) -> common_pb2.Capability.ValueType:
    """`"persona"`, `"CAPABILITY_PERSONA"` or the enum value itself."""
    if not isinstance(name, str):
        return name
    return common_pb2.Capability.ValueType(_enum_value(common_pb2.Capability, "CAPABILITY_", name))


def call_options(
    *,
    model: str | None = None,
    effort: str | None = None,
    settings: Mapping[str, Any] | None = None,
    profile: str | None = None,
    persona: str | None = None,
    mcp_servers: Sequence[pb.McpServer] = (),
    max_depth: int | Literal["provider-managed"] | None = None,
    allow_tools: Sequence[str] = (),
    deny_tools: Sequence[str] = (),
    stream_events: bool = False,
    allow_unknown: Iterable[str | common_pb2.Capability.ValueType] = (),
    conversation_id: str = "",
    no_wait: bool = False,
    new_conversation: bool = False,
    requires: Iterable[str] = (),
) -> pb.CallOptions:
    """CallOptions from Python values. Each value given is a requirement the adapter must declare.

    `settings` is any JSON-like mapping; `max_depth` is a number or
    "provider-managed"; `allow_unknown` names capabilities ("persona") the
    caller accepts while a declaration says UNKNOWN. `conversation_id` makes
    the call a turn of that conversation (needs stateful_history); `no_wait`
    fails a turn at once (ConversationBusyError) instead of queueing behind a
    running one; `new_conversation` starts it afresh. `requires` lists
    capabilities the call needs beyond those its other fields need, each a
    capability name ("codemode") or "<typed set>:<member>"
    ("hook_events:pre_tool_use"); the negotiator judges each one like the
    rest and names it `options.requires[i]` in a refusal.
    """
    options = pb.CallOptions(
        model=model,
        effort=effort,
        profile=profile,
        persona=persona,
        mcp_servers=mcp_servers,
        stream_events=stream_events,
        allow_unknown=[capability(name) for name in allow_unknown],
        conversation_id=conversation_id,
        no_wait=no_wait,
        new_conversation=new_conversation,
        requires=list(requires),
    )
    if settings is not None:
        struct = struct_pb2.Struct()
        json_format.ParseDict(dict(settings), struct)
        options.settings.CopyFrom(struct)
    if max_depth == PROVIDER_MANAGED:
        options.max_depth.provider_managed = True
    elif isinstance(max_depth, int):
        options.max_depth.depth = max_depth
    if allow_tools or deny_tools:
        options.tool_filter.CopyFrom(pb.ToolFilter(allow=allow_tools, deny=deny_tools))
    return options


def gate(name: str | common_pb2.Gate.ValueType) -> common_pb2.Gate.ValueType:
    """`"provider_cost_approval"`, `"GATE_PROVIDER_COST_APPROVAL"` or the enum value itself."""
    if not isinstance(name, str):
        return name
    return common_pb2.Gate.ValueType(_enum_value(common_pb2.Gate, "GATE_", name))


def tool_spec(
    name: str,
    *,
    arguments_schema: JsonSchema,
    description: str = "",
    return_schema: JsonSchema | None = None,
    risk: str | pb.ToolRisk.ValueType = "mutating",
    metadata: Mapping[str, str] | None = None,
) -> pb.ToolSpec:
    """A caller tool for `tool_session`. `risk` is "read_only" (run without asking), "mutating" or
    "sensitive" (each call is first sent to the caller's `approve`)."""
    risk_value = (
        pb.ToolRisk.ValueType(_enum_value(pb.ToolRisk, "TOOL_RISK_", risk)) if isinstance(risk, str) else risk
    )
    return pb.ToolSpec(
        name=name,
        description=description,
        arguments_schema=_schema_text(arguments_schema),
        return_schema=_schema_text(return_schema) if return_schema is not None else "",
        metadata=dict(metadata or {}),
        risk=risk_value,
    )


ToolRunner = Callable[[pb.ToolCall], Any]
"""Runs a caller tool: returns the result as a JSON value, or raises to report the tool failed."""

Approver = Callable[[pb.ApprovalRequest], Any]
"""Decides on a mutating or sensitive tool call: True (allow), False (deny) or a ToolApproval
(to edit the arguments or give a reason)."""


DeltaHandler = Callable[[str], Any]
"""Receives each text delta of a streamed tool session as it arrives."""

EventHandler = Callable[[pb.StreamEvent], Any]
"""Receives each semantic event of a streamed tool session (with options.stream_events)."""


def session_start(
    call: pb.ProduceRequest | pb.InvokeRequest, tools: Sequence[pb.ToolSpec], *, stream: bool = False
) -> pb.ToolSessionRequest:
    if isinstance(call, pb.ProduceRequest):
        start = pb.ToolSessionStart(produce=call, tools=tools, stream=stream)
    else:
        start = pb.ToolSessionStart(invoke=call, tools=tools, stream=stream)
    return pb.ToolSessionRequest(start=start)


def tool_result(call: pb.ToolCall, outcome: object) -> pb.ToolSessionRequest:
    """The answer to `call`: `outcome` is the tool's JSON result, or the exception it raised."""
    if isinstance(outcome, BaseException):
        message = str(outcome) or type(outcome).__name__
        return pb.ToolSessionRequest(tool_result=pb.ToolResult(call_id=call.call_id, error=message))
    try:
        text = json.dumps(outcome)
    except (TypeError, ValueError) as exc:
        error = f"the tool's result is not JSON: {exc}"
        return pb.ToolSessionRequest(tool_result=pb.ToolResult(call_id=call.call_id, error=error))
    return pb.ToolSessionRequest(tool_result=pb.ToolResult(call_id=call.call_id, result_json=text))


def approval_answer(request: pb.ApprovalRequest, decision: object) -> pb.ToolSessionRequest:
    """The answer to `request` from an Approver's decision (None: no approver, so deny)."""
    if isinstance(decision, pb.ToolApproval):
        approval = pb.ToolApproval()
        approval.CopyFrom(decision)
        approval.call_id = approval.call_id or request.call_id
    elif decision is True:
        approval = pb.ToolApproval(call_id=request.call_id, decision=pb.APPROVAL_DECISION_ALLOW)
    else:
        reason = "this caller approves no tool calls" if decision is None else "denied by the caller"
        approval = pb.ToolApproval(call_id=request.call_id, decision=pb.APPROVAL_DECISION_DENY, reason=reason)
    return pb.ToolSessionRequest(approval=approval)


def session_result(response: pb.ToolSessionResponse) -> pb.ProduceResponse | pb.InvokeResponse | None:
    """The final result a response carries, if it is the last message."""
    kind = response.WhichOneof("message")
    if kind == "produce_result":
        return response.produce_result
    if kind == "invoke_result":
        return response.invoke_result
    return None


def session_ended_early() -> SidecarError:
    return from_decoded(
        DecodedError(grpc.StatusCode.INTERNAL, "the ToolSession stream ended without a result")
    )


def bootstrap_request(
    request: pb.BootstrapRequest | None,
    *,
    capability: str,
    domain: str,
    local_only: bool,
    seed: str,
    approved_gates: Iterable[str | common_pb2.Gate.ValueType],
    run: bool,
    prompt: str,
) -> pb.BootstrapRequest:
    gates = [gate(name) for name in approved_gates]
    if request is not None:
        if capability or domain or local_only or seed or gates or run or prompt:
            raise TypeError("pass a request proto or keyword fields, not both")
        return request
    return pb.BootstrapRequest(
        capability=capability,
        domain=domain,
        local_only=local_only,
        seed=seed,
        approved_gates=gates,
        run=run,
        prompt=prompt,
    )


def _schema_text(schema: JsonSchema) -> str:
    return schema if isinstance(schema, str) else json.dumps(schema)


def _target(adapter: str | None, agent: str | None) -> dict[str, str]:
    if adapter is not None and agent is not None:
        raise ValueError("pass adapter (an agent framework) or agent (an agent harness), not both")
    if adapter is not None:
        return {"adapter": adapter}
    return {"agent": agent} if agent is not None else {}


def produce_request(
    *,
    adapter: str | None = None,
    agent: str | None = None,
    prompt: str = "",
    output_schema: JsonSchema = "",
    options: pb.CallOptions | None = None,
) -> pb.ProduceRequest:
    return pb.ProduceRequest(
        prompt=prompt, output_schema=_schema_text(output_schema), options=options, **_target(adapter, agent)
    )


def invoke_request(
    *,
    adapter: str | None = None,
    agent: str | None = None,
    prompt: str = "",
    options: pb.CallOptions | None = None,
) -> pb.InvokeRequest:
    return pb.InvokeRequest(prompt=prompt, options=options, **_target(adapter, agent))


def produce_call(
    request: pb.ProduceRequest | None,
    *,
    adapter: str | None,
    agent: str | None,
    prompt: str,
    output_schema: JsonSchema,
    options: pb.CallOptions | None,
) -> pb.ProduceRequest:
    """What `produce(...)` sends: `request` itself (then no keyword may be set), or the keywords' request."""
    if request is None:
        return produce_request(
            adapter=adapter, agent=agent, prompt=prompt, output_schema=output_schema, options=options
        )
    reject_fields(adapter, agent, prompt, output_schema, options)
    return request


def invoke_call(
    request: pb.InvokeRequest | None,
    *,
    adapter: str | None,
    agent: str | None,
    prompt: str,
    options: pb.CallOptions | None,
) -> pb.InvokeRequest:
    """What `invoke(...)` sends: `request` itself (then no keyword may be set), or the keywords' request."""
    if request is None:
        return invoke_request(adapter=adapter, agent=agent, prompt=prompt, options=options)
    reject_fields(adapter, agent, prompt, options)
    return request


def negotiate_request(
    call: pb.ProduceRequest | pb.InvokeRequest | None,
    *,
    adapter: str | None,
    agent: str | None,
    prompt: str,
    output_schema: JsonSchema | None,
    options: pb.CallOptions | None,
) -> pb.NegotiateRequest:
    """Judge `call`, or the call the keywords describe (a Produce when `output_schema` is given)."""
    if call is None:
        if output_schema is not None:
            call = produce_request(
                adapter=adapter, agent=agent, prompt=prompt, output_schema=output_schema, options=options
            )
        else:
            call = invoke_request(adapter=adapter, agent=agent, prompt=prompt, options=options)
    else:
        reject_fields(adapter, agent, prompt, output_schema, options)
    if isinstance(call, pb.ProduceRequest):
        return pb.NegotiateRequest(produce=call)
    return pb.NegotiateRequest(invoke=call)


def reject_fields(*given: object) -> None:
    """For a method given a request proto: no keyword field may be set too."""
    if any(value is not None and value != "" for value in given):
        raise TypeError("pass a request proto or keyword fields, not both")


def delegation_metadata(delegation_depth: int | None) -> tuple[tuple[str, str], ...]:
    """Request metadata for a call made at this delegation depth (0 at the top)."""
    return () if delegation_depth is None else ((DELEGATION_DEPTH_KEY, str(delegation_depth)),)


class NegotiatorClient(SyncClient):
    """`NegotiatorClient("unix:run/negotiator.sock")`, `NegotiatorClient("127.0.0.1:50062")`,
    or `NegotiatorClient(channel=existing_channel)`.

    The arguments (timeout, token, TLS, retry) are `agentsidecar.clients.channel.ChannelClient`'s.
    """

    @cached_property
    def _stub(self) -> negotiator_pb2_grpc.NegotiatorServiceStub:
        return negotiator_pb2_grpc.NegotiatorServiceStub(self.channel)

    # -- adapters --------------------------------------------------------

    def list_adapters(self, *, timeout: Timeout = CLIENT_TIMEOUT, page_size: int = 0) -> list[pb.Adapter]:
        """Every registered adapter, sorted by shortname: every page, each call with its own `timeout`.

        `page_size` 0 lets the server choose (AIP-158).
        """
        adapters: list[pb.Adapter] = []
        request = pb.ListAdaptersRequest(page_size=page_size)
        while True:
            response = self._call(self._stub.ListAdapters, request, timeout)
            adapters.extend(response.adapters)
            if not response.next_page_token:
                return adapters
            request = pb.ListAdaptersRequest(page_size=page_size, page_token=response.next_page_token)

    def get_adapter(self, shortname: str, *, timeout: Timeout = CLIENT_TIMEOUT) -> pb.Adapter:
        request = pb.GetAdapterRequest(shortname=shortname)
        return self._call(self._stub.GetAdapter, request, timeout).adapter

    def watch(self, *, timeout: float | None = None) -> Generator[pb.WatchAdaptersResponse, None, None]:
        """Every adapter as EXISTING, then each registration and removal, until the server ends it."""
        return mapped_stream(self._stub.WatchAdapters(pb.WatchAdaptersRequest(), timeout=timeout))

    def watch_adapters(
        self, *, timeout: float | None = None
    ) -> Generator[pb.WatchAdaptersResponse, None, None]:
        """The WatchAdapters RPC; the same as `watch()`."""
        return self.watch(timeout=timeout)

    def register_adapter(
        self, target: str, shortname: str = "", *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> pb.Adapter:
        """Register the remote adapter serving at `target`; `shortname` is the name it must declare."""
        request = pb.RegisterAdapterRequest(target=target, shortname=shortname)
        return self._call(self._stub.RegisterAdapter, request, timeout).adapter

    def deregister_adapter(self, shortname: str, *, timeout: Timeout = CLIENT_TIMEOUT) -> pb.Adapter:
        request = pb.DeregisterAdapterRequest(shortname=shortname)
        return self._call(self._stub.DeregisterAdapter, request, timeout).adapter

    def probe_adapter(
        self, shortname: str, model: str = "", *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> pb.ProbeAdapterResponse:
        """Probe `model` (default: the adapter's default model) of an openai adapter's upstream.

        Sends requests that cost tokens; the evidence stays on the adapter.
        """
        request = pb.ProbeAdapterRequest(shortname=shortname, model=model)
        return self._call(self._stub.ProbeAdapter, request, timeout)

    # -- calls -----------------------------------------------------------

    def negotiate(
        self,
        call: pb.ProduceRequest | pb.InvokeRequest | None = None,
        /,
        *,
        adapter: str | None = None,
        agent: str | None = None,
        prompt: str = "",
        output_schema: JsonSchema | None = None,
        options: pb.CallOptions | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> pb.Decision:
        """Dry run: the verdict on every requirement of the call, and its gaps. Runs no adapter.

        Unmet requirements are not an error here: `accepted` is false and
        `gaps` lists them.
        """
        request = negotiate_request(
            call, adapter=adapter, agent=agent, prompt=prompt, output_schema=output_schema, options=options
        )
        return self._call(self._stub.Negotiate, request, timeout).decision

    def produce(
        self,
        request: pb.ProduceRequest | None = None,
        /,
        *,
        adapter: str | None = None,
        agent: str | None = None,
        prompt: str = "",
        output_schema: JsonSchema = "",
        options: pb.CallOptions | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> pb.ProduceResponse:
        """Structured output, validated against `output_schema`; `output_json` holds it."""
        message = produce_call(
            request, adapter=adapter, agent=agent, prompt=prompt, output_schema=output_schema, options=options
        )
        return self._call(self._stub.Produce, message, timeout, delegation_metadata(delegation_depth))

    def invoke(
        self,
        request: pb.InvokeRequest | None = None,
        /,
        *,
        adapter: str | None = None,
        agent: str | None = None,
        prompt: str = "",
        options: pb.CallOptions | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> pb.InvokeResponse:
        """Plain text; `text` holds it."""
        message = invoke_call(request, adapter=adapter, agent=agent, prompt=prompt, options=options)
        return self._call(self._stub.Invoke, message, timeout, delegation_metadata(delegation_depth))

    def produce_stream(
        self,
        request: pb.ProduceRequest | None = None,
        /,
        *,
        adapter: str | None = None,
        agent: str | None = None,
        prompt: str = "",
        output_schema: JsonSchema = "",
        options: pb.CallOptions | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> Generator[pb.ProduceStreamResponse, None, None]:
        """Produce as it happens: `decision`, then `delta`s and `event`s, then `final` (validated).

        Errors are mapped as for `produce`, also mid-stream. Leaving the loop
        early, or closing the generator, cancels the call (and with it the
        adapter's upstream work).
        """
        message = produce_call(
            request, adapter=adapter, agent=agent, prompt=prompt, output_schema=output_schema, options=options
        )
        return mapped_stream(
            self._stub.ProduceStream(
                pb.ProduceStreamRequest(produce=message),
                timeout=self._timeout(timeout),
                metadata=delegation_metadata(delegation_depth),
            )
        )

    def invoke_stream(
        self,
        request: pb.InvokeRequest | None = None,
        /,
        *,
        adapter: str | None = None,
        agent: str | None = None,
        prompt: str = "",
        options: pb.CallOptions | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> Generator[pb.InvokeStreamResponse, None, None]:
        """Invoke as it happens: `decision`, then `delta`s and `event`s, then `final`.

        Errors are mapped as for `invoke`, also mid-stream. Leaving the loop
        early, or closing the generator, cancels the call.
        """
        message = invoke_call(request, adapter=adapter, agent=agent, prompt=prompt, options=options)
        return mapped_stream(
            self._stub.InvokeStream(
                pb.InvokeStreamRequest(invoke=message),
                timeout=self._timeout(timeout),
                metadata=delegation_metadata(delegation_depth),
            )
        )

    # -- tools, audit, bootstrap ------------------------------------------

    @overload
    def tool_session(
        self,
        call: pb.ProduceRequest,
        *,
        tools: Sequence[pb.ToolSpec],
        run_tool: ToolRunner,
        approve: Approver | None = None,
        on_delta: DeltaHandler | None = None,
        on_event: EventHandler | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> pb.ProduceResponse: ...

    @overload
    def tool_session(
        self,
        call: pb.InvokeRequest,
        *,
        tools: Sequence[pb.ToolSpec],
        run_tool: ToolRunner,
        approve: Approver | None = None,
        on_delta: DeltaHandler | None = None,
        on_event: EventHandler | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> pb.InvokeResponse: ...

    def tool_session(
        self,
        call: pb.ProduceRequest | pb.InvokeRequest,
        *,
        tools: Sequence[pb.ToolSpec],
        run_tool: ToolRunner,
        approve: Approver | None = None,
        on_delta: DeltaHandler | None = None,
        on_event: EventHandler | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> pb.ProduceResponse | pb.InvokeResponse:
        """A Produce or Invoke whose `tools` run here: the ToolSession RPC, driven to its result.

        Each ToolCall the model makes is answered with `run_tool(call)` (its
        JSON result, or the exception it raised as the tool's error). Each
        ApprovalRequest (mutating and sensitive tools) is answered with
        `approve(request)`; without `approve` every such call is denied.
        Returns the Produce or Invoke response; a refusal raises before any
        tool runs, as Produce does.

        With `on_delta` or `on_event` the session streams (`start.stream`):
        each text delta goes to `on_delta(text)` and each event (with
        options.stream_events) to `on_event(event)` as it arrives, in order
        with the tool calls; the response's events are then empty (they were
        streamed). An exception they raise ends the session (cancelling it).
        """
        outgoing: queue.SimpleQueue[pb.ToolSessionRequest | None] = queue.SimpleQueue()
        outgoing.put(session_start(call, tools, stream=on_delta is not None or on_event is not None))

        def requests() -> Iterator[pb.ToolSessionRequest]:
            # Open until the result: half-closing earlier would leave the model's next tool call unanswerable.
            while (message := outgoing.get()) is not None:
                yield message

        responses = self._stub.ToolSession(
            requests(), timeout=self._timeout(timeout), metadata=delegation_metadata(delegation_depth)
        )
        try:
            for response in responses:
                result = session_result(response)
                if result is not None:
                    # The status follows the result: the call ends OK once it arrives, whereas
                    # a cancel sent before it would end a successful session CANCELLED.
                    responses.code()
                    return result
                if response.HasField("tool_call"):
                    try:
                        outcome = run_tool(response.tool_call)
                    except Exception as exc:  # the tool failed: the model is told, the session goes on
                        outcome = exc
                    outgoing.put(tool_result(response.tool_call, outcome))
                elif response.HasField("approval_request"):
                    decision = approve(response.approval_request) if approve is not None else None
                    outgoing.put(approval_answer(response.approval_request, decision))
                elif response.HasField("delta"):
                    if on_delta is not None:
                        on_delta(response.delta)
                elif response.HasField("event") and on_event is not None:
                    on_event(response.event)
            raise session_ended_early()
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        finally:
            outgoing.put(None)
            responses.cancel()  # type: ignore[no-untyped-call]  # a no-op once the stream has ended

    def watch_audit(self, *, timeout: float | None = None) -> Generator[pb.AuditRecord, None, None]:
        """Every decision the negotiator makes from now on, as it makes it."""
        responses = mapped_stream(self._stub.WatchAudit(pb.WatchAuditRequest(), timeout=timeout))
        try:
            for response in responses:
                yield response.record
        finally:
            responses.close()

    def bootstrap(
        self,
        request: pb.BootstrapRequest | None = None,
        /,
        *,
        capability: str = "",
        domain: str = "",
        local_only: bool = False,
        seed: str = "",
        approved_gates: Iterable[str | common_pb2.Gate.ValueType] = (),
        run: bool = False,
        prompt: str = "",
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> pb.BootstrapResponse:
        """Seeds that may provide `capability` no adapter declares; with `run`, run the chosen one."""
        message = bootstrap_request(
            request,
            capability=capability,
            domain=domain,
            local_only=local_only,
            seed=seed,
            approved_gates=approved_gates,
            run=run,
            prompt=prompt,
        )
        return self._call(self._stub.Bootstrap, message, timeout)


__all__ = [
    "DELEGATION_DEPTH_KEY",
    "GAP_STATES",
    "PROVIDER_MANAGED",
    "UNSUPPORTED_CAPABILITY",
    "Approver",
    "DeltaHandler",
    "EventHandler",
    "Gap",
    "JsonSchema",
    "NegotiatorClient",
    "ToolRunner",
    "approval_answer",
    "bootstrap_request",
    "call_options",
    "capability",
    "delegation_metadata",
    "gate",
    "invoke_call",
    "invoke_request",
    "negotiate_request",
    "produce_call",
    "produce_request",
    "refusal_gaps",
    "reject_fields",
    "session_result",
    "session_start",
    "tool_result",
    "tool_spec",
]
