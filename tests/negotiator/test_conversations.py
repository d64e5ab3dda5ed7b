"""Conversations over a real negotiator: serialization, commit-on-success, pinning, restart, depth.

Each test runs negotiators whose ConversationStore lives in the test's own
state directory, so "restart" is stopping one server and creating another on
the same directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeAlias

import grpc
import pytest
from fakes import FakeAdapter, make_declaration
from mock_openai import MockOpenAI
from negotiator_testkit import NEGOTIATOR_BIN, add_fake, call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters import openai
from agentsidecar.negotiator_service.adapters.scripted import ScriptedAdapter
from agentsidecar.negotiator_service.cli import main as cli_main
from agentsidecar.negotiator_service.conversations import (
    ConversationRecord,
    ConversationStore,
    default_state_dir,
    record_from_text,
    record_to_text,
)
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterKind,
    AdapterReply,
    AdapterSpec,
    CallOptions,
    Capability,
    CapabilityState,
    DeclarationOverride,
)
from agentsidecar.negotiator_service.registry import RegisteredAdapter
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server
from tests.procs import start_process, stop_process

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
StartServer: TypeAlias = Callable[..., Awaitable[RunningNegotiator]]

DEPTH_KEY = "x-delegation-depth"
KEY_ENV = "NEGOTIATOR_TEST_CONVERSATION_KEY"
CONFIG = """\
adapters:
  - shortname: chat
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {stateful_history: supported}
    options:
      invoke: {transcript: true}
  - shortname: forgetful
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {stateful_history: unsupported}
"""
STATEFUL = make_declaration("counter", supported=[Capability.STATEFUL_HISTORY, Capability.STRUCTURED_OUTPUT])
COUNT_SCHEMA = json.dumps(
    {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}, separators=(",", ":")
)


def count(kind: str, call: AdapterCall) -> AdapterReply:
    """Count committed turns in the state; Produce answers {"n": n}, Invoke answers n."""
    state = call.conversation_state
    n = (state["n"] if isinstance(state, dict) else 0) + 1
    text = json.dumps({"n": n}) if kind == "produce" else str(n)
    return AdapterReply(text=text, conversation_state={"n": n})


def options(
    conversation_id: str = "c1",
    *,
    no_wait: bool = False,
    new_conversation: bool = False,
    persona: str | None = None,
) -> pb.CallOptions:
    return pb.CallOptions(
        conversation_id=conversation_id, no_wait=no_wait, new_conversation=new_conversation, persona=persona
    )


def invoke(adapter: str, prompt: str = "hi", **fields: Any) -> pb.InvokeRequest:
    return pb.InvokeRequest(adapter=adapter, prompt=prompt, options=options(**fields))


def state_file(state_dir: Path, conversation_id: str = "c1") -> Path:
    return state_dir / f"{hashlib.sha256(conversation_id.encode()).hexdigest()}.json"


def stored(state_dir: Path, conversation_id: str = "c1") -> dict[str, Any]:
    data: dict[str, Any] = json.loads(state_file(state_dir, conversation_id).read_text())
    return data


def held_until(
    gate: asyncio.Event, started: asyncio.Event
) -> Callable[[str, AdapterCall], Awaitable[AdapterReply]]:
    """A reply that signals `started`, then counts once `gate` opens."""

    async def reply(kind: str, call: AdapterCall) -> AdapterReply:
        started.set()
        await gate.wait()
        return count(kind, call)

    return reply


async def signalled(event: asyncio.Event) -> None:
    async with asyncio.timeout(5):
        await event.wait()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def suffixes(directory: Path) -> list[str]:
    return sorted(p.suffix for p in directory.iterdir())


def exists(path: Path) -> bool:
    return path.exists()


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
async def start_server(
    socket_dir: Path, tmp_path: Path, state_dir: Path
) -> AsyncIterator[Callable[..., Awaitable[RunningNegotiator]]]:
    """Start negotiators on `state_dir` (or another); all are stopped at the end."""
    config = tmp_path / "conversations.yaml"
    config.write_text(CONFIG)
    started: list[RunningNegotiator] = []

    async def start(
        name: str = "n", directory: Path | None = None, config_text: str | None = None
    ) -> RunningNegotiator:
        path = config
        if config_text is not None:
            path = tmp_path / f"{name}.yaml"
            path.write_text(config_text)
        settings = Settings(listen=(f"unix:{socket_dir / name}.sock",), config_path=path, grace_seconds=1.0)
        running = await create_server(settings, conversation_store=ConversationStore(directory or state_dir))
        started.append(running)
        return running

    try:
        yield start
    finally:
        for running in started:
            await running.stop()


@pytest.fixture
async def negotiator(start_server: StartServer) -> RunningNegotiator:
    return await start_server()


@pytest.fixture
async def stub(negotiator: RunningNegotiator) -> AsyncIterator[Stub]:
    async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
        yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)


# --- the store's pure parts ---------------------------------------------------------


def test_default_state_dir_follows_xdg() -> None:
    home = Path("/home/u")
    tail = Path("agentsidecar/conversations")
    assert default_state_dir({"XDG_STATE_HOME": "/var/st"}, home) == Path("/var/st") / tail
    assert default_state_dir({}, home) == home / ".local/state" / tail
    # The spec says a relative path is invalid and must be ignored.
    assert default_state_dir({"XDG_STATE_HOME": "rel"}, home) == home / ".local/state" / tail


def test_record_round_trip_and_refusals() -> None:
    record = ConversationRecord("c1", "chat", "sha256:ab", 2, {"k": [1, "x"]}, 3, "2025-01-01T00:00:00.000Z")
    assert record_from_text("c1", record_to_text(record)) == record
    with pytest.raises(ValueError, match="belongs to conversation 'c1'"):
        record_from_text("other", record_to_text(record))
    with pytest.raises(ValueError, match="missing state"):
        record_from_text(
            "c1", json.dumps({k: v for k, v in json.loads(record_to_text(record)).items() if k != "state"})
        )
    with pytest.raises(ValueError, match="delegation_depth"):
        record_from_text(
            "c1", record_to_text(record).replace('"delegation_depth": 2', '"delegation_depth": -1')
        )
    with pytest.raises(ValueError, match="JSON compliant"):
        record_to_text(ConversationRecord("c1", "a", "v", 0, float("nan"), 1, "t"))


# --- basics ------------------------------------------------------------------------------


async def test_scripted_conversation_keeps_its_transcript_in_a_state_file(
    stub: Stub, negotiator: RunningNegotiator, state_dir: Path
) -> None:
    assert (await stub.Invoke(invoke("chat", "one"), timeout=5)).text == '["one"]'
    assert (await stub.Invoke(invoke("chat", "two"), timeout=5)).text == '["one", "two"]'
    # Another conversation, and a call outside any, start from nothing.
    assert (await stub.Invoke(invoke("chat", "x", conversation_id="c2"), timeout=5)).text == '["x"]'
    plain = await stub.Invoke(pb.InvokeRequest(adapter="chat", prompt="solo"), timeout=5)
    assert plain.text == '["solo"]'

    record = stored(state_dir)
    version = negotiator.registry.declaration("chat").version
    assert {k: v for k, v in record.items() if k != "updated_at"} == {
        "conversation_id": "c1",
        "adapter": "chat",
        "declaration_version": version,
        "delegation_depth": 0,
        "state": {"turns": 2, "prompts": ["one", "two"]},
        "turns": 2,
    }
    assert record["updated_at"].endswith("Z")
    assert mode(state_file(state_dir)) == 0o600
    assert mode(state_dir) == 0o700
    # Two conversations, two state files (plus their lock files), no temp files left.
    assert suffixes(state_dir) == [".json", ".json", ".lock", ".lock"]


async def test_a_conversation_needs_stateful_history(stub: Stub, state_dir: Path) -> None:
    error = await call_error(stub.Invoke(invoke("forgetful"), timeout=5))
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UNSUPPORTED_CAPABILITY")
    assert error.metadata["gaps"] == "stateful_history"
    assert error.precondition_violations[0].description.startswith(
        "options.conversation_id needs stateful_history"
    )
    negotiated = await stub.Negotiate(pb.NegotiateRequest(invoke=invoke("chat")), timeout=5)
    assert [v.requirement.request_field for v in negotiated.decision.verdicts] == ["options.conversation_id"]
    assert negotiated.decision.accepted
    assert not exists(state_dir)  # a refusal never touches the store


async def test_conversation_flags_without_a_conversation_are_invalid(stub: Stub) -> None:
    for flags, field in (
        (pb.CallOptions(no_wait=True), "options.no_wait"),
        (pb.CallOptions(new_conversation=True), "options.new_conversation"),
    ):
        request = pb.InvokeRequest(adapter="chat", prompt="hi", options=flags)
        error = await call_error(stub.Invoke(request, timeout=5))
        assert (error.code, [f for f, _ in error.field_violations]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            [field],
        )
    for bad in ("  ", "x" * 513):
        error = await call_error(stub.Invoke(invoke("chat", conversation_id=bad), timeout=5))
        assert [f for f, _ in error.field_violations] == ["options.conversation_id"]


# --- serialization ---------------------------------------------------------------------------


async def test_concurrent_calls_of_one_conversation_never_overlap(
    stub: Stub, negotiator: RunningNegotiator, state_dir: Path
) -> None:
    active = 0
    most = 0

    async def counted(kind: str, call: AdapterCall) -> AdapterReply:
        nonlocal active, most
        active += 1
        most = max(most, active)
        try:
            await asyncio.sleep(0.03)
            return count(kind, call)
        finally:
            active -= 1

    fake = add_fake(negotiator, STATEFUL, default=counted)
    replies = await asyncio.gather(*(stub.Invoke(invoke("counter", f"p{i}"), timeout=10) for i in range(6)))
    assert most == 1
    assert sorted(r.text for r in replies) == ["1", "2", "3", "4", "5", "6"]
    # Each call started from the state the previous one committed.
    seen = sorted((c.conversation_state or {"n": 0})["n"] for _, c in fake.calls)
    assert seen == [0, 1, 2, 3, 4, 5]
    assert stored(state_dir)["state"] == {"n": 6}
    assert stored(state_dir)["turns"] == 6

    # Different conversations do run side by side.
    most = 0
    await asyncio.gather(
        *(stub.Invoke(invoke("counter", conversation_id=f"other-{i}"), timeout=10) for i in range(3))
    )
    assert most == 3


async def test_a_busy_conversation_aborts_no_wait_callers_and_queues_the_rest(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    gate, started = asyncio.Event(), asyncio.Event()
    fake = add_fake(negotiator, STATEFUL, replies=[held_until(gate, started)], default=count)
    first = asyncio.ensure_future(stub.Invoke(invoke("counter"), timeout=10))
    await signalled(started)

    error = await call_error(stub.Invoke(invoke("counter", no_wait=True), timeout=5))
    assert (error.code, error.reason) == (grpc.StatusCode.ABORTED, "CONVERSATION_BUSY")
    assert error.metadata == {"conversationId": "c1"}
    # A refusal does not wait for the conversation either.
    error = await call_error(stub.Invoke(invoke("counter", persona="pirate"), timeout=5))
    assert error.reason == "UNSUPPORTED_CAPABILITY"
    # A waiting caller's deadline runs while it waits.
    error = await call_error(stub.Invoke(invoke("counter"), timeout=0.2))
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    # Other conversations are not held up, even with no_wait.
    other = await stub.Invoke(invoke("counter", conversation_id="c2", no_wait=True), timeout=5)
    assert other.text == "1"

    queued = asyncio.ensure_future(stub.Invoke(invoke("counter"), timeout=10))
    await asyncio.sleep(0.1)
    assert fake.call_count == 2  # the held call and c2's: the queued one has not started
    gate.set()
    assert (await first).text == "1"
    assert (await queued).text == "2"


async def test_two_negotiators_on_one_state_dir_serialize_a_conversation(start_server: StartServer) -> None:
    gate, started = asyncio.Event(), asyncio.Event()
    first, second = await start_server("first"), await start_server("second")
    add_fake(first, STATEFUL, replies=[held_until(gate, started)])
    waiter = add_fake(second, STATEFUL, default=count)
    async with (
        grpc.aio.insecure_channel(first.bound[0]) as first_channel,
        grpc.aio.insecure_channel(second.bound[0]) as second_channel,
    ):
        first_stub = negotiator_pb2_grpc.NegotiatorServiceStub(first_channel)
        second_stub = negotiator_pb2_grpc.NegotiatorServiceStub(second_channel)
        running = asyncio.ensure_future(first_stub.Invoke(invoke("counter"), timeout=10))
        await signalled(started)
        error = await call_error(second_stub.Invoke(invoke("counter", no_wait=True), timeout=5))
        assert error.reason == "CONVERSATION_BUSY"
        queued = asyncio.ensure_future(second_stub.Invoke(invoke("counter"), timeout=10))
        await asyncio.sleep(0.1)
        assert waiter.call_count == 0
        gate.set()
        assert (await running).text == "1"
        assert (await queued).text == "2"  # it read what the other process committed


# --- commit only on success -----------------------------------------------------------------


async def test_a_failed_call_commits_nothing(
    stub: Stub, negotiator: RunningNegotiator, state_dir: Path
) -> None:
    add_fake(
        negotiator,
        STATEFUL,
        replies=[count, errors.AdapterInternal("counter", "boom"), count],
    )
    assert (await stub.Invoke(invoke("counter"), timeout=5)).text == "1"
    before = state_file(state_dir).read_bytes()
    error = await call_error(stub.Invoke(invoke("counter"), timeout=5))
    assert error.reason == "ADAPTER_INTERNAL"
    assert state_file(state_dir).read_bytes() == before
    assert (await stub.Invoke(invoke("counter"), timeout=5)).text == "2"
    assert stored(state_dir)["turns"] == 2


async def test_output_that_breaks_the_schema_commits_nothing(
    stub: Stub, negotiator: RunningNegotiator, state_dir: Path
) -> None:
    bad = AdapterReply(text='{"n": "many"}', conversation_state={"n": 99})
    fake = add_fake(negotiator, STATEFUL, replies=[count, bad, count])

    def produce() -> Any:
        request = pb.ProduceRequest(
            adapter="counter", prompt="p", output_schema=COUNT_SCHEMA, options=options()
        )
        return stub.Produce(request, timeout=5)

    assert json.loads((await produce()).output_json) == {"n": 1}
    error = await call_error(produce())
    assert (error.code, error.reason) == (grpc.StatusCode.INTERNAL, "OUTPUT_SCHEMA_VIOLATION")
    assert json.loads((await produce()).output_json) == {"n": 2}
    assert fake.calls[2][1].conversation_state == {"n": 1}
    assert stored(state_dir)["state"] == {"n": 2}


async def test_a_cancelled_call_commits_nothing(
    stub: Stub, negotiator: RunningNegotiator, state_dir: Path
) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hang(kind: str, call: AdapterCall) -> AdapterReply:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("never set")

    fake = add_fake(negotiator, STATEFUL, replies=[count, hang], default=count)
    assert (await stub.Invoke(invoke("counter"), timeout=5)).text == "1"
    before = state_file(state_dir).read_bytes()

    hanging = stub.Invoke(invoke("counter"), timeout=10)
    await signalled(started)
    hanging.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hanging
    await signalled(cancelled)  # the adapter's work was cancelled with the call
    assert state_file(state_dir).read_bytes() == before
    # The lease was released, and the next call starts from the last commit.
    assert (await stub.Invoke(invoke("counter"), timeout=5)).text == "2"
    assert fake.calls[2][1].conversation_state == {"n": 1}


async def test_state_that_is_not_json_fails_the_call(
    stub: Stub, negotiator: RunningNegotiator, state_dir: Path
) -> None:
    unserializable = AdapterReply(text="x", conversation_state={"when": object()})
    add_fake(negotiator, STATEFUL, replies=[count, unserializable], default=count)
    await stub.Invoke(invoke("counter"), timeout=5)
    error = await call_error(stub.Invoke(invoke("counter"), timeout=5))
    assert error.reason == "ADAPTER_INTERNAL"
    assert "not JSON" in error.metadata["cause"]
    assert stored(state_dir)["state"] == {"n": 1}


# --- binding and pinning ------------------------------------------------------------------------


async def test_the_declaration_is_pinned_per_conversation(
    stub: Stub, negotiator: RunningNegotiator, state_dir: Path
) -> None:
    original = add_fake(negotiator, STATEFUL, source="runtime", default=count)
    assert (await stub.Invoke(invoke("counter"), timeout=5)).text == "1"
    assert stored(state_dir)["declaration_version"] == STATEFUL.version

    negotiator.registry.remove("counter")
    changed = make_declaration(
        "counter", supported=[Capability.STATEFUL_HISTORY, Capability.STRUCTURED_OUTPUT, Capability.PERSONA]
    )
    replacement = add_fake(negotiator, changed, source="runtime", default=count)
    error = await call_error(stub.Invoke(invoke("counter"), timeout=5))
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "DECLARATION_CHANGED")
    assert error.metadata == {
        "conversationId": "c1",
        "adapter": "counter",
        "pinnedVersion": STATEFUL.version,
        "declarationVersion": changed.version,
    }
    assert [v.type for v in error.precondition_violations] == ["DECLARATION_CHANGED"]
    assert replacement.call_count == 0

    # Starting afresh drops the state and re-pins; the conversation then continues.
    assert (await stub.Invoke(invoke("counter", new_conversation=True), timeout=5)).text == "1"
    assert replacement.calls[0][1].conversation_state is None
    assert (await stub.Invoke(invoke("counter"), timeout=5)).text == "2"
    assert stored(state_dir)["declaration_version"] == changed.version
    assert stored(state_dir)["turns"] == 2
    assert original.call_count == 1


async def test_a_failed_new_conversation_keeps_the_old_one(
    stub: Stub, negotiator: RunningNegotiator, state_dir: Path
) -> None:
    add_fake(
        negotiator,
        STATEFUL,
        replies=[count, count, errors.AdapterUnavailable("counter", "down")],
        default=count,
    )
    await stub.Invoke(invoke("counter"), timeout=5)
    await stub.Invoke(invoke("counter"), timeout=5)
    error = await call_error(stub.Invoke(invoke("counter", new_conversation=True), timeout=5))
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert (await stub.Invoke(invoke("counter"), timeout=5)).text == "3"
    assert stored(state_dir)["turns"] == 3


async def test_a_conversation_is_bound_to_its_adapter(stub: Stub, negotiator: RunningNegotiator) -> None:
    add_fake(negotiator, make_declaration("a1", supported=[Capability.STATEFUL_HISTORY]), default=count)
    second = add_fake(
        negotiator, make_declaration("a2", supported=[Capability.STATEFUL_HISTORY]), default=count
    )
    await stub.Invoke(invoke("a1"), timeout=5)
    error = await call_error(stub.Invoke(invoke("a2"), timeout=5))
    assert (error.code, error.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "CONVERSATION_ADAPTER_MISMATCH",
    )
    assert error.metadata == {"conversationId": "c1", "adapter": "a1", "requestedAdapter": "a2"}
    assert second.call_count == 0
    assert (await stub.Invoke(invoke("a2", new_conversation=True), timeout=5)).text == "1"
    error = await call_error(stub.Invoke(invoke("a1"), timeout=5))
    assert error.metadata["adapter"] == "a2"


async def test_an_unreadable_state_file_is_data_loss_until_started_afresh(
    stub: Stub, negotiator: RunningNegotiator, state_dir: Path
) -> None:
    add_fake(negotiator, STATEFUL, default=count)
    await stub.Invoke(invoke("counter"), timeout=5)
    state_file(state_dir).write_text("{ truncated")
    error = await call_error(stub.Invoke(invoke("counter"), timeout=5))
    assert (error.code, error.reason) == (grpc.StatusCode.DATA_LOSS, "CONVERSATION_STATE_CORRUPT")
    assert error.metadata["conversationId"] == "c1"
    assert (await stub.Invoke(invoke("counter", new_conversation=True), timeout=5)).text == "1"
    assert stored(state_dir)["state"] == {"n": 1}


# --- restart and depth ------------------------------------------------------------------------------


async def test_a_restarted_negotiator_resumes_the_conversation(start_server: StartServer) -> None:
    first = await start_server("first")
    async with grpc.aio.insecure_channel(first.bound[0]) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        assert (await stub.Invoke(invoke("chat", "one"), timeout=5)).text == '["one"]'
    await first.stop()

    second = await start_server("second")
    async with grpc.aio.insecure_channel(second.bound[0]) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        assert (await stub.Invoke(invoke("chat", "two"), timeout=5)).text == '["one", "two"]'


async def test_delegation_depth_never_decreases_across_a_restart(
    start_server: StartServer, state_dir: Path
) -> None:
    first = await start_server("first")
    before = add_fake(first, STATEFUL, default=count)
    async with grpc.aio.insecure_channel(first.bound[0]) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        await stub.Invoke(invoke("counter"), timeout=5, metadata=((DEPTH_KEY, "2"),))
    await first.stop()
    assert before.calls[0][1].delegation_depth == 2
    assert stored(state_dir)["delegation_depth"] == 2

    second = await start_server("second")
    after = add_fake(second, STATEFUL, default=count)
    async with grpc.aio.insecure_channel(second.bound[0]) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        await stub.Invoke(invoke("counter"), timeout=5, metadata=((DEPTH_KEY, "0"),))
        await stub.Invoke(invoke("counter"), timeout=5)
        # new_conversation drops the state, not the depth.
        await stub.Invoke(invoke("counter", new_conversation=True), timeout=5, metadata=((DEPTH_KEY, "1"),))
    assert [c.delegation_depth for _, c in after.calls] == [2, 2, 2]
    assert after.calls[2][1].conversation_state is None
    assert stored(state_dir)["delegation_depth"] == 2


# --- the openai adapter's history -------------------------------------------------------------------


@pytest.mark.slow
async def test_openai_sends_the_committed_history(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-not-a-real-key")
    with MockOpenAI() as mock:
        config = (
            "adapters:\n"
            "  - shortname: llm\n"
            "    implementation: openai\n"
            f"    options: {{base_url: '{mock.base_url}', api_key_env: {KEY_ENV}, model: mock-1}}\n"
        )
        negotiator = await start_server("llm", config_text=config)
        async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
            stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
            mock.reply_text = "first answer"
            await stub.Invoke(invoke("llm", "Hello"), timeout=5)
            mock.reply_text = "second answer"
            await stub.Invoke(invoke("llm", "Again"), timeout=5)
            mock.mode = "500"
            error = await call_error(stub.Invoke(invoke("llm", "Lost"), timeout=5))
            assert error.code is grpc.StatusCode.UNAVAILABLE
            mock.mode = "ok"
            await stub.Invoke(invoke("llm", "Last"), timeout=5)
            await stub.Invoke(pb.InvokeRequest(adapter="llm", prompt="Alone"), timeout=5)

    sent = [request.body["messages"] for request in mock.requests]
    assert sent[0] == [user("Hello")]
    assert sent[1] == [user("Hello"), assistant("first answer"), user("Again")]
    # The failed call left nothing behind: "Lost" is not in the history.
    assert sent[3] == [
        user("Hello"),
        assistant("first answer"),
        user("Again"),
        assistant("second answer"),
        user("Last"),
    ]
    assert sent[4] == [user("Alone")]
    assert stored(state_dir)["state"]["messages"][-1] == assistant("second answer")
    assert len(stored(state_dir)["state"]["messages"]) == 6


def test_state_directory_is_not_created_for_nothing(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / "never")
    assert store.load("c1") is None
    assert not (tmp_path / "never").exists()
    assert os.path.basename(store.path("../../etc/passwd")).endswith(".json")
    assert store.path("../../etc/passwd").parent == tmp_path / "never"


async def test_a_conversation_whose_adapter_is_gone_is_not_found(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = FakeAdapter(make_declaration("gone", supported=[Capability.STATEFUL_HISTORY]), default=count)
    negotiator.registry.add(RegisteredAdapter(adapter=fake, source="runtime"))
    await stub.Invoke(invoke("gone"), timeout=5)
    negotiator.registry.remove("gone")
    error = await call_error(stub.Invoke(invoke("gone"), timeout=5))
    assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, "ADAPTER_NOT_FOUND")


# --- adapters' own checks -----------------------------------------------------------------------------


def scripted_spec(**options: Any) -> AdapterSpec:
    return AdapterSpec(
        shortname="s",
        implementation="scripted",
        declaration=DeclarationOverride(
            kind=AdapterKind.FRAMEWORK,
            capabilities=MappingProxyType({Capability.STATEFUL_HISTORY: CapabilityState.SUPPORTED}),
        ),
        options=MappingProxyType(options),
    )


async def test_scripted_adapter_refuses_a_state_it_did_not_write() -> None:
    with pytest.raises(errors.ConfigError, match="transcript"):
        ScriptedAdapter(scripted_spec(invoke={"transcript": False}))
    adapter = ScriptedAdapter(scripted_spec(invoke={"echo": True}))
    call = AdapterCall(prompt="p", options=CallOptions(conversation_id="c"), conversation_state={"n": 1})
    with pytest.raises(errors.AdapterInternal, match="not a scripted transcript"):
        await adapter.invoke(call)
    # Outside a conversation there is no state to return.
    reply = await adapter.invoke(AdapterCall(prompt="p", options=CallOptions()))
    assert (reply.text, reply.conversation_state) == ("p", None)


def test_openai_history_must_be_chat_messages() -> None:
    assert openai.history("llm", None) == []
    assert openai.history("llm", {"messages": [{"role": "user", "content": "x"}]}) == [
        {"role": "user", "content": "x"}
    ]
    for bad in ({"messages": "x"}, {"messages": [{"content": "x"}]}, ["x"]):
        with pytest.raises(errors.AdapterInternal, match="not a list of chat messages"):
            openai.history("llm", bad)


async def test_conversation_refusals_and_turns_are_audited(stub: Stub, negotiator: RunningNegotiator) -> None:
    watch = stub.WatchAudit(pb.WatchAuditRequest())
    await asyncio.wait_for(watch.initial_metadata(), 5)
    gate, started = asyncio.Event(), asyncio.Event()
    add_fake(negotiator, STATEFUL, replies=[held_until(gate, started)], default=count)
    first = asyncio.ensure_future(stub.Invoke(invoke("counter"), timeout=10, metadata=((DEPTH_KEY, "1"),)))
    await signalled(started)
    await call_error(stub.Invoke(invoke("counter", no_wait=True), timeout=5))
    gate.set()
    await first
    await call_error(stub.Invoke(invoke("chat"), timeout=5))  # bound to "counter"

    records: list[pb.AuditRecord] = []
    async with asyncio.timeout(5):
        while len(records) < 3:
            response = await watch.read()
            assert isinstance(response, pb.WatchAuditResponse)
            records.append(response.record)
    watch.cancel()
    summary = [(r.operation, r.adapter, r.outcome, r.error_reason, r.conversation_id) for r in records]
    assert summary == [
        ("invoke", "counter", "refused", "CONVERSATION_BUSY", "c1"),
        ("invoke", "counter", "succeeded", "", "c1"),
        ("invoke", "chat", "refused", "CONVERSATION_ADAPTER_MISMATCH", "c1"),
    ]
    assert records[1].delegation_depth == 1


# --- the command line ----------------------------------------------------------------------------------


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """negotiator's main() in a worker thread (its sync channel blocks)."""
    capsys.readouterr()
    code = await asyncio.to_thread(cli_main, list(argv))
    return code, capsys.readouterr().out


@pytest.mark.slow
async def test_serve_state_dir_flag_keeps_conversations_across_processes(
    capsys: pytest.CaptureFixture[str], socket_dir: Path, tmp_path: Path
) -> None:
    config, directory = tmp_path / "cli.yaml", tmp_path / "cli-state"
    config.write_text(CONFIG)
    address = f"unix:{socket_dir / 'cli.sock'}"
    serve = [str(NEGOTIATOR_BIN), "serve", "--config", str(config), "--state-dir", str(directory)]
    call = ["--server", address, "invoke", "--adapter", "chat", "--conversation", "c1"]

    process, _ = start_process([*serve, "--listen", address])
    try:
        code, out = await cli(capsys, *call, "one")
        assert (code, json.loads(out)["text"]) == (0, '["one"]')
    finally:
        stop_process(process)
    assert exists(state_file(directory))

    process, _ = start_process([*serve, "--listen", address])
    try:
        code, out = await cli(capsys, *call, "--no-wait", "two")
        assert (code, json.loads(out)["text"]) == (0, '["one", "two"]')
        code, out = await cli(capsys, *call, "--new-conversation", "three")
        assert (code, json.loads(out)["text"]) == (0, '["three"]')
    finally:
        stop_process(process)
