"""A remote adapter in Python: agentsidecar.adapter.v1 served for a negotiator to broker.

It declares structured output and streaming (stream_events), nothing else; its "model"
echoes the prompt, streamed word by word by InvokeStream. Put your agent where `words`
is. The contract: protos/README.md, "The adapter contract".

    python examples/remote_adapter.py --listen unix:/tmp/echo.sock [--shortname echo]
    negotiator register unix:/tmp/echo.sock --shortname echo
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agentsidecar.adapter.v1 import adapter_pb2, adapter_pb2_grpc
from agentsidecar.common.v1 import common_pb2

SUPPORTED = {common_pb2.CAPABILITY_STRUCTURED_OUTPUT, common_pb2.CAPABILITY_STREAM_EVENTS}
ALWAYS_SENT = {"time_budget", "delegation_depth", "stream_events"}
Context = grpc.aio.ServicerContext[Any, Any]


def declaration(shortname: str) -> common_pb2.Declaration:
    """Every capability stated: SUPPORTED for what this adapter does, UNSUPPORTED for the rest."""
    yes, no = common_pb2.CAPABILITY_STATE_SUPPORTED, common_pb2.CAPABILITY_STATE_UNSUPPORTED
    states = [
        common_pb2.CapabilityDeclaration(capability=capability, state=yes if capability in SUPPORTED else no)
        for capability in common_pb2.Capability.values()
        if capability != common_pb2.CAPABILITY_UNSPECIFIED
    ]
    kind = common_pb2.ADAPTER_KIND_AGENT_FRAMEWORK
    return common_pb2.Declaration(shortname=shortname, kind=kind, capabilities=states)


async def words(prompt: str) -> AsyncIterator[str]:
    """The stub model: the reply "echo: <prompt>", a word at a time."""
    for word in f"echo: {prompt}".split(" "):
        await asyncio.sleep(0.05)  # a model takes time per token
        yield word + " "


class EchoAdapter(adapter_pb2_grpc.AdapterServiceServicer):
    def __init__(self, shortname: str) -> None:
        self._declaration = declaration(shortname)

    async def GetDeclaration(
        self, request: adapter_pb2.GetDeclarationRequest, context: Context
    ) -> adapter_pb2.GetDeclarationResponse:
        return adapter_pb2.GetDeclarationResponse(declaration=self._declaration, contract_revision=1)

    async def Invoke(
        self, request: adapter_pb2.InvokeRequest, context: Context
    ) -> adapter_pb2.InvokeResponse:
        await refuse_unsupported(request.options, context)
        return adapter_pb2.InvokeResponse(text="".join([w async for w in words(request.prompt)]))

    async def InvokeStream(
        self, request: adapter_pb2.InvokeStreamRequest, context: Context
    ) -> AsyncIterator[adapter_pb2.InvokeStreamResponse]:
        options = request.invoke.options
        await refuse_unsupported(options, context)
        if options.stream_events:  # events only when the caller asked for them
            yield adapter_pb2.InvokeStreamResponse(event=adapter_pb2.AdapterEvent(type="started"))
        text = ""
        # A caller that goes away cancels this handler at its next await: nothing to clean up here.
        async for word in words(request.invoke.prompt):
            text += word
            yield adapter_pb2.InvokeStreamResponse(delta=word)
        yield adapter_pb2.InvokeStreamResponse(final=adapter_pb2.InvokeResponse(text=text))

    async def Produce(
        self, request: adapter_pb2.ProduceRequest, context: Context
    ) -> adapter_pb2.ProduceResponse:
        await refuse_unsupported(request.options, context)
        # The negotiator validates the output against request.output_schema.
        return adapter_pb2.ProduceResponse(output_json=json.dumps({"echo": request.prompt}))

    async def ProduceStream(
        self, request: adapter_pb2.ProduceStreamRequest, context: Context
    ) -> AsyncIterator[adapter_pb2.ProduceStreamResponse]:
        yield adapter_pb2.ProduceStreamResponse(final=await self.Produce(request.produce, context))

    async def CallWithTools(
        self, request_iterator: AsyncIterator[adapter_pb2.CallWithToolsRequest], context: Context
    ) -> AsyncIterator[adapter_pb2.CallWithToolsResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "never called: tool_registration is UNSUPPORTED")
        yield adapter_pb2.CallWithToolsResponse()  # not reached; makes this a stream handler


async def refuse_unsupported(options: adapter_pb2.AdapterCallOptions, context: Context) -> None:
    """FAILED_PRECONDITION for an option set beyond those every call may carry, as the contract asks."""
    unsupported = sorted(field.name for field, _ in options.ListFields() if field.name not in ALWAYS_SENT)
    if unsupported:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"not implemented: {', '.join(unsupported)}")


async def serve(listen: str, shortname: str) -> None:
    server = grpc.aio.server()
    adapter_pb2_grpc.add_AdapterServiceServicer_to_server(EchoAdapter(shortname), server)
    port = server.add_insecure_port(listen)
    await server.start()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    address = listen if listen.startswith("unix:") else f"{listen.rpartition(':')[0]}:{port}"
    print(f"READY {address}", flush=True)
    await stop.wait()
    await server.stop(2.0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="An echo agent as a remote adapter.")
    parser.add_argument("--listen", required=True, help="unix:PATH or HOST:PORT (port 0 picks one)")
    parser.add_argument("--shortname", default="echo")
    args = parser.parse_args()
    asyncio.run(serve(args.listen, args.shortname))
