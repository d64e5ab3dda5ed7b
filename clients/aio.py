# `timeout` is the gRPC deadline, which the server sees and enforces too (asyncio.timeout would
# only stop waiting here), and it mirrors the synchronous clients' parameter.
# ruff: noqa: ASYNC109
"""asyncio clients: the same methods as the sync clients (`negotiator`, `seedstore`), awaited.

    async with AsyncSeedStoreClient("unix:run/seedstore.sock") as seeds:
        found = await seeds.search_seeds(capability="voice_message", broaden=True)
        async for event in seeds.verify("say-hello"):
            ...

Streams are async generators. Leaving an `async for` early cancels the call
as soon as the generator is finalized (at once in CPython, once the loop
runs the finalizer); to cancel at a precise point wrap the stream in
`contextlib.aclosing(...)` or call `await stream.aclose()`. Build clients
inside the event loop that uses them (grpc.aio channels belong to a loop).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from functools import cached_property
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack, overload

import grpc
import grpc.aio

from agentsidecar.clients.channel import (
    CLIENT_TIMEOUT,
    ChannelClient,
    ChannelSettings,
    Timeout,
    open_channel,
)
from agentsidecar.clients.errors import from_rpc_error
from agentsidecar.clients.negotiator import (
    Approver,
    DeltaHandler,
    EventHandler,
    JsonSchema,
    ToolRunner,
    approval_answer,
    bootstrap_request,
    delegation_metadata,
    invoke_call,
    negotiate_request,
    produce_call,
    session_ended_early,
    session_result,
    session_start,
    tool_result,
)
from agentsidecar.clients.seedstore import (
    AddSeedFields,
    ListSeedsFields,
    PreferSeedFields,
    SearchSeedsFields,
    SeedRefFields,
    UpdateSeedFields,
    VerifyEvent,
    VerifySeedsFields,
    WatchSeedsFields,
    build,
    merge_pages,
    verify_event,
    verify_request,
)
from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as npb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.seedstore.v1 import seedstore_pb2 as spb
from agentsidecar.seedstore.v1 import seedstore_pb2_grpc

_Response = TypeVar("_Response")


async def mapped_stream(call: grpc.aio.UnaryStreamCall[Any, _Response]) -> AsyncGenerator[_Response, None]:
    """The responses of an aio server stream, errors mapped (also mid-stream); closing it cancels the call."""
    try:
        async for response in call:
            yield response
    except grpc.RpcError as error:
        raise from_rpc_error(error) from None
    finally:
        call.cancel()  # a no-op once the stream has ended


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class AsyncClient(ChannelClient[grpc.aio.Channel]):
    """What the asyncio clients share: `agentsidecar.clients.channel.ChannelClient`, closing, and unary calls.

    Leaving an `async with` block closes the channel only if the client opened it.
    """

    def _open(self, target: str, **settings: Unpack[ChannelSettings]) -> grpc.aio.Channel:
        return open_channel(target, aio=True, **settings)

    async def close(self) -> None:
        if self._owns_channel:
            await self.channel.close(None)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _call(
        self,
        method: Callable[..., Awaitable[_Response]],
        request: object,
        timeout: Timeout,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> _Response:
        try:
            return await method(request, timeout=self._timeout(timeout), metadata=metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None


class AsyncNegotiatorClient(AsyncClient):
    """The asyncio twin of `agentsidecar.clients.negotiator.NegotiatorClient`; see it for each method."""

    @cached_property
    def _stub(self) -> negotiator_pb2_grpc.NegotiatorServiceAsyncStub:
        return negotiator_pb2_grpc.NegotiatorServiceStub(self.channel)

    async def list_adapters(
        self, *, timeout: Timeout = CLIENT_TIMEOUT, page_size: int = 0
    ) -> list[npb.Adapter]:
        adapters: list[npb.Adapter] = []
        request = npb.ListAdaptersRequest(page_size=page_size)
        while True:
            response = await self._call(self._stub.ListAdapters, request, timeout)
            adapters.extend(response.adapters)
            if not response.next_page_token:
                return adapters
            request = npb.ListAdaptersRequest(page_size=page_size, page_token=response.next_page_token)

    async def get_adapter(self, shortname: str, *, timeout: Timeout = CLIENT_TIMEOUT) -> npb.Adapter:
        request = npb.GetAdapterRequest(shortname=shortname)
        return (await self._call(self._stub.GetAdapter, request, timeout)).adapter

    def watch(self, *, timeout: float | None = None) -> AsyncGenerator[npb.WatchAdaptersResponse, None]:
        return mapped_stream(self._stub.WatchAdapters(npb.WatchAdaptersRequest(), timeout=timeout))

    def watch_adapters(
        self, *, timeout: float | None = None
    ) -> AsyncGenerator[npb.WatchAdaptersResponse, None]:
        return self.watch(timeout=timeout)

    async def register_adapter(
        self, target: str, shortname: str = "", *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> npb.Adapter:
        request = npb.RegisterAdapterRequest(target=target, shortname=shortname)
        return (await self._call(self._stub.RegisterAdapter, request, timeout)).adapter

    async def deregister_adapter(self, shortname: str, *, timeout: Timeout = CLIENT_TIMEOUT) -> npb.Adapter:
        request = npb.DeregisterAdapterRequest(shortname=shortname)
        return (await self._call(self._stub.DeregisterAdapter, request, timeout)).adapter

    async def negotiate(
        self,
        call: npb.ProduceRequest | npb.InvokeRequest | None = None,
        /,
        *,
        adapter: str | None = None,
        agent: str | None = None,
        prompt: str = "",
        output_schema: JsonSchema | None = None,
        options: npb.CallOptions | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> npb.Decision:
        request = negotiate_request(
            call, adapter=adapter, agent=agent, prompt=prompt, output_schema=output_schema, options=options
        )
        return (await self._call(self._stub.Negotiate, request, timeout)).decision

    async def produce(
        self,
        request: npb.ProduceRequest | None = None,
        /,
        *,
        adapter: str | None = None,
        agent: str | None = None,
        prompt: str = "",
        output_schema: JsonSchema = "",
        options: npb.CallOptions | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> npb.ProduceResponse:
        message = produce_call(
            request, adapter=adapter, agent=agent, prompt=prompt, output_schema=output_schema, options=options
        )
        return await self._call(self._stub.Produce, message, timeout, delegation_metadata(delegation_depth))

    async def invoke(
        self,
        request: npb.InvokeRequest | None = None,
        /,
        *,
        adapter: str | None = None,
        agent: str | None = None,
        prompt: str = "",
        options: npb.CallOptions | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> npb.InvokeResponse:
        message = invoke_call(request, adapter=adapter, agent=agent, prompt=prompt, options=options)
        return await self._call(self._stub.Invoke, message, timeout, delegation_metadata(delegation_depth))

    def produce_stream(
        self,
        request: npb.ProduceRequest | None = None,
        /,
        *,
        adapter: str | None = None,
        agent: str | None = None,
        prompt: str = "",
        output_schema: JsonSchema = "",
        options: npb.CallOptions | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> AsyncGenerator[npb.ProduceStreamResponse, None]:
        """Produce as it happens: `decision`, `delta`s and `event`s, then `final`; closing it cancels."""
        message = produce_call(
            request, adapter=adapter, agent=agent, prompt=prompt, output_schema=output_schema, options=options
        )
        return mapped_stream(
            self._stub.ProduceStream(
                npb.ProduceStreamRequest(produce=message),
                timeout=self._timeout(timeout),
                metadata=delegation_metadata(delegation_depth),
            )
        )

    def invoke_stream(
        self,
        request: npb.InvokeRequest | None = None,
        /,
        *,
        adapter: str | None = None,
        agent: str | None = None,
        prompt: str = "",
        options: npb.CallOptions | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> AsyncGenerator[npb.InvokeStreamResponse, None]:
        """Invoke as it happens: `decision`, `delta`s and `event`s, then `final`; closing it cancels."""
        message = invoke_call(request, adapter=adapter, agent=agent, prompt=prompt, options=options)
        return mapped_stream(
            self._stub.InvokeStream(
                npb.InvokeStreamRequest(invoke=message),
                timeout=self._timeout(timeout),
                metadata=delegation_metadata(delegation_depth),
            )
        )

    @overload
    async def tool_session(
        self,
        call: npb.ProduceRequest,
        *,
        tools: Sequence[npb.ToolSpec],
        run_tool: ToolRunner,
        approve: Approver | None = None,
        on_delta: DeltaHandler | None = None,
        on_event: EventHandler | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> npb.ProduceResponse: ...

    @overload
    async def tool_session(
        self,
        call: npb.InvokeRequest,
        *,
        tools: Sequence[npb.ToolSpec],
        run_tool: ToolRunner,
        approve: Approver | None = None,
        on_delta: DeltaHandler | None = None,
        on_event: EventHandler | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> npb.InvokeResponse: ...

    async def tool_session(
        self,
        call: npb.ProduceRequest | npb.InvokeRequest,
        *,
        tools: Sequence[npb.ToolSpec],
        run_tool: ToolRunner,
        approve: Approver | None = None,
        on_delta: DeltaHandler | None = None,
        on_event: EventHandler | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
        delegation_depth: int | None = None,
    ) -> npb.ProduceResponse | npb.InvokeResponse:
        """As `NegotiatorClient.tool_session`; `run_tool`, `approve`, `on_delta` and `on_event` may also
        be coroutine functions."""
        deadline = self._timeout(timeout)
        metadata = delegation_metadata(delegation_depth)
        session = self._stub.ToolSession(None, timeout=deadline, metadata=metadata)
        try:
            await session.write(
                session_start(call, tools, stream=on_delta is not None or on_event is not None)
            )
            # The request side stays open until the result: the model may call another tool any time.
            # (read() answers grpc.aio.EOF, not a response, once the stream has ended)
            while isinstance(response := await session.read(), npb.ToolSessionResponse):
                result = session_result(response)
                if result is not None:
                    # The status follows the result: the call ends OK once it arrives, whereas
                    # a cancel sent before it would end a successful session CANCELLED.
                    await session.code()
                    return result
                if response.HasField("tool_call"):
                    try:
                        outcome = await _maybe_await(run_tool(response.tool_call))
                    except Exception as exc:  # the tool failed: the model is told, the session goes on
                        outcome = exc
                    await session.write(tool_result(response.tool_call, outcome))
                elif response.HasField("approval_request"):
                    decision = await _maybe_await(approve(response.approval_request)) if approve else None
                    await session.write(approval_answer(response.approval_request, decision))
                elif response.HasField("delta"):
                    if on_delta is not None:
                        await _maybe_await(on_delta(response.delta))
                elif response.HasField("event") and on_event is not None:
                    await _maybe_await(on_event(response.event))
            raise session_ended_early()
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        finally:
            session.cancel()  # a no-op once the stream has ended

    async def watch_audit(self, *, timeout: float | None = None) -> AsyncGenerator[npb.AuditRecord, None]:
        responses = mapped_stream(self._stub.WatchAudit(npb.WatchAuditRequest(), timeout=timeout))
        try:
            async for response in responses:
                yield response.record
        finally:
            await responses.aclose()

    async def bootstrap(
        self,
        request: npb.BootstrapRequest | None = None,
        /,
        *,
        capability: str = "",
        domain: str = "",
        local_only: bool = False,
        seed: str = "",
        approved_gates: Iterable[str | common_pb2.Gate.ValueType] = (),
        run: bool = False,
        prompt: str = "",
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> npb.BootstrapResponse:
        message = bootstrap_request(
            request,
            capability=capability,
            domain=domain,
            local_only=local_only,
            seed=seed,
            approved_gates=approved_gates,
            run=run,
            prompt=prompt,
        )
        return await self._call(self._stub.Bootstrap, message, timeout)


class AsyncSeedStoreClient(AsyncClient):
    """The asyncio twin of `agentsidecar.clients.seedstore.SeedStoreClient`; see it for each method."""

    @cached_property
    def _stub(self) -> seedstore_pb2_grpc.SeedStoreServiceAsyncStub:
        return seedstore_pb2_grpc.SeedStoreServiceStub(self.channel)

    async def get_store(self, *, timeout: Timeout = CLIENT_TIMEOUT) -> spb.GetStoreResponse:
        return await self._call(self._stub.GetStore, spb.GetStoreRequest(), timeout)

    async def add_seed(
        self,
        request: spb.AddSeedRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[AddSeedFields],
    ) -> spb.AddSeedResponse:
        return await self._call(self._stub.AddSeed, build(spb.AddSeedRequest, request, fields), timeout)

    async def update_seed(
        self,
        request: spb.UpdateSeedRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[UpdateSeedFields],
    ) -> spb.UpdateSeedResponse:
        return await self._call(self._stub.UpdateSeed, build(spb.UpdateSeedRequest, request, fields), timeout)

    async def list_seeds(
        self,
        request: spb.ListSeedsRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[ListSeedsFields],
    ) -> spb.ListSeedsResponse:
        """One page of the listing; pass its `next_page_token` as `page_token` for the next."""
        return await self._call(self._stub.ListSeeds, build(spb.ListSeedsRequest, request, fields), timeout)

    async def list_all_seeds(
        self,
        request: spb.ListSeedsRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[ListSeedsFields],
    ) -> spb.ListSeedsResponse:
        """The whole listing, every page walked and merged (each call has its own `timeout`)."""
        message = spb.ListSeedsRequest()
        message.CopyFrom(build(spb.ListSeedsRequest, request, fields))
        pages: list[spb.ListSeedsResponse] = []
        while True:
            page = await self.list_seeds(message, timeout=timeout)
            pages.append(page)
            if not page.next_page_token:
                return merge_pages(pages)
            message.page_token = page.next_page_token

    async def search_seeds(
        self,
        request: spb.SearchSeedsRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[SearchSeedsFields],
    ) -> spb.SearchSeedsResponse:
        request = build(spb.SearchSeedsRequest, request, fields)
        return await self._call(self._stub.SearchSeeds, request, timeout)

    async def inspect_seed(
        self,
        request: spb.InspectSeedRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[SeedRefFields],
    ) -> spb.InspectSeedResponse:
        request = build(spb.InspectSeedRequest, request, fields)
        return await self._call(self._stub.InspectSeed, request, timeout)

    async def prefer_seed(
        self,
        request: spb.PreferSeedRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[PreferSeedFields],
    ) -> spb.PreferSeedResponse:
        return await self._call(self._stub.PreferSeed, build(spb.PreferSeedRequest, request, fields), timeout)

    async def remove_seed(
        self,
        request: spb.RemoveSeedRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[SeedRefFields],
    ) -> spb.RemoveSeedResponse:
        return await self._call(self._stub.RemoveSeed, build(spb.RemoveSeedRequest, request, fields), timeout)

    async def scan_seeds(self, *, timeout: Timeout = CLIENT_TIMEOUT) -> spb.ScanSeedsResponse:
        return await self._call(self._stub.ScanSeeds, spb.ScanSeedsRequest(), timeout)

    def verify_seeds(
        self,
        request: spb.VerifySeedsRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Unpack[VerifySeedsFields],
    ) -> AsyncGenerator[spb.VerifySeedsResponse, None]:
        return mapped_stream(self._stub.VerifySeeds(verify_request(request, fields), timeout=timeout))

    async def verify(
        self,
        *ids: str,
        domain: str | None = None,
        all_in_domain: bool = False,
        check_timeout: float | None = None,
        concurrency: int = 0,
        timeout: float | None = None,
    ) -> AsyncGenerator[VerifyEvent, None]:
        responses = self.verify_seeds(
            ids=ids,
            domain=domain,
            all_in_domain=all_in_domain,
            check_timeout=check_timeout,
            concurrency=concurrency,
            timeout=timeout,
        )
        try:
            async for response in responses:
                event = verify_event(response)
                if event is not None:
                    yield event
        finally:
            await responses.aclose()

    def watch_seeds(
        self,
        request: spb.WatchSeedsRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Unpack[WatchSeedsFields],
    ) -> AsyncGenerator[spb.WatchSeedsResponse, None]:
        request = build(spb.WatchSeedsRequest, request, fields)
        return mapped_stream(self._stub.WatchSeeds(request, timeout=timeout))

    def watch(
        self, *, domain: str | None = None, timeout: float | None = None
    ) -> AsyncGenerator[spb.WatchSeedsResponse, None]:
        return self.watch_seeds(domain=domain, timeout=timeout)


__all__ = ["AsyncClient", "AsyncNegotiatorClient", "AsyncSeedStoreClient", "mapped_stream"]
