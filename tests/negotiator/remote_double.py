"""The remote adapter the tests run: a standalone process implementing agentsidecar.adapter.v1.

A test double, not an example (examples/remote_adapter.py is the one to copy): its
prompts are hooks that make it misbehave on purpose.

It declares an agent-framework with structured output (string format
"email" only), per-call model override, the caller's tools (with tool
filters, which the negotiator applies) and conversations; everything else
unsupported, and refused with FAILED_PRECONDITION if it is sent anyway.

    Invoke:  "remote:" + prompt
    Produce: {"echo": prompt} (plus "model" when the call chose one)

In a conversation the state it keeps is {"turns": n, "prompts": [...]}, and
Invoke answers "remote:" + prompt + " (turn n)".

With tools (CallWithTools): "tool:<name>:<JSON arguments>" calls that tool
once and answers "remote:" + the outcome as JSON ({"tool", "result"} or
{"tool", "error", "denied"}); "tools:" answers with the visible tools'
names; "badjson:<name>" sends arguments that are not JSON; "loop:<name>"
calls the tool until the stream ends; "noreply:" ends the stream without a
reply; "twice:" replies twice; "replythenfail:" replies, then fails with
INTERNAL; "toolthenfail:<name>:<CODE>" calls the tool and fails with that
status without waiting for the outcome; "nanargs:<name>" sends the
arguments `NaN`. A Produce with tools answers {"echo": prompt, "tool": outcome}.

Test hooks in the prompt: "sleep:<seconds>" sleeps first (deadlines,
cancellation); "fail:<CODE>" aborts with that gRPC status code
(RESOURCE_EXHAUSTED carries a RetryInfo of 2 s); "options:" answers with the
options and metadata the call carried, as JSON after "remote:".

Delegation: "delegate:<target>:<adapter>:<prompt>" (Invoke) calls Invoke on
the negotiator at <target> ("unix:PATH" or "HOST:PORT", no further colon)
with that adapter and prompt, and answers "remote:" + its text. As the
adapter contract asks, the call this adapter received is at depth d (its
`delegation_depth`, also `x-delegation-depth` metadata), so the delegated call
carries `x-delegation-depth: d + 1`; a negotiator refusal comes back as the
same status code.

With --stream it also declares stream_events and serves InvokeStream and
ProduceStream (with --no-stream-rpc it declares stream_events but lacks both
RPCs, as an adapter built before them does). A streamed call answers what
the unary one would, as two deltas (the text's halves) and the final, unless
its prompt is one of these:
"chunks:<n>:<seconds>" sends n deltas "part<i> " that far apart, each
followed (with stream_events) by an event {"progress", i}, printing
"DELTA <i> <time.monotonic() as it was handed to gRPC>" after each, then the final;
"nofinal:" sends a delta and ends; "twofinals:" sends its final twice;
"deltaafterfinal:" sends a delta after its final; "flood:<n>" sends n
deltas of 1 MiB; "deltathenfail:<CODE>" sends a delta, then fails with that
status; "unimplemented:" fails UNIMPLEMENTED before sending anything. A
streamed CallWithTools (start.stream) sends the delta "calling <name> "
(and with stream_events an event {"tool", name}) before each tool call.

With --log-rpcs it prints "RPC <method>" as each call arrives (served or not).
Prints "READY <address>" once serving, "CANCELLED <method> <prompt>" when a
caller cancels (CallWithTools: while waiting for a tool's outcome), and
stops cleanly on SIGTERM or SIGINT.

    python tests/negotiator/remote_double.py --listen unix:/tmp/echo.sock --shortname echo [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, cast

import grpc
import grpc.aio
from google.protobuf import json_format
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from agentsidecar.adapter.v1 import adapter_pb2, adapter_pb2_grpc
from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc

SUPPORTED = (
    common_pb2.CAPABILITY_STRUCTURED_OUTPUT,
    common_pb2.CAPABILITY_MODEL_OVERRIDE,
    common_pb2.CAPABILITY_TOOL_REGISTRATION,
    common_pb2.CAPABILITY_TOOL_FILTER,
    common_pb2.CAPABILITY_STATEFUL_HISTORY,
)
STRING_FORMATS = ("email",)
STOP_GRACE_SECONDS = 2.0
DELEGATION_DEPTH_METADATA = "x-delegation-depth"
# Kept back from our own deadline so the delegated answer can still travel home.
DELEGATE_DEADLINE_MARGIN_SECONDS = 0.05


def declaration(shortname: str, streams: bool = False) -> common_pb2.Declaration:
    supported = (*SUPPORTED, common_pb2.CAPABILITY_STREAM_EVENTS) if streams else SUPPORTED
    capabilities = [
        common_pb2.CapabilityDeclaration(
            capability=capability,
            state=(
                common_pb2.CAPABILITY_STATE_SUPPORTED
                if capability in supported
                else common_pb2.CAPABILITY_STATE_UNSUPPORTED
            ),
        )
        for capability in common_pb2.Capability.values()
        if capability != common_pb2.CAPABILITY_UNSPECIFIED
    ]
    return common_pb2.Declaration(
        shortname=shortname,
        kind=common_pb2.ADAPTER_KIND_AGENT_FRAMEWORK,
        capabilities=capabilities,
        string_formats=STRING_FORMATS,
    )


def unsupported_options(options: adapter_pb2.AdapterCallOptions, streams: bool = False) -> list[str]:
    """Every option this adapter was sent but does not implement."""
    fields = [name for name in ("effort", "profile", "persona", "max_depth") if options.HasField(name)]
    if options.settings.fields:
        fields.append("settings")
    if options.stream_events and not streams:
        fields.append("stream_events")
    if options.mcp_servers:
        fields.append("mcp_servers")
    if options.max_depth_provider_managed:
        fields.append("max_depth_provider_managed")
    return fields


def schema_formats(schema: Any) -> Iterator[str]:
    """Every `format` keyword in a schema (crudely: any string-valued "format" key)."""
    if isinstance(schema, Mapping):
        for key, value in schema.items():
            if key == "format" and isinstance(value, str):
                yield value
            elif key not in ("enum", "const", "default", "examples"):
                yield from schema_formats(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from schema_formats(item)


class EchoAdapter(adapter_pb2_grpc.AdapterServiceServicer):
    def __init__(self, shortname: str, streams: bool = False) -> None:
        self._declaration = declaration(shortname, streams)
        self._streams = streams

    async def GetDeclaration(
        self, request: adapter_pb2.GetDeclarationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adapter_pb2.GetDeclarationResponse:
        # Revision 1 of the contract: CallWithTools, conversation state and the rest are implemented.
        return adapter_pb2.GetDeclarationResponse(declaration=self._declaration, contract_revision=1)

    async def Invoke(
        self, request: adapter_pb2.InvokeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adapter_pb2.InvokeResponse:
        await _refuse_unsupported(request.options, context, self._streams)
        await _act_on(request.prompt, "Invoke", context)
        if request.prompt.startswith("delegate:"):
            text = await _delegate(request.prompt.removeprefix("delegate:"), request.options, context)
            return adapter_pb2.InvokeResponse(text="remote:" + text)
        if request.prompt.startswith("options:"):
            metadata = dict(context.invocation_metadata() or ())
            seen = {
                "options": json_format.MessageToDict(request.options),
                "metadata_delegation_depth": metadata.get("x-delegation-depth"),
                "metadata_traceparent": metadata.get("traceparent"),
                "time_remaining": context.time_remaining(),
            }
            return adapter_pb2.InvokeResponse(text="remote:" + json.dumps(seen))
        return _invoke_reply(request, "remote:" + request.prompt)

    async def Produce(
        self, request: adapter_pb2.ProduceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adapter_pb2.ProduceResponse:
        await _refuse_unsupported(request.options, context, self._streams)
        await _refuse_unsupported_formats(request, context)
        await _act_on(request.prompt, "Produce", context)
        return _produce_reply(request, {})

    async def CallWithTools(
        self,
        request_iterator: AsyncIterator[adapter_pb2.CallWithToolsRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[adapter_pb2.CallWithToolsResponse]:
        first = await anext(request_iterator, None)
        if first is None or not first.HasField("start"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be start")
        start = first.start
        call = start.produce if start.HasField("produce") else start.invoke
        await _refuse_unsupported(call.options, context, self._streams)
        if start.HasField("produce"):
            await _refuse_unsupported_formats(start.produce, context)
        prompt = call.prompt
        extra: dict[str, Any] = {}
        if prompt == "noreply:":
            return
        if prompt == "tools:":
            extra["tools"] = [tool.name for tool in start.tools]
        for hook in ("tool:", "badjson:", "nanargs:", "loop:", "toolthenfail:"):
            if not prompt.startswith(hook):
                continue
            name, _, arguments = prompt.removeprefix(hook).partition(":")
            if hook == "badjson:":
                arguments = "{not json"
            elif hook == "nanargs:":
                arguments = "NaN"
            for index in itertools.count(1):
                if start.stream:
                    yield adapter_pb2.CallWithToolsResponse(delta=f"calling {name} ")
                    if call.options.stream_events:
                        event = adapter_pb2.AdapterEvent(type="tool", text=name)
                        yield adapter_pb2.CallWithToolsResponse(event=event)
                yield adapter_pb2.CallWithToolsResponse(
                    tool_call=adapter_pb2.AdapterToolCall(
                        call_id=f"call-{index}",
                        name=name,
                        arguments_json="{}" if hook == "toolthenfail:" else arguments or "{}",
                    )
                )
                if hook == "toolthenfail:":
                    await _act_on(f"fail:{arguments}", "CallWithTools", context)
                try:
                    answer = await anext(request_iterator, None)
                except asyncio.CancelledError:
                    print(f"CANCELLED CallWithTools {prompt}", flush=True)
                    raise
                if answer is None:
                    # The negotiator ended the call before the outcome came (its caller
                    # cancelled, or the deadline passed): the request stream simply ends.
                    print(f"CANCELLED CallWithTools {prompt}", flush=True)
                    return
                if not answer.HasField("tool_outcome"):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "expected the tool's outcome")
                extra["tool"] = _outcome_json(name, answer.tool_outcome)
                if hook != "loop:":
                    break
        if start.HasField("produce"):
            reply = adapter_pb2.CallWithToolsResponse(produce=_produce_reply(start.produce, extra))
        else:
            text = "remote:" + (json.dumps(extra.get("tool", extra.get("tools"))) if extra else prompt)
            reply = adapter_pb2.CallWithToolsResponse(invoke=_invoke_reply(start.invoke, text))
        yield reply
        if prompt == "twice:":
            yield reply
        elif prompt == "replythenfail:":
            await context.abort(grpc.StatusCode.INTERNAL, "failed after replying")

    async def InvokeStream(
        self, request: adapter_pb2.InvokeStreamRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[adapter_pb2.InvokeStreamResponse]:
        prompt = request.invoke.prompt
        try:
            async for piece in self._streamed(prompt, request.invoke.options, context):
                yield adapter_pb2.InvokeStreamResponse(**piece)
            if prompt == "nofinal:":
                return
            final = await self.Invoke(request.invoke, context)
            if prompt.startswith("chunks:"):
                final = adapter_pb2.InvokeResponse(text="".join(_chunks(prompt)))
            else:
                for half in _halves(final.text):
                    yield adapter_pb2.InvokeStreamResponse(delta=half)
            yield adapter_pb2.InvokeStreamResponse(final=final)
            if prompt == "twofinals:":
                yield adapter_pb2.InvokeStreamResponse(final=final)
            elif prompt == "deltaafterfinal:":
                yield adapter_pb2.InvokeStreamResponse(delta="late")
        except asyncio.CancelledError:
            print(f"CANCELLED InvokeStream {prompt}", flush=True)
            raise

    async def ProduceStream(
        self, request: adapter_pb2.ProduceStreamRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[adapter_pb2.ProduceStreamResponse]:
        prompt = request.produce.prompt
        async for piece in self._streamed(prompt, request.produce.options, context):
            yield adapter_pb2.ProduceStreamResponse(**piece)
        final = await self.Produce(request.produce, context)
        for half in _halves(final.output_json):
            yield adapter_pb2.ProduceStreamResponse(delta=half)
        yield adapter_pb2.ProduceStreamResponse(final=final)

    @staticmethod
    async def _streamed(
        prompt: str, options: adapter_pb2.AdapterCallOptions, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """The stream hooks' messages before the final, as keyword arguments of a stream response."""
        if prompt == "unimplemented:":
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this call cannot be streamed")
        if prompt in ("nofinal:", "twofinals:", "deltaafterfinal:") or prompt.startswith("deltathenfail:"):
            yield {"delta": "first"}
        if prompt.startswith("deltathenfail:"):
            await _act_on("fail:" + prompt.removeprefix("deltathenfail:"), "InvokeStream", context)
        if prompt.startswith("flood:"):
            for _ in range(int(prompt.removeprefix("flood:"))):
                yield {"delta": "x" * (1 << 20)}
        if prompt.startswith("chunks:"):
            interval = float(prompt.split(":")[2])
            for index, chunk in enumerate(_chunks(prompt), 1):
                if index > 1:
                    await asyncio.sleep(interval)
                handed_over = time.monotonic()
                yield {"delta": chunk}
                print(f"DELTA {index} {handed_over}", flush=True)
                if options.stream_events:
                    yield {"event": adapter_pb2.AdapterEvent(type="progress", text=str(index))}


