"""Rebuilding grpc.aio method handlers around the application's behaviours.

One interceptor, `RuntimeInterceptor`, wraps every method the server knows
in the runtime's layers (call log and metrics, bearer tokens, the concurrent
call limit, the default timeout: each a `Layer`, installed only when its
option is on) and in the check that turns undecodable request bytes into
INVALID_ARGUMENT. The wrapped handler is built once per method and reused:
grpc asks the interceptor for a handler on every call, and hands it the same
handler object each time, so the per-call cost of the runtime is one dict
lookup plus what the layers do while the call runs.

Rules that keep the layers' stacking predictable:

* every wrapped behaviour is a coroutine function: a response-streaming
  behaviour written as an async generator is driven with `context.write`
  and closed explicitly, so each layer's `finally` runs when the call ends
  rather than whenever the generator is garbage-collected;
* a rebuilt handler keeps the method's shape and serializers, so a
  replacement that only aborts still reads the request as grpc expects.

Undecodable requests: grpc.aio deserializes a request before any handler
code runs and answers UNKNOWN ("Unexpected DecodeError") when that fails.
The rebuilt handler's deserializer returns an `Undecodable` marker instead,
and the innermost layer ends the call with INVALID_ARGUMENT, ErrorInfo
reason MALFORMED_REQUEST (domain runtime.agentsidecar) and a BadRequest
violation on `request` naming the expected message type. In a request
stream, the marker ends the call when the servicer reaches it. A servicer
reading its request stream with `context.read()` instead of iterating it
gets the marker itself (no servicer here does).

Invocation metadata: grpc.aio builds a fresh tuple of it on every
`context.invocation_metadata()`, and it has already built one for the
interceptor, so reading it again is repeated work for one value. The
interceptor keeps that one for the rest of the call in a context variable
(grpc.aio runs an RPC's interceptors and its handler in one task, so the
variable holds exactly this call's metadata there), and
`call_metadata(context)` answers from it; without the interceptor it asks
the context.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import grpc

from agentsidecar.sidecar_runtime.richstatus import RichError, abort_with

# (request or request iterator, context) -> response, or None for streamed responses.
Behavior = Callable[[Any, Any], Awaitable[Any]]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Continuation: TypeAlias = "Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]]"
Metadata: TypeAlias = "Sequence[tuple[str, Any]] | None"

DOMAIN = "runtime.agentsidecar"
MALFORMED_REQUEST = "MALFORMED_REQUEST"
MAX_DECODE_ERROR_CHARS = 200


# This call's invocation metadata, as the RuntimeInterceptor received it.
_CALL_METADATA: contextvars.ContextVar[Metadata] = contextvars.ContextVar("call_metadata", default=None)


def call_metadata(context: Any) -> Metadata:
    """The invocation metadata of the call `context` serves, without grpc rebuilding it per read."""
    metadata = _CALL_METADATA.get()
    if metadata is None:
        return context.invocation_metadata()  # type: ignore[no-any-return]
    return metadata


def service_and_method(full_method: str) -> tuple[str, str]:
    """`/pkg.Service/Method` -> (`pkg.Service`, `Method`)."""
    service, _, method = full_method.lstrip("/").partition("/")
    return service, method


@dataclass(frozen=True, slots=True)
class MethodInfo:
    """What a layer may want to know about the method it wraps."""

    full_name: str  # /pkg.Service/Method
    service: str
    name: str
    request_streaming: bool
    response_streaming: bool

    @classmethod
    def of(cls, full_name: str, handler: Handler) -> MethodInfo:
        service, name = service_and_method(full_name)
        return cls(full_name, service, name, handler.request_streaming, handler.response_streaming)


class Layer(Protocol):
    def wrap(self, method: MethodInfo, inner: Behavior) -> Behavior:
        """`inner` with this layer around it, or `inner` itself when the layer does not apply."""
        ...


class SyncRefusal(Protocol):
    def refusal(self, full_method: str, metadata: Metadata) -> RichError | None:
        """The error ending a call to a synchronous behaviour, or None to let it run."""
        ...


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


def rebuild(
    handler: Handler,
    behavior: Behavior,
    deserialize: Callable[[bytes], Any] | None = None,
    serialize: Callable[[Any], bytes] | None = None,
) -> Handler:
    """A handler of the same shape and serializers as `handler`, running `behavior`.

    `deserialize` and `serialize` replace the request deserializer and the
    response serializer when given.
    """
    if deserialize is None:
        deserialize = handler.request_deserializer
    if serialize is None:
        serialize = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behavior, deserialize, serialize)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behavior, deserialize, serialize)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behavior, deserialize, serialize)
    return grpc.unary_unary_rpc_method_handler(behavior, deserialize, serialize)


def rejecting(handler: Handler, error: RichError) -> Handler:
    """A handler of the same shape as `handler` that ends every call with `error`."""

    async def reject(request: Any, context: Any) -> None:
        await abort_with(context, error)

    return rebuild(handler, reject)


# --- undecodable requests ----------------------------------------------------


class Undecodable:
    """What a guarded deserializer returns for bytes it cannot parse."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def guarded(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """`deserialize`, returning an `Undecodable` instead of raising."""

    def guarded_deserialize(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception as exc:  # DecodeError, and whatever else a parser meets in hostile bytes
            return Undecodable(exc)

    return guarded_deserialize


def message_type(deserialize: Callable[[bytes], Any]) -> str | None:
    """The full protobuf name of what `deserialize` parses (`Message.FromString`), if it tells."""
    descriptor = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
    name = getattr(descriptor, "full_name", None)
    return name if isinstance(name, str) else None


def malformed_request(full_method: str, type_name: str | None, error: Exception) -> RichError:
    expected = type_name or "request message"
    detail = (str(error) or type(error).__name__)[:MAX_DECODE_ERROR_CHARS]
    metadata = {"method": full_method}
    if type_name is not None:
        metadata["messageType"] = type_name
    return RichError(
        code=grpc.StatusCode.INVALID_ARGUMENT,
        message=f"{full_method}: the request bytes are not a valid {expected} ({detail})",
        reason=MALFORMED_REQUEST,
        domain=DOMAIN,
        metadata=metadata,
        field_violations=(("request", f"cannot be decoded as {expected} in protobuf binary encoding"),),
    )


def checking_requests(
    full_method: str, type_name: str | None, inner: Behavior, *, streaming: bool
) -> Behavior:
    """`inner`, ending the call with MALFORMED_REQUEST when a request is `Undecodable`."""
    if streaming:

        async def checked_requests(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            async for request in requests:
                if type(request) is Undecodable:
                    await abort_with(context, malformed_request(full_method, type_name, request.error))
                yield request

        async def check_stream(requests: AsyncIterator[Any], context: Any) -> Any:
            return await inner(checked_requests(requests, context), context)

        return check_stream

    async def check(request: Any, context: Any) -> Any:
        if type(request) is Undecodable:
            await abort_with(context, malformed_request(full_method, type_name, request.error))
        return await inner(request, context)

    return check


# --- stream messages ---------------------------------------------------------


class MessageCounts(Protocol):
    """Where a method's stream messages are counted (`metrics.MethodCalls`)."""

    received: int
    sent: int


