"""The sidecar's own limits seen through the negotiator: the default deadline and the send size."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from fakes import make_declaration
from negotiator_testkit import add_fake, call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.conversations import ConversationStore
from agentsidecar.negotiator_service.model import AdapterCall, AdapterReply, Capability
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server
from agentsidecar.sidecar_runtime import limits
from agentsidecar.sidecar_runtime.server import ServerOptions

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


@pytest.mark.slow
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


# --- a reply too large to send commits nothing ------------------------------------------


def count(kind: str, call: AdapterCall) -> AdapterReply:
    state = call.conversation_state
    n = (state["n"] if isinstance(state, dict) else 0) + 1
    return AdapterReply(text=str(n), conversation_state={"n": n})


async def test_a_reply_too_large_to_send_fails_whole_and_commits_nothing(
    start: Started, state_home: Path
) -> None:
    huge = AdapterReply(text="x" * 10_000, conversation_state={"n": 99})
    declaration = make_declaration("counter", supported=[Capability.STATEFUL_HISTORY])
    record = state_home / "conversations" / f"{hashlib.sha256(b'c1').hexdigest()}.json"
    async with start(max_message_bytes=4096) as (negotiator, stub):
        add_fake(negotiator, declaration, replies=[count, huge, count])
        watch = stub.WatchAudit(pb.WatchAuditRequest())
        await asyncio.wait_for(watch.initial_metadata(), 5)

        def invoke() -> Any:
            options = pb.CallOptions(conversation_id="c1")
            return stub.Invoke(pb.InvokeRequest(adapter="counter", prompt="p", options=options), timeout=5)

        assert (await invoke()).text == "1"
        committed = record.read_bytes()
        error = await call_error(invoke())
        assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (error.domain, error.reason) == ("negotiator.agentsidecar", "REPLY_TOO_LARGE")
        assert error.metadata["adapter"] == "counter"
        assert error.metadata["maxMessageBytes"] == "4096"
        assert int(error.metadata["replyBytes"]) > 10_000
        assert record.read_bytes() == committed  # the state before the failed call
        assert (await invoke()).text == "2"  # the conversation goes on from it
        assert json.loads(record.read_text())["state"] == {"n": 2}

        outcomes: list[tuple[str, str]] = []
        async with asyncio.timeout(5):
            while len(outcomes) < 3:
                response = await watch.read()
                assert isinstance(response, pb.WatchAuditResponse)
                outcomes.append((response.record.outcome, response.record.error_reason))
        watch.cancel()
    assert outcomes == [("succeeded", ""), ("failed", "REPLY_TOO_LARGE"), ("succeeded", "")]


async def test_a_reply_too_large_without_a_conversation_has_error_info(start: Started) -> None:
    async with start(max_message_bytes=4096) as (negotiator, stub):
        add_fake(negotiator, make_declaration("big"), default="y" * 10_000)
        error = await call_error(stub.Invoke(pb.InvokeRequest(adapter="big", prompt="p"), timeout=5))
    assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "REPLY_TOO_LARGE")


async def test_a_reply_of_exactly_the_limit_is_sent_and_one_byte_more_is_not(start: Started) -> None:
    # Multi-byte text: the reply's size bound is well over the limit, so its exact size decides.
    async with start(max_message_bytes=4096) as (negotiator, stub):
        fake = add_fake(negotiator, make_declaration("edge"), default="é")
        decision = (await stub.Invoke(pb.InvokeRequest(adapter="edge", prompt="p"), timeout=5)).decision
        texts = {
            pb.InvokeResponse(text=t, decision=decision).ByteSize(): t
            for t in ("é" * n for n in range(1900, 2100))
        }
        texts.update(
            {
                pb.InvokeResponse(text=t, decision=decision).ByteSize(): t
                for t in ("é" * n + "y" for n in range(1900, 2100))
            }
        )
        fake.script(AdapterReply(text=texts[4096]), AdapterReply(text=texts[4097]))
        assert (await stub.Invoke(pb.InvokeRequest(adapter="edge", prompt="p"), timeout=5)).text == texts[
            4096
        ]
        error = await call_error(stub.Invoke(pb.InvokeRequest(adapter="edge", prompt="p"), timeout=5))
    assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "REPLY_TOO_LARGE")
    assert error.metadata["replyBytes"] == "4097"
