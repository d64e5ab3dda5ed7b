"""The openai adapter reads a provider's body with a byte cap, through a real negotiator and mock server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TypeAlias

import grpc
import pytest
from mock_openai import MockOpenAI
from negotiator_testkit import call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.adapters.openai import DEFAULT_MAX_RESPONSE_BYTES
from agentsidecar.negotiator_service.conversations import ConversationStore
from agentsidecar.negotiator_service.server import Settings, create_server

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
KEY_ENV = "TEST_OPENAI_LIMITS_KEY"
CAP = 1024 * 1024


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[MockOpenAI]:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    with MockOpenAI() as mock:
        yield mock


@pytest.fixture
async def stub(server: MockOpenAI, tmp_path: Path, socket_dir: Path, state_home: Path) -> AsyncIterator[Stub]:
    config = tmp_path / "openai.yaml"
    config.write_text(
        "adapters:\n"
        "  - shortname: llm\n"
        "    implementation: openai\n"
        f"    options: {{base_url: '{server.base_url}', api_key_env: {KEY_ENV}, model: mock-1,"
        f" max_response_bytes: {CAP}}}\n"
    )
    running = await create_server(
        Settings(listen=(f"unix:{socket_dir / 'openai.sock'}",), config_path=config, grace_seconds=0.5),
        conversation_store=ConversationStore(state_home / "conversations"),
    )
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)
    finally:
        await running.stop()


@pytest.mark.parametrize("mode", ["huge", "huge_chunked"])
async def test_a_huge_provider_body_fails_at_the_cap_without_reading_it_all(
    stub: Stub, server: MockOpenAI, mode: str
) -> None:
    server.mode = mode
    error = await call_error(stub.Invoke(pb.InvokeRequest(adapter="llm", prompt="hi"), timeout=20))
    assert error.code is grpc.StatusCode.INTERNAL
    assert (error.reason, error.metadata["adapter"]) == ("ADAPTER_REPLY_TOO_LARGE", "llm")
    assert f"over max_response_bytes ({CAP})" in error.metadata["cause"]
    # Reading stopped at the cap: the 200 MiB were never all sent, let alone held.
    assert server.sent_bytes < server.huge_bytes // 4
    # The adapter still serves the next call.
    server.mode = "ok"
    assert (await stub.Invoke(pb.InvokeRequest(adapter="llm", prompt="hi"), timeout=10)).text


def test_the_default_cap_is_8_mib() -> None:
    assert DEFAULT_MAX_RESPONSE_BYTES == 8 * 1024 * 1024