def counting_received(
    deserialize: Callable[[bytes], Any] | None, counts: MessageCounts
) -> Callable[[bytes], Any]:
    """`deserialize` (None: the bytes as they are), counting each message in `counts.received`.

    grpc calls a method's request deserializer once per message it receives.
    """
    if deserialize is None:

        def count_raw(raw: bytes) -> Any:
            counts.received += 1
            return raw

        return count_raw

    def count(raw: bytes) -> Any:
        counts.received += 1
        return deserialize(raw)

    return count


def counting_sent(serialize: Callable[[Any], bytes] | None, counts: MessageCounts) -> Callable[[Any], bytes]:
    """`serialize` (None: the message is bytes already), counting each message in `counts.sent`.

    grpc calls a method's response serializer once per message it sends.
    """
    if serialize is None:

        def count_raw(message: Any) -> bytes:
            counts.sent += 1
            return message  # type: ignore[no-any-return]

        return count_raw

    def count(message: Any) -> bytes:
        counts.sent += 1
        return serialize(message)

    return count


# --- the interceptor -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Entry:
    source: Handler  # the handler grpc found; a different one means the entry is stale
    handler: Handler  # what the call runs
    synchronous: bool  # a synchronous behaviour, served as registered


class RuntimeInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Every method wrapped in `layers` (outermost first) and the undecodable-request check.

    `on_unknown(full_method, metadata)` hears of calls to methods no handler
    serves (grpc answers them UNIMPLEMENTED). `message_counts(method)`, when
    given, names where a method's stream messages are counted (None: not
    counted): each message of a request stream and of a response stream,
    counted as grpc deserializes or serializes it. Synchronous behaviours
    (none in the sidecars) run as registered, apart from `sync_refusal`,
    which is checked per call as it can end a call before it runs.
    """

    def __init__(
        self,
        layers: Sequence[Layer] = (),
        *,
        on_unknown: Callable[[str, Metadata], None] | None = None,
        sync_refusal: SyncRefusal | None = None,
        message_counts: Callable[[MethodInfo], MessageCounts | None] | None = None,
    ) -> None:
        self._layers = tuple(layers)
        self._on_unknown = on_unknown
        self._sync_refusal = sync_refusal
        self._message_counts = message_counts
        self._entries: dict[str, _Entry] = {}

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler:
        # None (an unknown method, answered UNIMPLEMENTED) although the stubs say otherwise.
        handler: Handler | None = await continuation(handler_call_details)
        full_method: str = handler_call_details.method
        # Every call passes here before its handler runs, so the value is never an earlier call's.
        _CALL_METADATA.set(handler_call_details.invocation_metadata)
        if handler is None:
            if self._on_unknown is not None:
                self._on_unknown(full_method, handler_call_details.invocation_metadata)
            return handler  # type: ignore[return-value]
        entry = self._entries.get(full_method)
        if entry is None or entry.source is not handler:
            # A handler that differs from the cached one (a refusal from an
            # interceptor further in, made per call) simply replaces the entry.
            entry = self._entries[full_method] = self._compose(full_method, handler)
        if entry.synchronous and self._sync_refusal is not None:
            error = self._sync_refusal.refusal(full_method, handler_call_details.invocation_metadata)
            if error is not None:
                return self._compose(full_method, rejecting(handler, error)).handler
        return entry.handler

    def wrap(self, full_method: str, handler: Handler) -> Handler:
        """What calls to `full_method` run when grpc finds `handler` for them."""
        return self._compose(full_method, handler).handler

    def _compose(self, full_method: str, handler: Handler) -> _Entry:
        innermost = as_coroutine(current_behavior(handler))
        if innermost is None:
            return _Entry(handler, handler, synchronous=True)
        behavior = innermost
        deserialize = handler.request_deserializer
        guarded_deserialize = None
        if deserialize is not None:
            guarded_deserialize = guarded(deserialize)
            behavior = checking_requests(
                full_method, message_type(deserialize), behavior, streaming=handler.request_streaming
            )
        info = MethodInfo.of(full_method, handler)
        for layer in reversed(self._layers):
            behavior = layer.wrap(info, behavior)
        serialize = None
        counts = self._message_counts(info) if self._message_counts is not None else None
        if counts is not None:
            if handler.request_streaming:
                guarded_deserialize = counting_received(guarded_deserialize, counts)
            if handler.response_streaming:
                serialize = counting_sent(handler.response_serializer, counts)
        if behavior is innermost and counts is None:
            return _Entry(handler, handler, synchronous=False)  # nothing to add: serve it as registered
        return _Entry(handler, rebuild(handler, behavior, guarded_deserialize, serialize), synchronous=False)
