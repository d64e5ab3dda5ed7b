"""A remote adapter whose declaration is chosen on the command line, for the "remote stays current" tests.

    python versioned_remote.py --listen unix:PATH --shortname NAME [--effort supported|unsupported]
                               [--label TEXT] [--model-effort MODEL:LEVEL[,LEVEL]]... [--default-model M]

It declares stateful_history and effort (as --effort says; every other
capability unsupported), serves grpc.health.v1 (SIGUSR1 turns it
NOT_SERVING, SIGUSR2 SERVING again), and answers Invoke with
"<label>:<prompt>", refusing an effort it does not declare with
FAILED_PRECONDITION. Each --model-effort adds a per-model entry declaring
effort supported for MODEL at those levels (everything else as the adapter
level says); --default-model is the model of a call naming none.
In a conversation its state is {"turns": n}.

Prints `READY <address>` once serving; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
from google.protobuf import struct_pb2
from grpc_health.v1 import _async as health_aio  # the public alias `health.aio` is invisible to mypy
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentsidecar.adapter.v1 import adapter_pb2, adapter_pb2_grpc
from agentsidecar.common.v1 import common_pb2


def declaration(
    shortname: str, effort: bool, model_efforts: dict[str, list[str]] | None = None, default_model: str = ""
) -> common_pb2.Declaration:
    return common_pb2.Declaration(
        shortname=shortname,
        kind=common_pb2.ADAPTER_KIND_AGENT_FRAMEWORK,
        capabilities=capability_states(effort),
        default_model=default_model,
        models=[
            common_pb2.ModelDeclaration(
                model=model, capabilities=capability_states(True), effort_levels=levels
            )
            for model, levels in sorted((model_efforts or {}).items())
        ],
    )


def capability_states(effort: bool) -> list[common_pb2.CapabilityDeclaration]:
    supported = {common_pb2.CAPABILITY_STATEFUL_HISTORY} | (
        {common_pb2.CAPABILITY_EFFORT} if effort else set()
    )
    return [
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


class VersionedAdapter(adapter_pb2_grpc.AdapterServiceServicer):
    def __init__(
        self,
        shortname: str,
        effort: bool,
        label: str,
        model_efforts: dict[str, list[str]],
        default_model: str,
    ) -> None:
        self._declaration = declaration(shortname, effort, model_efforts, default_model)
        self._effort = effort
        self._model_efforts = model_efforts
        self._default_model = default_model
        self._label = label

    async def GetDeclaration(
        self, request: adapter_pb2.GetDeclarationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adapter_pb2.GetDeclarationResponse:
        return adapter_pb2.GetDeclarationResponse(declaration=self._declaration, contract_revision=1)

    async def Invoke(
        self, request: adapter_pb2.InvokeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adapter_pb2.InvokeResponse:
        model = request.options.model if request.options.HasField("model") else self._default_model
        levels = self._model_efforts.get(model)
        if levels is not None and request.options.HasField("effort"):
            if request.options.effort not in levels:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{model} takes effort {levels}")
        elif request.options.HasField("effort") and not self._effort:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "effort is not implemented")
        response = adapter_pb2.InvokeResponse(text=f"{self._label}:{request.prompt}")
        if request.options.conversation_id:
            turns = 0
            if request.HasField("conversation_state"):
                turns = int(request.conversation_state.struct_value.fields["turns"].number_value)
            state = struct_pb2.Struct()
            state.update({"turns": turns + 1})
            response.conversation_state.struct_value.CopyFrom(state)
        return response

    async def Produce(
        self, request: adapter_pb2.ProduceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adapter_pb2.ProduceResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "structured output is not declared")
        raise AssertionError("abort never returns")

    async def CallWithTools(
        self,
        request_iterator: AsyncIterator[adapter_pb2.CallWithToolsRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[adapter_pb2.CallWithToolsResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "tools are not declared")
        yield adapter_pb2.CallWithToolsResponse()  # never reached: makes this an async generator

    async def InvokeStream(
        self, request: adapter_pb2.InvokeStreamRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[adapter_pb2.InvokeStreamResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "stream_events is not declared")
        yield adapter_pb2.InvokeStreamResponse()  # never reached: makes this an async generator

    async def ProduceStream(
        self, request: adapter_pb2.ProduceStreamRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[adapter_pb2.ProduceStreamResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "structured output is not declared")
        yield adapter_pb2.ProduceStreamResponse()  # never reached: makes this an async generator


async def serve(
    listen: str,
    shortname: str,
    effort: bool,
    label: str,
    model_efforts: dict[str, list[str]],
    default_model: str,
) -> None:
    server = grpc.aio.server()
    adapter = VersionedAdapter(shortname, effort, label, model_efforts, default_model)
    adapter_pb2_grpc.add_AdapterServiceServicer_to_server(adapter, server)
    health_servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(listen)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    pending: set[asyncio.Task[None]] = set()

    def set_health(status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None:
        task = loop.create_task(health_servicer.set("", status))
        pending.add(task)
        task.add_done_callback(pending.discard)

    loop.add_signal_handler(signal.SIGUSR1, set_health, health_pb2.HealthCheckResponse.NOT_SERVING)
    loop.add_signal_handler(signal.SIGUSR2, set_health, health_pb2.HealthCheckResponse.SERVING)
    print(f"READY {listen if listen.startswith('unix:') else f'127.0.0.1:{port}'}", flush=True)
    await stop.wait()
    await server.stop(0.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument("--shortname", required=True)
    parser.add_argument("--effort", choices=("supported", "unsupported"), default="unsupported")
    parser.add_argument("--label", default="v1")
    parser.add_argument("--model-effort", action="append", default=[], metavar="MODEL:LEVEL[,LEVEL]")
    parser.add_argument("--default-model", default="")
    args = parser.parse_args()
    model_efforts = {
        model: levels.split(",") for model, _, levels in (item.partition(":") for item in args.model_effort)
    }
    asyncio.run(
        serve(
            args.listen,
            args.shortname,
            args.effort == "supported",
            args.label,
            model_efforts,
            args.default_model,
        )
    )


if __name__ == "__main__":
    main()
