"""What the sync and asyncio clients share: target or channel, who closes the channel, default
timeouts, and the request-or-keywords rule of Produce and Invoke."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import grpc.aio
import pytest

from agentsidecar.clients import (
    AsyncNegotiatorClient,
    AsyncSeedStoreClient,
    NegotiatorClient,
    SeedStoreClient,
)
from agentsidecar.clients.channel import DEFAULT_TIMEOUT_SECONDS
from agentsidecar.clients.negotiator import invoke_call, produce_call
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from tests.clients.sidecars import FakeServer

NOWHERE = "unix:/tmp/no-sidecar-listens-here.sock"


@pytest.mark.parametrize("client_class", [NegotiatorClient, SeedStoreClient])
def test_a_sync_client_takes_a_target_or_a_channel(
    client_class: type[NegotiatorClient] | type[SeedStoreClient],
) -> None:
    with pytest.raises(ValueError, match="either a target or a channel"):
        client_class()
    with grpc.insecure_channel(NOWHERE) as channel, pytest.raises(ValueError, match="either a target"):
        client_class(NOWHERE, channel=channel)
    with pytest.raises(ValueError, match="unix"):
        client_class("unix:")  # a malformed target fails before any channel is opened


@pytest.mark.parametrize("client_class", [AsyncNegotiatorClient, AsyncSeedStoreClient])
async def test_an_asyncio_client_takes_a_target_or_a_channel(
    client_class: type[AsyncNegotiatorClient] | type[AsyncSeedStoreClient],
) -> None:
    with pytest.raises(ValueError, match="either a target or a channel"):
        client_class()
    async with grpc.aio.insecure_channel(NOWHERE) as channel:
        with pytest.raises(ValueError, match="either a target"):
            client_class(NOWHERE, channel=channel)


def test_the_target_is_normalised_and_a_given_channel_is_used_as_is() -> None:
    with SeedStoreClient("unix:///tmp/x.sock") as client:
        assert (client.target, client.timeout) == ("unix:/tmp/x.sock", DEFAULT_TIMEOUT_SECONDS)
    with grpc.insecure_channel(NOWHERE) as channel:
        given = NegotiatorClient(channel=channel, timeout=None)
        assert (given.target, given.timeout, given.channel) == (None, None, channel)


def test_a_sync_client_closes_only_the_channel_it_opened(start_fake: Callable[..., FakeServer]) -> None:
    server = start_fake()
    with grpc.insecure_channel(server.unix) as channel:
        with SeedStoreClient(channel=channel) as borrowing:
            borrowing.get_store()
        SeedStoreClient(channel=channel).get_store()  # still open: it is the caller's
    with SeedStoreClient(server.unix) as owning:
        owning.get_store()
    with pytest.raises(ValueError, match="closed channel"):
        owning.get_store()


async def test_an_asyncio_client_closes_only_the_channel_it_opened(
    start_fake: Callable[..., FakeServer],
) -> None:
    server = start_fake()
    async with grpc.aio.insecure_channel(server.unix) as channel:
        async with AsyncSeedStoreClient(channel=channel) as borrowing:
            await borrowing.get_store()
        await AsyncSeedStoreClient(channel=channel).get_store()
    async with AsyncSeedStoreClient(server.unix) as owning:
        await owning.get_store()
    with pytest.raises(grpc.aio.UsageError):
        await owning.get_store()


def test_produce_and_invoke_take_a_request_or_keywords() -> None:
    request = pb.ProduceRequest(adapter="demo", prompt="hi", output_schema="{}")
    assert (
        produce_call(request, adapter=None, agent=None, prompt="", output_schema="", options=None) is request
    )
    built = produce_call(
        None, adapter=None, agent="harness", prompt="hi", output_schema={"type": "object"}, options=None
    )
    assert built == pb.ProduceRequest(agent="harness", prompt="hi", output_schema='{"type": "object"}')
    with pytest.raises(TypeError, match="not both"):
        produce_call(request, adapter=None, agent=None, prompt="", output_schema={}, options=None)

    invoke = pb.InvokeRequest(adapter="demo", prompt="hi")
    assert invoke_call(invoke, adapter=None, agent=None, prompt="", options=None) is invoke
    assert invoke_call(None, adapter="demo", agent=None, prompt="hi", options=None) == invoke
    with pytest.raises(TypeError, match="not both"):
        invoke_call(invoke, adapter=None, agent=None, prompt="", options=pb.CallOptions())
    with pytest.raises(ValueError, match="not both"):
        invoke_call(None, adapter="demo", agent="harness", prompt="hi", options=None)


async def test_both_clients_refuse_a_request_with_keywords_before_calling() -> None:
    # NOWHERE has no server: the TypeError must come before any call is attempted.
    with NegotiatorClient(NOWHERE) as client:
        with pytest.raises(TypeError, match="not both"):
            client.produce(pb.ProduceRequest(adapter="demo"), prompt="hi")
        with pytest.raises(TypeError, match="not both"):
            client.invoke(pb.InvokeRequest(adapter="demo"), adapter="demo")
    async with AsyncNegotiatorClient(NOWHERE) as aio_client:
        with pytest.raises(TypeError, match="not both"):
            await aio_client.produce(pb.ProduceRequest(adapter="demo"), output_schema={})
        with pytest.raises(TypeError, match="not both"):
            await aio_client.invoke(pb.InvokeRequest(adapter="demo"), agent="harness")
