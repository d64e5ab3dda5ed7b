"""The floors under the negotiator's figures: its Invoke method with no negotiation at all.

`python bench/floor_server.py --listen ADDR [--forward URL]` prints
`READY floor <target>` once serving `agentsidecar.negotiator.v1.NegotiatorService/Invoke`
(that method only), hosted like the echo baseline by the sidecars' own
`start_server`:

* without `--forward`, each call parses the InvokeRequest and answers with
  its prompt: what the scripted bench adapter returns, without the
  declaration check, judgement, decision record or call log, so protobuf in
  and out is all that is left;
* with `--forward URL`, each call posts the prompt to that chat-completions
  URL with aiohttp, the fastest Python HTTP client measured here and the one
  the openai adapter uses, as the adapter does (one pooled ClientSession, no
  aiohttp timeouts, the URL parsed once, the adapter's default headers, the
  body as compact JSON bytes, no redirect followed), and answers with the
  reply's content: the least work any Python gRPC-to-HTTP forwarder does;
  its `InvokeStream` posts the same way with `stream: true` (and
  `Accept-Encoding: identity`) and writes an (empty) decision, each SSE
  content delta as it arrives, then the final text: the least any Python
  gRPC-to-SSE forwarder does.

Measured in the same run as the echo baseline and the negotiator, they split
each gap to a goal into what grpc.aio, protobuf (and aiohttp) cost any Python
service on this machine and what the negotiator adds on top.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import aiohttp
import grpc
from yarl import URL

from agentsidecar.negotiator.v1 import negotiator_pb2
from agentsidecar.sidecar_runtime.server import ServerOptions, serve_until_signalled, start_server

SERVICE = "agentsidecar.negotiator.v1.NegotiatorService"

if TYPE_CHECKING:
    InvokeContext = grpc.aio.ServicerContext[negotiator_pb2.InvokeRequest, negotiator_pb2.InvokeResponse]
    InvokeMethod = Callable[
        [negotiator_pb2.InvokeRequest, InvokeContext], Awaitable[negotiator_pb2.InvokeResponse]
    ]
    StreamContext = grpc.aio.ServicerContext[
        negotiator_pb2.InvokeStreamRequest, negotiator_pb2.InvokeStreamResponse
    ]
    StreamMethod = Callable[[negotiator_pb2.InvokeStreamRequest, StreamContext], Awaitable[None]]


async def _answer_with_prompt(
    request: negotiator_pb2.InvokeRequest, context: InvokeContext
) -> negotiator_pb2.InvokeResponse:
    return negotiator_pb2.InvokeResponse(text=request.prompt)


# The openai adapter's default headers; Accept and Accept-Encoding are aiohttp's own.
DEFAULT_HEADERS = {
    "User-Agent": (
        f"agentsidecar/{importlib.metadata.version('agentsidecar')} "
        f"aiohttp/{importlib.metadata.version('aiohttp')}"
    ),
    "Connection": "keep-alive",
}
UNARY_HEADERS = {"Authorization": "Bearer floor", "Content-Type": "application/json"}
STREAM_HEADERS = {**UNARY_HEADERS, "Accept-Encoding": "identity"}


# The openai adapter's encoder: the bytes it sends, without building an encoder per call.
_JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _json_bytes(body: object) -> bytes:
    return _JSON_ENCODER.encode(body).encode()


def _forwarder(session: aiohttp.ClientSession, url: URL, model: str) -> InvokeMethod:
    async def forward(
        request: negotiator_pb2.InvokeRequest, context: InvokeContext
    ) -> negotiator_pb2.InvokeResponse:
        body = {"model": model, "messages": [{"role": "user", "content": request.prompt}]}
        async with session.post(
            url, data=_json_bytes(body), headers=UNARY_HEADERS, allow_redirects=False
        ) as response:
            content = await response.read()
            response.raise_for_status()
        return negotiator_pb2.InvokeResponse(text=json.loads(content)["choices"][0]["message"]["content"])

    return forward


def _stream_forwarder(session: aiohttp.ClientSession, url: URL, model: str) -> StreamMethod:
    async def forward(request: negotiator_pb2.InvokeStreamRequest, context: StreamContext) -> None:
        await context.write(negotiator_pb2.InvokeStreamResponse(decision=negotiator_pb2.Decision()))
        body = {
            "model": model,
            "messages": [{"role": "user", "content": request.invoke.prompt}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        text = []
        async with session.post(
            url, data=_json_bytes(body), headers=STREAM_HEADERS, allow_redirects=False
        ) as response:
            response.raise_for_status()
            async for raw in response.content:
                line = raw.decode().rstrip("\r\n")
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                piece = (choices[0].get("delta") or {}).get("content")
                if piece:
                    text.append(piece)
                    await context.write(negotiator_pb2.InvokeStreamResponse(delta=piece))
        final = negotiator_pb2.InvokeResponse(text="".join(text))
        await context.write(negotiator_pb2.InvokeStreamResponse(final=final))

    return forward


async def _serve(listen: list[str], forward: str | None, model: str) -> None:
    session = aiohttp.ClientSession(headers=DEFAULT_HEADERS, timeout=aiohttp.ClientTimeout())
    invoke: InvokeMethod = (
        _answer_with_prompt if forward is None else _forwarder(session, URL(forward), model)
    )

    def register(server: grpc.aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(
            invoke,
            request_deserializer=negotiator_pb2.InvokeRequest.FromString,
            response_serializer=negotiator_pb2.InvokeResponse.SerializeToString,
        )
        handlers = {"Invoke": handler}
        if forward is not None:
            handlers["InvokeStream"] = grpc.unary_stream_rpc_method_handler(
                _stream_forwarder(session, URL(forward), model),
                request_deserializer=negotiator_pb2.InvokeStreamRequest.FromString,
                response_serializer=negotiator_pb2.InvokeStreamResponse.SerializeToString,
            )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    try:
        running = await start_server(register, (SERVICE,), ServerOptions(listen=listen, grace_seconds=1.0))
        await serve_until_signalled(running, "floor")
    finally:
        await session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--listen", action="append", required=True, help="unix:PATH or HOST:PORT")
    parser.add_argument("--forward", metavar="URL", help="a chat-completions URL to post each prompt to")
    parser.add_argument("--model", default="bench-model", help="the model named in forwarded bodies")
    args = parser.parse_args()
    asyncio.run(_serve(args.listen, args.forward, args.model))


if __name__ == "__main__":
    main()
