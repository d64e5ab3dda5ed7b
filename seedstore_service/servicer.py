"""SeedStoreService over grpc.aio: protos in, `SeedOperations` calls, protos out.

Blocking operations (files, the store lock) run in worker threads so one slow
disk never stalls other calls. Reads the in-memory index can answer at once
(search, inspect) run on the event loop instead: for them the thread hop cost
more than the read. Errors leave through `status.py`'s table, by the runtime's
decorators (`agentsidecar.sidecar_runtime.rpcerrors`), one per method shape.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

import grpc

from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore.v1 import seedstore_pb2_grpc
from agentsidecar.seedstore_service import convert, paging
from agentsidecar.seedstore_service.operations import ChangeFeed, SeedOperations
from agentsidecar.seedstore_service.status import error_table
from agentsidecar.sidecar_runtime.rpcerrors import unary_stream, unary_unary
from agentsidecar.sidecar_runtime.server import DEFAULT_MAX_MESSAGE_BYTES

_Context = grpc.aio.ServicerContext[Any, Any]

# Core field labels that name a differently spelled field of a particular request.
_VERIFY_FIELDS = {"capability id": "ids"}
_UPDATE_FIELDS = {"tie key": "add_ties", "tie": "add_ties", "alias": "add_aliases"}

_ERRORS = error_table()


class SeedStoreServicer(seedstore_pb2_grpc.SeedStoreServiceServicer):
    def __init__(
        self,
        operations: SeedOperations,
        feed: ChangeFeed,
        *,
        check_timeout: float,
        verify_concurrency: int,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._operations = operations
        self._feed = feed
        self._check_timeout = check_timeout
        self._verify_concurrency = verify_concurrency
        # What the repeated items of a ListSeeds or SearchSeeds reply may take, so the reply fits.
        self._reply_item_bytes = max(max_message_bytes - paging.REPLY_HEADROOM_BYTES, max_message_bytes // 2)

    @unary_unary(_ERRORS)
    async def GetStore(self, request: pb.GetStoreRequest, context: _Context) -> pb.GetStoreResponse:
        return pb.GetStoreResponse(seed_store=self._operations.seed_store)

    @unary_unary(_ERRORS)
    async def AddSeed(self, request: pb.AddSeedRequest, context: _Context) -> pb.AddSeedResponse:
        spec = convert.add_spec_from_request(request)
        return convert.add_response(await asyncio.to_thread(self._operations.add, spec))

    @unary_unary(error_table(_UPDATE_FIELDS))
    async def UpdateSeed(self, request: pb.UpdateSeedRequest, context: _Context) -> pb.UpdateSeedResponse:
        patch = convert.update_patch_from_request(request)
        view = await asyncio.to_thread(
            self._operations.update,
            request.id,
            request.domain if request.HasField("domain") else None,
            patch,
            expected_revision=request.expected_revision if request.HasField("expected_revision") else None,
        )
        return convert.update_response(view)

    @unary_unary(_ERRORS)
    async def ListSeeds(self, request: pb.ListSeedsRequest, context: _Context) -> pb.ListSeedsResponse:
        domain = request.domain if request.HasField("domain") else None

        def listing() -> pb.ListSeedsResponse:
            # A listing grows with the store (the whole store's is tens of milliseconds
            # per 10,000 seeds, its protos more): off the loop, paging included.
            listed = self._operations.list_seeds(domain)
            return convert.list_page_response(listed, request, self._reply_item_bytes)

        return await asyncio.to_thread(listing)

    @unary_unary(_ERRORS)
    async def SearchSeeds(self, request: pb.SearchSeedsRequest, context: _Context) -> pb.SearchSeedsResponse:
        query = convert.search_query_from_request(request)
        outcome = self._operations.search_from_memory(query, broaden_empty=request.broaden)
        if outcome is None:
            outcome = await asyncio.to_thread(self._operations.search, query, broaden_empty=request.broaden)
        return convert.search_response(
            outcome, max_candidates=request.max_candidates, max_bytes=self._reply_item_bytes
        )

    @unary_unary(_ERRORS)
    async def InspectSeed(self, request: pb.InspectSeedRequest, context: _Context) -> pb.InspectSeedResponse:
        domain = request.domain if request.HasField("domain") else None
        view = self._operations.inspect_from_memory(request.id, domain)
        if view is None:
            view = await asyncio.to_thread(self._operations.inspect, request.id, domain)
        return convert.inspect_response(view)

    @unary_stream(error_table(_VERIFY_FIELDS))
    async def VerifySeeds(
        self, request: pb.VerifySeedsRequest, context: _Context
    ) -> AsyncGenerator[pb.VerifySeedsResponse, None]:
        verify = convert.verify_request_from_proto(request, self._check_timeout, self._verify_concurrency)
        operations = self._operations
        # Every request error and lookup failure is raised here, before any event.
        plan = operations.plan_verify_from_memory(verify)
        if plan is None:
            plan = await asyncio.to_thread(operations.plan_verify, verify)
        first = plan.first_event
        if first is None:
            return
        seed_store = operations.seed_store
        # The first event goes out straight from here, and the checks start only
        # once grpc has taken it (the next iteration): nothing but the lookup
        # stands between the request and the stream's first message.
        yield convert.verify_event_to_proto(seed_store, first)
        async with contextlib.aclosing(operations.run_verify(plan, first_event_sent=True)) as events:
            async for event in events:
                yield convert.verify_event_to_proto(seed_store, event)

    @unary_unary(_ERRORS)
    async def PreferSeed(self, request: pb.PreferSeedRequest, context: _Context) -> pb.PreferSeedResponse:
        view = await asyncio.to_thread(
            self._operations.prefer,
            request.id,
            request.domain if request.HasField("domain") else None,
            request.for_capability,
            request.priority if request.HasField("priority") else None,
        )
        return convert.prefer_response(view)

    @unary_unary(_ERRORS)
    async def RemoveSeed(self, request: pb.RemoveSeedRequest, context: _Context) -> pb.RemoveSeedResponse:
        domain = request.domain if request.HasField("domain") else None
        return convert.remove_response(await asyncio.to_thread(self._operations.remove, request.id, domain))

    @unary_unary(_ERRORS)
    async def ScanSeeds(self, request: pb.ScanSeedsRequest, context: _Context) -> pb.ScanSeedsResponse:
        return convert.scan_response(self._operations.scan())

    @unary_stream(_ERRORS)
    async def WatchSeeds(
        self, request: pb.WatchSeedsRequest, context: _Context
    ) -> AsyncGenerator[pb.WatchSeedsResponse, None]:
        domain = convert.watch_domain_from_request(request)
        async with self._feed.subscribe(domain) as changes:
            # Headers go out once the watcher is subscribed: a client that waits
            # for them knows every later change will reach it.
            await context.send_initial_metadata(())
            async for change in changes:
                yield convert.change_to_proto(change)
