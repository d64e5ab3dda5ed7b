"""How much a sidecar takes on: concurrent calls and default deadlines.

* `CallLimit`: at most N calls run at once; one more ends
  at once with RESOURCE_EXHAUSTED (ErrorInfo reason TOO_MANY_CALLS, RetryInfo
  0.1 s) instead of queueing. grpc's own `maximum_concurrent_rpcs` answers
  the same code without details, so it is not used. Health calls are never
  counted or refused: probes must keep answering on a busy sidecar. Open
  streams (WatchSeeds, WatchAdapters, VerifySeeds) count while open.
* `DefaultTimeout`: a call that arrives without a deadline gets
  one. Servicers see it through `context.time_remaining()` (the negotiator
  passes it on to adapters), and a call still running when it expires ends
  with DEADLINE_EXCEEDED (reason DEFAULT_TIMEOUT_EXCEEDED). Calls with a
  single response are bounded, and the server streams a service names as
  ending by themselves (`bounded_streams`); other streams are meant to stay open.

The maximum message size is not here: grpc enforces it on both directions
(`grpc.max_receive_message_length` / `grpc.max_send_message_length`) and
answers RESOURCE_EXHAUSTED before any handler runs.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Collection
from typing import Any

import grpc

from agentsidecar.sidecar_runtime.handlers import Behavior, MethodInfo
from agentsidecar.sidecar_runtime.richstatus import RichError, abort_with

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


class CallLimit:
    """At most `max_calls` calls at once, as a layer; `exempt_services` are neither counted nor refused."""

    def __init__(self, max_calls: int, exempt_services: Collection[str] = (HEALTH_SERVICE,)) -> None:
        if max_calls < 1:
            raise ValueError("the concurrent call limit must be at least 1")
        self.max_calls = max_calls
        self.in_flight = 0
        self._exempt = frozenset(exempt_services)

    def wrap(self, method: MethodInfo, inner: Behavior) -> Behavior:
        if method.service in self._exempt:
            return inner

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

    def __init__(self, context: Any, deadline: float, seconds: float) -> None:
        self._context = context
        self._deadline = deadline
        self.default_timeout = seconds

    def time_remaining(self) -> float:
        return max(self._deadline - time.monotonic(), 0.0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def default_timeout_of(context: Any) -> float | None:
    """The default timeout `context` counts down; None when the caller's own deadline (or none) governs.

    A servicer that passes `time_remaining()` on as a budget uses it to say
    DEFAULT_TIMEOUT_EXCEEDED, not "raise your deadline", when that budget runs out.
    """
    return context.default_timeout if isinstance(context, _ContextWithDeadline) else None


class _Bounded:
    """One call running under the default deadline."""

    __slots__ = ("deadline", "expired", "finished", "task")

    def __init__(self, deadline: float, task: asyncio.Task[Any]) -> None:
        self.deadline = deadline
        self.task: asyncio.Task[Any] | None = task  # None once finished
        self.finished = False
        self.expired = False


class DefaultTimeout:
    """A deadline for unary-response calls sent without one, as a layer.

    Every default deadline is the same length, so the calls expire in the
    order they started: one queue in start order and one timer, armed for
    the oldest call still running, replace a timer per call (an
    asyncio.timeout per call schedules and cancels a timer handle on every
    call). Finished calls leave the queue when they reach its head, so a
    long call at the head holds at most the calls started within one
    default timeout behind it (small records, no tasks).
    """

    def __init__(self, seconds: float, bounded_streams: Collection[str] = ()) -> None:
        """`bounded_streams`: full names of server streams bounded like unary calls."""
        if not seconds > 0:
            raise ValueError("the default timeout must be positive")
        self.seconds = seconds
        self._bounded_streams = frozenset(bounded_streams)
        self._queue: collections.deque[_Bounded] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None

    def wrap(self, method: MethodInfo, inner: Behavior) -> Behavior:
        if method.response_streaming and (
            method.request_streaming or method.full_name not in self._bounded_streams
        ):
            return inner  # streams are meant to stay open
        seconds, queue = self.seconds, self._queue

        async def bounded(request: Any, context: Any) -> Any:
            if context.time_remaining() is not None:
                return await inner(request, context)  # the caller's own deadline governs
            task = asyncio.current_task()
            assert task is not None
            cancelling = task.cancelling()
            deadline = time.monotonic() + seconds
            call = _Bounded(deadline, task)
            queue.append(call)
            if self._timer is None:
                self._arm(deadline)
            uncancelled = False
            try:
                return await inner(request, _ContextWithDeadline(context, deadline, seconds))
            except asyncio.CancelledError:
                if call.expired:
                    uncancelled = True
                    # Our cancel and no other (a client's) on top of it: the default deadline passed.
                    if task.uncancel() <= cancelling:
                        await abort_with(context, default_timeout_exceeded(seconds))
                raise
            finally:
                call.finished = True
                call.task = None
                if call.expired and not uncancelled:
                    task.uncancel()  # the servicer swallowed our cancel and finished anyway
                while queue and queue[0].finished:
                    queue.popleft()

        return bounded

    def _arm(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        # loop.time() is time.monotonic() unless a loop says otherwise: convert to be safe.
        self._timer = loop.call_at(loop.time() + (deadline - time.monotonic()), self._expire)

    def _expire(self) -> None:
        self._timer = None
        now = time.monotonic()
        queue = self._queue
        while queue and (queue[0].finished or queue[0].deadline <= now):
            call = queue.popleft()
            if not call.finished and call.task is not None:
                call.expired = True
                call.task.cancel()
        if queue:
            self._arm(queue[0].deadline)