def _chunks(prompt: str) -> list[str]:
    """The deltas a "chunks:<n>:<seconds>" prompt sends."""
    return [f"part{index} " for index in range(1, int(prompt.split(":")[1]) + 1)]


def _halves(text: str) -> tuple[str, str]:
    middle = len(text) // 2
    return text[:middle], text[middle:]


def _outcome_json(name: str, outcome: adapter_pb2.ToolOutcome) -> dict[str, Any]:
    if outcome.HasField("result_json"):
        return {"tool": name, "result": json.loads(outcome.result_json)}
    return {"tool": name, "error": outcome.error, "denied": outcome.denied}


def _next_state(
    options: adapter_pb2.AdapterCallOptions, state: Any, has_state: bool, prompt: str
) -> dict[str, Any] | None:
    """The conversation state after this call, or None outside a conversation."""
    if not options.HasField("conversation_id"):
        return None
    previous: dict[str, Any] = json_format.MessageToDict(state) if has_state else {"turns": 0, "prompts": []}
    return {"turns": int(previous["turns"]) + 1, "prompts": [*previous["prompts"], prompt]}


def _invoke_reply(request: adapter_pb2.InvokeRequest, text: str) -> adapter_pb2.InvokeResponse:
    state = _next_state(
        request.options, request.conversation_state, request.HasField("conversation_state"), request.prompt
    )
    response = adapter_pb2.InvokeResponse(text=text)
    if state is not None:
        response.text += f" (turn {state['turns']})"
        json_format.ParseDict(state, response.conversation_state)
    return response


