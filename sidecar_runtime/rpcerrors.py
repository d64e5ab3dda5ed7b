"""Servicer methods whose errors leave as their service's statuses, never as UNKNOWN.

One decorator per method shape of grpc.aio, each given the service's `ErrorTable`:

- `unary_unary`: a coroutine returning the response;
- `unary_stream`: an async generator yielding the responses, or a coroutine
  that writes them with `context.write` and returns None;
- `stream_stream`: an async generator reading the request iterator.

What leaves a decorated method:

- an error of the service's taxonomy: the status its table gives it;
- any other exception: a bug, logged once with its traceback (on the logger
  of the method's module) and sent as INTERNAL with an ErrorInfo;
- grpc's own abort (a status the method or a layer already sent) and
  cancellation (a BaseException) pass through untouched.

`refine` lets a servicer replace the table's status with one that depends on
the call: it sees the servicer, the error and the context, and returns None
to keep the table's status. A servicer method itself holds no try/except for
mapping: it converts the request, calls its core and converts the answer back.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import grpc

from agentsidecar.sidecar_runtime.richstatus import RichError, abort_with

Context = grpc.aio.ServicerContext[Any, Any]
_Error = TypeVar("_Error", bound=Exception)

# (servicer, error of the taxonomy, context) -> the status to send instead, or None.
Refine = Callable[[Any, Any, Context], RichError | None]

UnaryUnaryMethod = Callable[[Any, Any, Context], Awaitable[Any]]
UnaryStreamMethod = Callable[[Any, Any, Context], AsyncIterator[Any] | Awaitable[None]]
StreamStreamMethod = Callable[[Any, AsyncIterator[Any], Context], AsyncIterator[Any]]
_UnaryUnary = TypeVar("_UnaryUnary", bound=UnaryUnaryMethod)
_UnaryStream = TypeVar("_UnaryStream", bound=UnaryStreamMethod)
_StreamStream = TypeVar("_StreamStream", bound=StreamStreamMethod)


@dataclass(frozen=True, slots=True)
class ErrorTable(Generic[_Error]):
    """How one service sends its errors: its taxonomy, its table, and what it sends for the rest."""

    taxonomy: type[_Error]  # the base every error of the service derives from
    status_of: Callable[[_Error], RichError]  # the service's status table
    unexpected: Callable[[BaseException, str], RichError]  # (exception, operation) -> INTERNAL

    def status(self, error: Exception, operation: str, logger: logging.Logger) -> RichError:
        """The status `error` leaves `operation` with; an error outside the taxonomy is logged here."""
        if isinstance(error, self.taxonomy):
            return self.status_of(error)
        logger.error("%s failed unexpectedly", operation, exc_info=error)
        return self.unexpected(error, operation)


def unary_unary(
    table: ErrorTable[Any], *, refine: Refine | None = None
) -> Callable[[_UnaryUnary], _UnaryUnary]:
    """Decorate a unary-unary servicer method (a coroutine)."""

    def decorate(method: _UnaryUnary) -> _UnaryUnary:
        return cast(_UnaryUnary, _coroutine(method, table, refine))

    return decorate


def unary_stream(
    table: ErrorTable[Any], *, refine: Refine | None = None
) -> Callable[[_UnaryStream], _UnaryStream]:
    """Decorate a server-streaming servicer method (an async generator, or a coroutine that writes)."""

    def decorate(method: _UnaryStream) -> _UnaryStream:
        if inspect.isasyncgenfunction(method):
            return cast(_UnaryStream, _generator(method, table, refine))
        return cast(_UnaryStream, _coroutine(method, table, refine))

    return decorate


def stream_stream(
    table: ErrorTable[Any], *, refine: Refine | None = None
) -> Callable[[_StreamStream], _StreamStream]:
    """Decorate a bidirectional servicer method (an async generator over the request iterator)."""

    def decorate(method: _StreamStream) -> _StreamStream:
        return cast(_StreamStream, _generator(method, table, refine))

    return decorate


def _coroutine(
    method: Callable[..., Any], table: ErrorTable[Any], refine: Refine | None
) -> Callable[..., Any]:
    operation, logger = method.__name__, logging.getLogger(method.__module__)

    @functools.wraps(method)
    async def mapped(servicer: Any, request: Any, context: Context) -> Any:
        try:
            return await method(servicer, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            await abort_with(context, _status(table, refine, servicer, error, context, operation, logger))
            raise AssertionError("abort_with never returns") from error

    return mapped


def _generator(
    method: Callable[..., Any], table: ErrorTable[Any], refine: Refine | None
) -> Callable[..., Any]:
    operation, logger = method.__name__, logging.getLogger(method.__module__)

    @functools.wraps(method)
    async def mapped(servicer: Any, request: Any, context: Context) -> AsyncIterator[Any]:
        # `aclosing` spelled out: the method's own `finally` runs before the status goes out,
        # and a stream's first message waits for nothing more than this frame.
        stream = method(servicer, request, context)
        try:
            try:
                async for response in stream:
                    yield response
            finally:
                await stream.aclose()
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            await abort_with(context, _status(table, refine, servicer, error, context, operation, logger))

    return mapped


def _status(
    table: ErrorTable[Any],
    refine: Refine | None,
    servicer: Any,
    error: Exception,
    context: Context,
    operation: str,
    logger: logging.Logger,
) -> RichError:
    if refine is not None and isinstance(error, table.taxonomy):
        refined = refine(servicer, error, context)
        if refined is not None:
            return refined
    return table.status(error, operation, logger)
