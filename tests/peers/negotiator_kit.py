"""A real negotiator, in process, serving a config that points openai adapters at a peer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc

from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.conversations import ConversationStore
from agentsidecar.negotiator_service.server import Settings, create_server

KEY_ENV = "NEGOTIATOR_PEER_KEY"


@asynccontextmanager
async def negotiator_stub(
    config: str, directory: Path
) -> AsyncIterator[negotiator_pb2_grpc.NegotiatorServiceAsyncStub]:
    path = directory / "negotiator.yaml"
    path.write_text(config)
    settings = Settings(listen=(f"unix:{directory / 'n.sock'}",), config_path=path, grace_seconds=1.0)
    running = await create_server(settings, conversation_store=ConversationStore(directory / "conversations"))
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)
    finally:
        await running.stop()
