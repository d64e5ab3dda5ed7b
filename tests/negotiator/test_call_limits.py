"""The sidecar's own limits seen through the negotiator: the default deadline and the send size."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from negotiator_testkit import call_error

from negotiator_service.conversations import ConversationStore
from negotiator_service.server import RunningNegotiator, Settings, create_server
from sidecar_runtime import limits
from sidecar_runtime.server import ServerOptions

Started = Callable[..., AbstractAsyncContextManager[tuple[RunningNegotiator, Any]]]


@pytest.fixture
def start(socket_dir: Path, config_file: Path, state_home: Path) -> Started:
    """A negotiator with the given ServerOptions fields, and a stub on its Unix socket."""

    @asynccontextmanager
    async def started(**options: Any) -> AsyncIterator[tuple[RunningNegotiator, Any]]:
        settings = Settings(
            listen=(f"unix:{socket_dir / 'limits.sock'}",),
            config_path=config_file,
            grace_seconds=0.5,
            server_options=ServerOptions(listen=(), **options),
        )
        running = await create_server(
            settings, conversation_store=ConversationStore(state_home / "conversations")
        )
        try:
            async with grpc.aio.insecure_channel(running.bound[0]) as channel:
                yield running, negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        finally:
            await running.stop()

    return started


async def test_a_call_without_deadline_past_the_default_timeout_says_so(start: Started) -> None:
    async with start(default_timeout=0.4) as (_, stub):
        # "slow" answers after 5 s; the call sets no deadline of its own.
        error = await call_error(stub.Invoke(pb.InvokeRequest(adapter="slow", prompt="hi")))
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert (error.domain, error.reason) == (limits.DOMAIN, limits.DEFAULT_TIMEOUT_EXCEEDED)
    assert error.metadata["defaultTimeoutSeconds"] == "0.4"


async def test_an_adapter_timeout_within_the_default_keeps_its_reason(start: Started) -> None:
    async with start(default_timeout=30.0) as (_, stub):
        # The adapter reports its own timeout long before the default deadline.
        error = await call_error(stub.Invoke(pb.InvokeRequest(adapter="fail-timeout", prompt="hi")))
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert error.reason == "ADAPTER_TIMEOUT"
