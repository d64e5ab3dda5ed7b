"""Stream helpers: leaving the loop cancels the call on the server; errors map mid-stream too."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agentsidecar.clients import AsyncSeedStoreClient, SeedMalformedError, SeedStoreClient
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from tests.clients.sidecars import MID_STREAM_FAILURE, FakeServer

CANCEL_SEEN_WITHIN = 5.0


@pytest.mark.parametrize("stream", ["verify", "watch"])
def test_breaking_out_of_a_sync_loop_cancels_the_call(
    start_fake: Callable[..., FakeServer], stream: str
) -> None:
    server = start_fake()
    with SeedStoreClient(server.unix) as client:
        events = client.verify("say") if stream == "verify" else client.watch()
        for event in events:
            assert isinstance(event, pb.CheckStarted | pb.WatchSeedsResponse)
            break
        del events  # the loop is over and nothing else holds the generator
        assert server.fake.stream_started.wait(CANCEL_SEEN_WITHIN)
        assert server.fake.cancelled.wait(CANCEL_SEEN_WITHIN), "the server never saw the cancellation"


@pytest.mark.parametrize("stream", ["verify", "watch"])
async def test_breaking_out_of_an_async_loop_cancels_the_call(
    start_fake: Callable[..., FakeServer], stream: str
) -> None:
    server = start_fake()
    async with AsyncSeedStoreClient(server.unix) as client:
        async for event in client.verify("say") if stream == "verify" else client.watch():
            assert isinstance(event, pb.CheckStarted | pb.WatchSeedsResponse)
            break
        assert server.fake.stream_started.wait(CANCEL_SEEN_WITHIN)
        for _ in range(50):  # the loop finalizes the dropped generator on its next turns
            if server.fake.cancelled.is_set():
                break
            await asyncio.sleep(0.05)
        assert server.fake.cancelled.is_set(), "the server never saw the cancellation"


def test_closing_the_raw_stream_cancels_the_call(start_fake: Callable[..., FakeServer]) -> None:
    server = start_fake()
    with SeedStoreClient(server.tcp) as client:
        responses = client.verify_seeds(ids=["say"])
        assert next(responses).check_started.id == "say"
        responses.close()
        assert server.fake.cancelled.wait(CANCEL_SEEN_WITHIN)


def test_an_error_after_the_first_event_is_mapped(start_fake: Callable[..., FakeServer]) -> None:
    server = start_fake()
    seen: list[object] = []

    def consume() -> None:
        with SeedStoreClient(server.unix) as client:
            for event in client.verify(MID_STREAM_FAILURE):
                seen.append(event)

    with pytest.raises(SeedMalformedError) as failed:
        consume()
    assert [type(e) for e in seen] == [pb.CheckStarted]
    assert (failed.value.path, failed.value.line, failed.value.detail) == (
        "/store/voice/x.yml",
        3,
        "bad indent",
    )


async def test_an_async_error_after_the_first_event_is_mapped(start_fake: Callable[..., FakeServer]) -> None:
    server = start_fake()
    seen: list[object] = []

    async def consume() -> None:
        async with AsyncSeedStoreClient(server.unix) as client:
            async for response in client.verify_seeds(ids=[MID_STREAM_FAILURE]):
                seen.append(response)

    with pytest.raises(SeedMalformedError) as failed:
        await consume()
    assert len(seen) == 1
    assert failed.value.original is not None
    assert failed.value.message == "the seed file became malformed"
