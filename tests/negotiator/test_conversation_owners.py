"""Conversation ids as bearer secrets: bound to the caller's token, and generated on request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeAlias

import grpc
import pytest
from fakes import FakeAdapter, make_declaration
from negotiator_testkit import add_fake, call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.conversations import GENERATED_ID_BYTES, ConversationStore
from agentsidecar.negotiator_service.model import AdapterCall, AdapterReply, Capability
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server
from agentsidecar.sidecar_runtime.auth import EnvToken
from agentsidecar.sidecar_runtime.server import ServerOptions

Served: TypeAlias = "tuple[negotiator_pb2_grpc.NegotiatorServiceAsyncStub, FakeAdapter, bool]"
STATEFUL = make_declaration("counter", supported=[Capability.STATEFUL_HISTORY])
TOKEN_A, TOKEN_B = b"token-of-alice", b"token-of-bob"


def count(kind: str, call: AdapterCall) -> AdapterReply:
    """Counts committed turns; the state also carries what the conversation was told first."""
    state = call.conversation_state if isinstance(call.conversation_state, dict) else {"n": 0}
    n = int(state["n"]) + 1
    return AdapterReply(
        text=f"{n} {state.get('secret', call.prompt)}",
        conversation_state={"n": n, "secret": state.get("secret", call.prompt)},
    )


async def _negotiator(
    socket_dir: Path, config_file: Path, state_home: Path, *, tokens: bool
) -> RunningNegotiator:
    options = ServerOptions(listen=(), tokens=EnvToken("TOKENS", (TOKEN_A, TOKEN_B)) if tokens else None)
    return await create_server(
        Settings(
            listen=(f"unix:{socket_dir / 'owners.sock'}",),
            config_path=config_file,
            grace_seconds=0.5,
            server_options=options,
        ),
        conversation_store=ConversationStore(state_home / "conversations"),
    )


@pytest.fixture
async def served(
    request: pytest.FixtureRequest, socket_dir: Path, config_file: Path, state_home: Path
) -> AsyncIterator[Served]:
    """A negotiator with bearer tokens (param True) or without; a stub, its fake adapter, the param."""
    running = await _negotiator(socket_dir, config_file, state_home, tokens=request.param)
    fake = add_fake(running, STATEFUL, default=count)
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            yield negotiator_pb2_grpc.NegotiatorServiceStub(channel), fake, request.param
    finally:
        await running.stop()


def invoke(
    prompt: str,
    conversation_id: str = "",
    *,
    new_conversation: bool = False,
    generate_conversation_id: bool = False,
) -> pb.InvokeRequest:
    options = pb.CallOptions(
        conversation_id=conversation_id,
        new_conversation=new_conversation,
        generate_conversation_id=generate_conversation_id,
    )
    return pb.InvokeRequest(adapter="counter", prompt=prompt, options=options)


def bearer(token: bytes) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token.decode()}"),)


WITH_TOKENS = pytest.mark.parametrize("served", [True], ids=["tokens"], indirect=True)
WITHOUT_TOKENS = pytest.mark.parametrize("served", [False], ids=["no-tokens"], indirect=True)
EITHER = pytest.mark.parametrize("served", [True, False], ids=["tokens", "no-tokens"], indirect=True)


@WITH_TOKENS
async def test_another_token_reusing_an_id_never_reaches_the_conversation(
    served: Served,
) -> None:
    stub, fake, _ = served
    alice, bob = bearer(TOKEN_A), bearer(TOKEN_B)
    assert (await stub.Invoke(invoke("alice's secret", "shared"), metadata=alice, timeout=5)).text == (
        "1 alice's secret"
    )
    # Bob reuses the id: a conversation of his own, with none of Alice's state.
    reply = await stub.Invoke(invoke("bob here", "shared"), metadata=bob, timeout=5)
    assert reply.text == "1 bob here"
    assert fake.calls[1][1].conversation_state is None
    # Neither can Bob restart (wipe) Alice's conversation, or hold it busy.
    await stub.Invoke(invoke("wipe", "shared", new_conversation=True), metadata=bob, timeout=5)
    assert (
        await stub.Invoke(invoke("again", "shared"), metadata=alice, timeout=5)
    ).text == "2 alice's secret"


@WITHOUT_TOKENS
async def test_without_tokens_whoever_knows_the_id_continues(
    served: Served,
) -> None:
    stub, _, _ = served
    await stub.Invoke(invoke("first", "open"), timeout=5)
    assert (await stub.Invoke(invoke("second", "open"), timeout=5)).text == "2 first"


@EITHER
async def test_a_generated_id_is_returned_and_continues(
    served: Served,
) -> None:
    stub, _, tokens = served
    metadata = bearer(TOKEN_A) if tokens else ()
    first = await stub.Invoke(invoke("hello", generate_conversation_id=True), metadata=metadata, timeout=5)
    other = await stub.Invoke(invoke("hello", generate_conversation_id=True), metadata=metadata, timeout=5)
    generated = first.conversation_id
    assert len(generated) >= GENERATED_ID_BYTES * 4 // 3  # URL-safe base64 of the random bytes
    assert other.conversation_id != generated
    assert first.text == "1 hello"
    later = await stub.Invoke(invoke("again", generated), metadata=metadata, timeout=5)
    assert (later.text, later.conversation_id) == ("2 hello", generated)


@EITHER
async def test_generate_with_an_id_is_invalid(
    served: Served,
) -> None:
    stub, _, tokens = served
    metadata = bearer(TOKEN_A) if tokens else ()
    error = await call_error(
        stub.Invoke(invoke("x", "mine", generate_conversation_id=True), metadata=metadata, timeout=5)
    )
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [field for field, _ in error.field_violations] == ["options.generate_conversation_id"]
