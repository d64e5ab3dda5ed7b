"""Rebuilding grpc.aio method handlers around the application's behaviours.

The runtime's interceptors (auth, limits, observability) each wrap the
handler grpc found for a call. Two rules keep their stacking predictable:

* every wrapped behaviour is a coroutine function: a response-streaming
  behaviour written as an async generator is driven with `context.write`
  and closed explicitly, so each wrapper's `finally` runs when the call
  ends rather than whenever the generator is garbage-collected;
* a rebuilt handler keeps the method's shape and (de)serializers, so a
  replacement that only aborts still reads the request as grpc expects.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc

from sidecar_runtime.richstatus import RichError, abort_with

# (request or request iterator, context) -> response, or None for streamed responses.
Behavior = Callable[[Any, Any], Awaitable[Any]]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Continuation: TypeAlias = "Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]]"


def service_and_method(full_method: str) -> tuple[str, str]:
    """`/pkg.Service/Method` -> (`pkg.Service`, `Method`)."""
    service, _, method = full_method.lstrip("/").partition("/")
    return service, method


def current_behavior(handler: Handler) -> Callable[..., Any]:
    behavior: Callable[..., Any] | None
    if handler.request_streaming:
        behavior = handler.stream_stream if handler.response_streaming else handler.stream_unary
    else:
        behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary
    if behavior is None:
        raise TypeError("a method handler without a behaviour")
    return behavior


def as_coroutine(behavior: Callable[..., Any]) -> Behavior | None:
    """The behaviour as a coroutine function; None for synchronous behaviours (left unwrapped)."""
    if inspect.isasyncgenfunction(behavior):

        async def drive_stream(request: Any, context: Any) -> None:
            responses: AsyncIterator[Any] = behavior(request, context)
            try:
                async for response in responses:
                    await context.write(response)
            finally:
                await responses.aclose()  # type: ignore[attr-defined]

        return drive_stream
    if inspect.iscoroutinefunction(behavior):
        coroutine_behavior: Behavior = behavior
        return coroutine_behavior
    return None


def rebuild(handler: Handler, behavior: Behavior) -> Handler:
    """A handler of the same shape and serializers as `handler`, running `behavior`."""
    deserialize, serialize = handler.request_deserializer, handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behavior, deserialize, serialize)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behavior, deserialize, serialize)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behavior, deserialize, serialize)
    return grpc.unary_unary_rpc_method_handler(behavior, deserialize, serialize)


def wrap(handler: Handler, make: Callable[[Behavior], Behavior]) -> Handler:
    """`handler` with its behaviour replaced by `make(behaviour)`; sync handlers are returned as is."""
    inner = as_coroutine(current_behavior(handler))
    if inner is None:
        return handler
    return rebuild(handler, make(inner))


class WrapCache:
    """Wrapped handlers by method, rebuilt only when the inner handler changes.

    grpc hands an interceptor the same handler object for every call of a
    method, so wrapping once per method (not per call) keeps the per-call
    cost of an interceptor to its behaviour. A per-call inner handler (a
    refusal from an interceptor further in) simply replaces the entry.
    """

    def __init__(self, make: Callable[[str, Behavior], Behavior]) -> None:
        self._make = make
        self._entries: dict[str, tuple[Handler, Handler]] = {}

    def get(self, method: str, handler: Handler) -> Handler:
        entry = self._entries.get(method)
        if entry is not None and entry[0] is handler:
            return entry[1]
        wrapped = wrap(handler, lambda inner: self._make(method, inner))
        self._entries[method] = (handler, wrapped)
        return wrapped


def rejecting(handler: Handler, error: RichError) -> Handler:
    """A handler of the same shape as `handler` that ends every call with `error`."""

    async def reject(request: Any, context: Any) -> None:
        await abort_with(context, error)

    return rebuild(handler, reject)
