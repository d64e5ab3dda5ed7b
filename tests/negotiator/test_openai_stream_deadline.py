"""The deadline of a streamed openai completion holds at every wait: before the events start and between them.

A provider here answers `text/event-stream` headers and then stalls, either
before its first event or after one content delta; the stream ends with
ADAPTER_TIMEOUT at the adapter's timeout_seconds, having yielded exactly the
deltas that arrived, and the connection is dropped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from test_adapter_openai import api_key, built, call, openai_spec  # noqa: F401 (api_key: a fixture)

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.model import CallKind, StreamDelta

HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
)


def _event(content: str) -> bytes:
    data = (
        b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": content}}]}).encode() + b"\n\n"
    )
    return b"%x\r\n%s\r\n" % (len(data), data)


class StallingProvider:
    """Sends the SSE head and `events`, then nothing; records when each connection was dropped."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.dropped = asyncio.Event()
        self._handlers: list[asyncio.Task[Any]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.append(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(HEAD + b"".join(_event(text) for text in self.events))
            await writer.drain()
            await reader.read()  # b"" once the adapter drops the connection
            self.dropped.set()
        finally:
            writer.close()

    async def stop(self) -> None:
        for handler in self._handlers:
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)


@pytest.fixture
async def provider(request: pytest.FixtureRequest) -> AsyncIterator[tuple[StallingProvider, str]]:
    stalling = StallingProvider(request.param)
    server = await asyncio.start_server(stalling.serve, "127.0.0.1", 0)
    try:
        yield stalling, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        server.close()
        await stalling.stop()


@pytest.mark.slow
@pytest.mark.parametrize(("provider", "deltas"), [([], []), (["po"], ["po"])], indirect=["provider"])
async def test_a_stalled_stream_ends_at_timeout_seconds_with_the_deltas_that_arrived(
    provider: tuple[StallingProvider, str],
    deltas: list[str],
    api_key: str,  # noqa: F811
) -> None:
    stalling, base_url = provider
    adapter = await built(openai_spec(base_url, timeout_seconds=0.4))
    received: list[str] = []

    async def read() -> None:
        async for item in adapter.stream(call(), CallKind.INVOKE):
            assert isinstance(item, StreamDelta)
            received.append(item.text)

    started = time.monotonic()
    try:
        with pytest.raises(errors.AdapterTimeout, match="timeout_seconds"):
            await asyncio.wait_for(read(), 5.0)  # a stream the deadline missed fails, not hangs
        elapsed = time.monotonic() - started
    finally:
        await adapter.close()
    assert received == deltas
    assert 0.3 < elapsed < 2.0
    await asyncio.wait_for(stalling.dropped.wait(), 2.0)