def _produce_reply(request: adapter_pb2.ProduceRequest, extra: dict[str, Any]) -> adapter_pb2.ProduceResponse:
    output: dict[str, Any] = {"echo": request.prompt, **extra}
    if request.options.HasField("model"):
        output["model"] = request.options.model
    response = adapter_pb2.ProduceResponse(output_json=json.dumps(output))
    state = _next_state(
        request.options, request.conversation_state, request.HasField("conversation_state"), request.prompt
    )
    if state is not None:
        json_format.ParseDict(state, response.conversation_state)
    return response


async def _refuse_unsupported(
    options: adapter_pb2.AdapterCallOptions, context: grpc.aio.ServicerContext[Any, Any], streams: bool
) -> None:
    unsupported = unsupported_options(options, streams)
    if unsupported:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION, f"this adapter does not implement: {', '.join(unsupported)}"
        )


async def _refuse_unsupported_formats(
    request: adapter_pb2.ProduceRequest, context: grpc.aio.ServicerContext[Any, Any]
) -> None:
    try:
        schema = json.loads(request.output_schema)
    except json.JSONDecodeError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"output_schema is not JSON: {exc}")
    formats = sorted(set(schema_formats(schema)) - set(STRING_FORMATS))
    if formats:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION, f"unsupported string formats: {', '.join(formats)}"
        )


