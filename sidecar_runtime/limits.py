"""How much a sidecar takes on: concurrent calls and default deadlines.

* `ConcurrencyLimitInterceptor`: at most N calls run at once; one more ends
  at once with RESOURCE_EXHAUSTED (ErrorInfo reason TOO_MANY_CALLS, RetryInfo
  0.1 s) instead of queueing. grpc's own `maximum_concurrent_rpcs` answers
  the same code without details, so it is not used. Health calls are never
  counted or refused: probes must keep answering on a busy sidecar. Open
  streams (WatchSeeds, WatchAdapters, VerifySeeds) count while open.
* `DefaultTimeoutInterceptor`: a call that arrives without a deadline gets
  one. Servicers see it through `context.time_remaining()` (the negotiator
  passes it on to adapters), and a call still running when it expires ends
  with DEADLINE_EXCEEDED (reason DEFAULT_TIMEOUT_EXCEEDED). Only calls with a
  single response are bounded: streams are meant to stay open.

The maximum message size is not here: grpc enforces it on both directions
(`grpc.max_receive_message_length` / `grpc.max_send_message_length`) and
answers RESOURCE_EXHAUSTED before any handler runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Any

import grpc

from sidecar_runtime.handlers import Behavior, Continuation, Handler, WrapCache, service_and_method
from sidecar_runtime.richstatus import RichError, abort_with

DOMAIN = "limits.agentsidecar"
TOO_MANY_CALLS = "TOO_MANY_CALLS"
DEFAULT_TIMEOUT_EXCEEDED = "DEFAULT_TIMEOUT_EXCEEDED"
HEALTH_SERVICE = "grpc.health.v1.Health"
RETRY_AFTER_SECONDS = 0.1


def too_many_calls(limit: int) -> RichError:
    return RichError(
        code=grpc.StatusCode.RESOURCE_EXHAUSTED,
        message=f"the sidecar is already running its maximum of {limit} concurrent calls; retry shortly",
        reason=TOO_MANY_CALLS,
        domain=DOMAIN,
        metadata={"maxConcurrentCalls": str(limit)},
        retry_after_seconds=RETRY_AFTER_SECONDS,
    )


def default_timeout_exceeded(seconds: float) -> RichError:
    return RichError(
        code=grpc.StatusCode.DEADLINE_EXCEEDED,
        message=(
            f"the call set no deadline and ran past the sidecar's default of {seconds:g}s; "
            "set a deadline on the call if it needs longer"
        ),
        reason=DEFAULT_TIMEOUT_EXCEEDED,
        domain=DOMAIN,
        metadata={"defaultTimeoutSeconds": f"{seconds:g}"},
    )


class ConcurrencyLimitInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, max_calls: int, exempt_services: Collection[str] = (HEALTH_SERVICE,)) -> None:
        if max_calls < 1:
            raise ValueError("the concurrent call limit must be at least 1")
        self.max_calls = max_calls
        self.in_flight = 0
        self._exempt = frozenset(exempt_services)
        self._wrapped = WrapCache(lambda method, inner: self._limited(inner))

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler:
        handler: Handler | None = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or service_and_method(method)[0] in self._exempt:
            return handler  # type: ignore[return-value]
        return self._wrapped.get(method, handler)

    def _limited(self, inner: Behavior) -> Behavior:
        async def limited(request: Any, context: Any) -> Any:
            # Checked and counted when the handler starts, with no await in
            # between, so calls arriving together cannot all slip under the limit.
            if self.in_flight >= self.max_calls:
                await abort_with(context, too_many_calls(self.max_calls))
            self.in_flight += 1
            try:
                return await inner(request, context)
            finally:
                self.in_flight -= 1

        return limited


class _ContextWithDeadline:
    """The servicer context, with `time_remaining()` counting down the default deadline."""

    def __init__(self, context: Any, deadline: float) -> None:
        self._context = context
        self._deadline = deadline

    def time_remaining(self) -> float:
        return max(self._deadline - time.monotonic(), 0.0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class DefaultTimeoutInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError("the default timeout must be positive")
        self.seconds = seconds
        self._wrapped = WrapCache(lambda method, inner: self._bounded(inner))

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler:
        handler: Handler | None = await continuation(handler_call_details)
        if handler is None or handler.response_streaming:
            return handler  # type: ignore[return-value]
        return self._wrapped.get(handler_call_details.method, handler)

    def _bounded(self, inner: Behavior) -> Behavior:
        async def bounded(request: Any, context: Any) -> Any:
            if context.time_remaining() is not None:
                return await inner(request, context)  # the caller's own deadline governs
            deadline = time.monotonic() + self.seconds
            timeout = asyncio.timeout(self.seconds)
            try:
                async with timeout:
                    return await inner(request, _ContextWithDeadline(context, deadline))
            except TimeoutError:
                if not timeout.expired():
                    raise  # the servicer's own TimeoutError, not our deadline
                await abort_with(context, default_timeout_exceeded(self.seconds))

        return bounded
