"""NegotiatorService over grpc.aio: converts protos, calls the Broker or the registry.

Every failure leaves through `status.to_rich_error` (the taxonomy) or
`status.unexpected_error` (INTERNAL), so no handler ever ends with UNKNOWN.

Brokered calls carry the caller's clock and place in a delegation chain:
- `time_budget` is `context.time_remaining()` minus a small margin (so the
  adapter's answer can still travel back before the caller gives up), or None
  when the caller set no deadline;
- `delegation_depth` comes from the request metadata `x-delegation-depth`
  (a non-negative integer, 0 when absent; the largest value wins if repeated).
When a client cancels, grpc.aio cancels the handler task, and with it the
broker's await on the adapter, so the adapter sees CancelledError.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc

from negotiator_service import convert
from negotiator_service.broker import Broker
from negotiator_service.declarations import validate_shortname
from negotiator_service.errors import (
    AdapterAlreadyExists,
    ConfigError,
    InvalidRequest,
    NegotiatorError,
    NotImplementedYet,
)
from negotiator_service.model import Adapter
from negotiator_service.registry import AdapterRegistry, Change, RegisteredAdapter
from negotiator_service.status import DOMAIN, to_rich_error, unexpected_error
from sidecar_runtime.addresses import parse_address
from sidecar_runtime.richstatus import RichError, abort_with

SERVICE_NAME = "agentsidecar.negotiator.v1.NegotiatorService"
DELEGATION_DEPTH_KEY = "x-delegation-depth"
# Time kept back from the caller's deadline for the reply's trip home.
DEFAULT_DEADLINE_MARGIN_SECONDS = 0.02

ConnectRemote = Callable[[str, str], Awaitable[Adapter]]  # (target, expected shortname or "")
Context = grpc.aio.ServicerContext[Any, Any]

_T = TypeVar("_T")
_LOGGER = logging.getLogger("negotiator_service.servicer")


class NegotiatorServicer(negotiator_pb2_grpc.NegotiatorServiceServicer):
    def __init__(
        self,
        broker: Broker,
        registry: AdapterRegistry,
        connect_remote: ConnectRemote,
        *,
        deadline_margin: float = DEFAULT_DEADLINE_MARGIN_SECONDS,
        logger: logging.Logger | None = None,
    ) -> None:
        self._broker = broker
        self._registry = registry
        self._connect_remote = connect_remote
        self._deadline_margin = deadline_margin
        self._logger = logger or _LOGGER
        self._closing = asyncio.Event()

    def begin_shutdown(self) -> None:
        """End every open WatchAdapters stream (UNAVAILABLE: watch again elsewhere).

        Called before the server drains, because a watch never ends by itself
        and would otherwise hold shutdown for the whole grace period.
        """
        self._closing.set()

    # -- adapters --------------------------------------------------------

    async def ListAdapters(
        self, request: negotiator_pb2.ListAdaptersRequest, context: Context
    ) -> negotiator_pb2.ListAdaptersResponse:
        async def work() -> negotiator_pb2.ListAdaptersResponse:
            return negotiator_pb2.ListAdaptersResponse(
                adapters=convert.adapters_to_proto(self._registry.list())
            )

        return await self._guard(context, "ListAdapters", work())

    async def GetAdapter(
        self, request: negotiator_pb2.GetAdapterRequest, context: Context
    ) -> negotiator_pb2.GetAdapterResponse:
        async def work() -> negotiator_pb2.GetAdapterResponse:
            entry = self._registry.get(_required_shortname(request.shortname))
            return negotiator_pb2.GetAdapterResponse(adapter=convert.adapter_to_proto(entry))

        return await self._guard(context, "GetAdapter", work())

    async def WatchAdapters(
        self, request: negotiator_pb2.WatchAdaptersRequest, context: Context
    ) -> AsyncIterator[negotiator_pb2.WatchAdaptersResponse]:
        changes = self._registry.watch()
        closing = asyncio.ensure_future(self._closing.wait())
        next_change: asyncio.Future[tuple[Change, RegisteredAdapter]] | None = None
        try:
            while True:
                next_change = asyncio.ensure_future(anext(changes))
                await asyncio.wait({next_change, closing}, return_when=asyncio.FIRST_COMPLETED)
                if not next_change.done():
                    await abort_with(context, _shutting_down())
                try:
                    change, entry = next_change.result()
                except StopAsyncIteration:  # the registry closed
                    await abort_with(context, _shutting_down())
                    return
                yield convert.watch_response(change, entry)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            self._logger.exception("WatchAdapters failed unexpectedly")
            await abort_with(context, unexpected_error(exc, "WatchAdapters"))
        finally:
            closing.cancel()
            if next_change is not None and not next_change.done():
                next_change.cancel()
                await asyncio.wait({next_change})  # let the generator unwind before closing it
            if isinstance(changes, AsyncGenerator):
                await changes.aclose()

    async def RegisterAdapter(
        self, request: negotiator_pb2.RegisterAdapterRequest, context: Context
    ) -> negotiator_pb2.RegisterAdapterResponse:
        async def work() -> negotiator_pb2.RegisterAdapterResponse:
            problems: list[tuple[str, str]] = []
            target = ""
            if not request.target:
                problems.append(("target", "is required: unix:PATH or HOST:PORT"))
            else:
                try:
                    target = parse_address(request.target).target
                except ValueError as exc:
                    problems.append(("target", str(exc)))
            if request.shortname:
                try:
                    validate_shortname(request.shortname)
                except ConfigError as exc:
                    problems.append(("shortname", exc.message))
            if problems:
                raise InvalidRequest(problems)
            adapter = await self._connect_remote(target, request.shortname)
            entry = RegisteredAdapter(adapter=adapter, source="runtime", target=target)
            try:
                self._registry.add(entry)
            except AdapterAlreadyExists:
                await adapter.close()
                raise
            self._logger.info("registered remote adapter %s at %s", entry.shortname, target)
            return negotiator_pb2.RegisterAdapterResponse(adapter=convert.adapter_to_proto(entry))

        return await self._guard(context, "RegisterAdapter", work())

    async def DeregisterAdapter(
        self, request: negotiator_pb2.DeregisterAdapterRequest, context: Context
    ) -> negotiator_pb2.DeregisterAdapterResponse:
        async def work() -> negotiator_pb2.DeregisterAdapterResponse:
            entry = self._registry.remove(_required_shortname(request.shortname))
            response = negotiator_pb2.DeregisterAdapterResponse(adapter=convert.adapter_to_proto(entry))
            await entry.adapter.close()
            self._logger.info("deregistered adapter %s", entry.shortname)
            return response

        return await self._guard(context, "DeregisterAdapter", work())

    # -- calls -----------------------------------------------------------

    async def Negotiate(
        self, request: negotiator_pb2.NegotiateRequest, context: Context
    ) -> negotiator_pb2.NegotiateResponse:
        async def work() -> negotiator_pb2.NegotiateResponse:
            which = request.WhichOneof("call")
            try:
                call = convert.negotiate_request(request)
                decision = self._broker.negotiate(call)
            except InvalidRequest as error:
                # The call is nested here: point at it from the top of this request.
                if which is None:
                    raise
                raise InvalidRequest([(f"{which}.{f}", d) for f, d in error.violations]) from error
            return negotiator_pb2.NegotiateResponse(decision=convert.decision_to_proto(decision))

        return await self._guard(context, "Negotiate", work())

    async def Produce(
        self, request: negotiator_pb2.ProduceRequest, context: Context
    ) -> negotiator_pb2.ProduceResponse:
        async def work() -> negotiator_pb2.ProduceResponse:
            call = convert.produce_request(request)
            reply, decision = await self._broker.call(
                call, time_budget=self._time_budget(context), delegation_depth=_delegation_depth(context)
            )
            return convert.produce_response(reply, decision)

        return await self._guard(context, "Produce", work())

    async def Invoke(
        self, request: negotiator_pb2.InvokeRequest, context: Context
    ) -> negotiator_pb2.InvokeResponse:
        async def work() -> negotiator_pb2.InvokeResponse:
            call = convert.invoke_request(request)
            reply, decision = await self._broker.call(
                call, time_budget=self._time_budget(context), delegation_depth=_delegation_depth(context)
            )
            return convert.invoke_response(reply, decision)

        return await self._guard(context, "Invoke", work())

    # -- not built yet: refused loudly, never accepted and ignored ---------

    async def ToolSession(
        self, request_iterator: AsyncIterator[negotiator_pb2.ToolSessionRequest], context: Context
    ) -> AsyncIterator[negotiator_pb2.ToolSessionResponse]:
        await abort_with(context, to_rich_error(NotImplementedYet("ToolSession")))
        yield negotiator_pb2.ToolSessionResponse()  # pragma: no cover - abort never returns

    async def WatchAudit(
        self, request: negotiator_pb2.WatchAuditRequest, context: Context
    ) -> AsyncIterator[negotiator_pb2.WatchAuditResponse]:
        await abort_with(context, to_rich_error(NotImplementedYet("WatchAudit")))
        yield negotiator_pb2.WatchAuditResponse()  # pragma: no cover - abort never returns

    async def Bootstrap(
        self, request: negotiator_pb2.BootstrapRequest, context: Context
    ) -> negotiator_pb2.BootstrapResponse:
        await abort_with(context, to_rich_error(NotImplementedYet("Bootstrap")))
        raise AssertionError("abort_with never returns")

    # -- plumbing --------------------------------------------------------

    def _time_budget(self, context: Context) -> float | None:
        remaining: float | None = context.time_remaining()
        if remaining is None:
            return None
        return max(remaining - self._deadline_margin, 0.0)

    async def _guard(self, context: Context, operation: str, work: Awaitable[_T]) -> _T:
        """Run `work`; send any exception as a rich status (never UNKNOWN)."""
        try:
            return await work
        except NegotiatorError as error:
            await abort_with(context, to_rich_error(error))
        except Exception as exc:
            self._logger.exception("%s failed unexpectedly", operation)
            await abort_with(context, unexpected_error(exc, operation))
        raise AssertionError("abort_with never returns")


def _required_shortname(shortname: str) -> str:
    if not shortname:
        raise InvalidRequest([("shortname", "is required")])
    return shortname


def _delegation_depth(context: Context) -> int:
    depth = 0
    for key, value in context.invocation_metadata() or ():
        if key != DELEGATION_DEPTH_KEY:
            continue
        text = value.decode() if isinstance(value, bytes) else value
        if not text.isdigit():
            raise InvalidRequest(
                [(f"metadata.{DELEGATION_DEPTH_KEY}", f"must be a non-negative integer, got {text!r}")]
            )
        # Repeated values: the deepest wins, so a hop can never reset the count.
        depth = max(depth, int(text))
    return depth


def _shutting_down() -> RichError:
    return RichError(
        code=grpc.StatusCode.UNAVAILABLE,
        message="the negotiator is shutting down; watch again (another instance, or after restart)",
        reason="SHUTTING_DOWN",
        domain=DOMAIN,
    )