def received_depth(options: adapter_pb2.AdapterCallOptions, metadata: Iterable[tuple[str, Any]]) -> int:
    """This call's delegation depth: the options' and the metadata's, the deeper of the two."""
    depth = options.delegation_depth
    for key, value in metadata:
        text = value.decode() if isinstance(value, bytes) else str(value)
        if key == DELEGATION_DEPTH_METADATA and text.isdigit():
            depth = max(depth, int(text))
    return depth


async def _delegate(
    spec: str, options: adapter_pb2.AdapterCallOptions, context: grpc.aio.ServicerContext[Any, Any]
) -> str:
    """Invoke an adapter through a negotiator, one level deeper than this call."""
    scheme, _, rest = spec.partition(":")
    location, _, rest = rest.partition(":")
    adapter, _, prompt = rest.partition(":")
    if not (scheme and location and adapter and prompt):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            "expected delegate:<target>:<adapter>:<prompt>, e.g. delegate:unix:/s:a:hi",
        )
    depth = received_depth(options, context.invocation_metadata() or ())
    remaining = context.time_remaining()
    timeout = None if remaining is None else max(remaining - DELEGATE_DEADLINE_MARGIN_SECONDS, 0.0)
    async with grpc.aio.insecure_channel(f"{scheme}:{location}") as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        try:
            response = await stub.Invoke(
                negotiator_pb2.InvokeRequest(adapter=adapter, prompt=prompt),
                timeout=timeout,
                metadata=((DELEGATION_DEPTH_METADATA, str(depth + 1)),),
            )
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), f"delegated call at depth {depth + 1} failed: {exc.details()}")
    text: str = response.text
    return text


async def _act_on(prompt: str, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    """Honour the sleep:/fail: test hooks."""
    if prompt.startswith("sleep:"):
        try:
            seconds = float(prompt.removeprefix("sleep:"))
        except ValueError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad sleep prompt {prompt!r}")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            print(f"CANCELLED {method} {prompt}", flush=True)
            raise
    elif prompt.startswith("fail:"):
        name = prompt.removeprefix("fail:")
        code = grpc.StatusCode.__members__.get(name)
        if code is None or code is grpc.StatusCode.OK:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown status code {name!r}")
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            retry = error_details_pb2.RetryInfo()
            retry.retry_delay.FromSeconds(2)
            status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="scripted failure")
            status.details.add().Pack(retry)
            await context.abort(
                code, status.message, trailing_metadata=rpc_status.to_status(status).trailing_metadata
            )
        await context.abort(code, f"scripted failure {name}")


class _LogRpcs(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Prints "RPC <method>" as each call arrives, served or not."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        print(f"RPC {handler_call_details.method.rpartition('/')[2]}", flush=True)
        return await continuation(handler_call_details)


class _Handlers:
    """Takes the method handlers the generated code would add to a server."""

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service, self.handlers = service, handlers


async def serve(
    listen: str, shortname: str, streams: bool = False, stream_rpcs: bool = True, log_rpcs: bool = False
) -> None:
    server = grpc.aio.server(
        interceptors=[_LogRpcs()] if log_rpcs else None, options=[("grpc.so_reuseport", 0)]
    )
    servicer = EchoAdapter(shortname, streams)
    if stream_rpcs:
        adapter_pb2_grpc.add_AdapterServiceServicer_to_server(servicer, server)
    else:
        # Served as by a build from before the stream RPCs: grpc answers them UNIMPLEMENTED.
        taken = _Handlers()
        adapter_pb2_grpc.add_AdapterServiceServicer_to_server(servicer, cast(grpc.Server, taken))
        kept = {n: h for n, h in taken.handlers.items() if n not in ("InvokeStream", "ProduceStream")}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(taken.service, kept),))
    port = server.add_insecure_port(listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {listen}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    address = listen if listen.startswith("unix:") else f"{listen.rpartition(':')[0]}:{port}"
    print(f"READY {address}", flush=True)
    await stop.wait()
    await server.stop(STOP_GRACE_SECONDS)
    print("STOPPED", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--listen", required=True, help="unix:PATH or HOST:PORT (port 0 picks one)")
    parser.add_argument("--shortname", default="example-remote", help="the declared shortname")
    parser.add_argument("--stream", action="store_true", help="declare stream_events and stream")
    parser.add_argument("--no-stream-rpc", action="store_true", help="with --stream: lack the stream RPCs")
    parser.add_argument("--log-rpcs", action="store_true", help='print "RPC <method>" for every call')
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen, args.shortname, args.stream, not args.no_stream_rpc, args.log_rpcs))


if __name__ == "__main__":
    main()
