"""Tools and conversations through a remote adapter (tests/negotiator/remote_double.py as its own process).

Directly against RemoteAdapter for the CallWithTools protocol and its limits, and
through a real negotiator (ToolSession) where approvals, the tool filter and the
conversation's commit matter.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from test_adapter_remote import SCHEMA, ExampleProcess, example, remote
from test_tools import KEY_SCHEMA, Caller, Stub, tool

from agentsidecar.adapter.v1 import adapter_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters.remote import (
    MAX_TOOL_CALLS,
    RemoteAdapter,
    connect_remote,
    reply_state,
)
from agentsidecar.negotiator_service.model import AdapterCall, CallOptions, JsonValue, ToolOutcome, ToolSpec
from agentsidecar.negotiator_service.registry import RegisteredAdapter
from agentsidecar.negotiator_service.server import RunningNegotiator

__all__ = ["example", "remote"]  # fixtures (the example adapter's process and a connection), used by name


class LocalToolBox:
    """A ToolBox answering every call itself (or with `outcome`), recording what it was asked."""

    def __init__(
        self, *names: str, outcome: ToolOutcome | None = None, hold: bool = False, delay: float = 0.0
    ) -> None:
        self._specs = tuple(
            ToolSpec(name=n, arguments_schema=json.loads(KEY_SCHEMA), description=f"the {n} tool")
            for n in names
        )
        self._outcome = outcome
        self._hold = hold
        self._delay = delay
        self.calls: list[tuple[str, JsonValue]] = []
        self.called = asyncio.Event()

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return self._specs

    async def call(self, name: str, arguments: JsonValue) -> ToolOutcome:
        self.calls.append((name, arguments))
        self.called.set()
        if self._hold:
            await asyncio.Event().wait()  # a caller who never answers
        await asyncio.sleep(self._delay)  # a slow tool, or a caller slow to approve
        return self._outcome or ToolOutcome(result={"n": len(self.calls)})


def with_tools(prompt: str, tools: LocalToolBox) -> AdapterCall:
    return AdapterCall(prompt=prompt, options=CallOptions(), time_budget=10, tools=tools)


@pytest.mark.slow
async def test_a_tool_call_travels_to_the_toolbox_and_its_result_back(remote: RemoteAdapter) -> None:
    tools = LocalToolBox("lookup")
    reply = await remote.invoke(with_tools('tool:lookup:{"key": "colour"}', tools))
    assert tools.calls == [("lookup", {"key": "colour"})]
    assert json.loads(reply.text.removeprefix("remote:")) == {"tool": "lookup", "result": {"n": 1}}


@pytest.mark.slow
async def test_the_remote_is_told_only_the_visible_tools(remote: RemoteAdapter) -> None:
    reply = await remote.invoke(with_tools("tools:", LocalToolBox("lookup", "store")))
    assert json.loads(reply.text.removeprefix("remote:")) == ["lookup", "store"]


async def test_a_denial_and_an_error_reach_the_remote_as_outcomes(remote: RemoteAdapter) -> None:
    denied = LocalToolBox("store", outcome=ToolOutcome(error="not on Fridays", denied=True))
    reply = await remote.invoke(with_tools('tool:store:{"key": "k"}', denied))
    assert json.loads(reply.text.removeprefix("remote:")) == {
        "tool": "store",
        "error": "not on Fridays",
        "denied": True,
    }
    unparsable = LocalToolBox("lookup")
    reply = await remote.invoke(with_tools("badjson:lookup", unparsable))
    outcome = json.loads(reply.text.removeprefix("remote:"))
    assert outcome["denied"] is False
    assert outcome["error"].startswith("the arguments are not valid JSON")
    assert unparsable.calls == []  # the tool never ran


async def test_produce_with_tools_returns_structured_output(remote: RemoteAdapter) -> None:
    tools = LocalToolBox("lookup")
    call = AdapterCall(
        prompt='tool:lookup:{"key": "k"}',
        options=CallOptions(),
        output_schema=SCHEMA,
        time_budget=10,
        tools=tools,
    )
    reply = await remote.produce(call)
    assert json.loads(reply.text) == {
        "echo": 'tool:lookup:{"key": "k"}',
        "tool": {"tool": "lookup", "result": {"n": 1}},
    }


async def test_a_remote_that_never_stops_calling_tools_is_cut_off(remote: RemoteAdapter) -> None:
    tools = LocalToolBox("lookup")
    with pytest.raises(errors.AdapterInternal, match=f"more than {MAX_TOOL_CALLS} tool calls"):
        await remote.invoke(with_tools('loop:lookup:{"key": "k"}', tools))
    assert len(tools.calls) == MAX_TOOL_CALLS


async def test_a_stream_ended_without_a_reply_is_an_internal_failure(remote: RemoteAdapter) -> None:
    with pytest.raises(errors.AdapterInternal, match="CallWithTools ended without the invoke reply"):
        await remote.invoke(with_tools("noreply:", LocalToolBox("lookup")))


async def test_a_reply_counts_only_when_the_stream_then_ends_ok(remote: RemoteAdapter) -> None:
    with pytest.raises(errors.AdapterInternal, match="sent more after the invoke reply"):
        await remote.invoke(with_tools("twice:", LocalToolBox("lookup")))
    with pytest.raises(errors.AdapterInternal, match="INTERNAL: failed after replying"):
        await remote.invoke(with_tools("replythenfail:", LocalToolBox("lookup")))


async def test_cancelling_during_a_tool_call_cancels_the_remote_call(
    remote: RemoteAdapter, example: ExampleProcess
) -> None:
    tools = LocalToolBox("lookup", hold=True)
    task = asyncio.create_task(remote.invoke(with_tools('tool:lookup:{"key": "wait"}', tools)))
    await asyncio.wait_for(tools.called.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # (Earlier tests' streams, cut off by the negotiator, left CANCELLED lines of their own.)
    await asyncio.to_thread(example.expect, 'CANCELLED CallWithTools tool:lookup:{"key": "wait"}', 15)


async def test_conversation_state_goes_out_and_comes_back(remote: RemoteAdapter) -> None:
    first = await remote.invoke(AdapterCall(prompt="hi", options=CallOptions(conversation_id="c1")))
    assert first.text == "remote:hi (turn 1)"
    assert first.conversation_state == {"turns": 1, "prompts": ["hi"]}
    second = await remote.invoke(
        AdapterCall(
            prompt="again",
            options=CallOptions(conversation_id="c1"),
            conversation_state=first.conversation_state,
        )
    )
    assert second.text == "remote:again (turn 2)"
    assert second.conversation_state == {"turns": 2, "prompts": ["hi", "again"]}
    outside = await remote.invoke(AdapterCall(prompt="hi", options=CallOptions()))
    assert (outside.text, outside.conversation_state) == ("remote:hi", None)


# --- through a real negotiator -------------------------------------------------------------------


@pytest.fixture
async def registered(negotiator: RunningNegotiator, example: ExampleProcess) -> RemoteAdapter:
    """The example registered in a real negotiator (which closes it on stop)."""
    adapter = await connect_remote(example.address, "echo-remote")
    negotiator.registry.add(RegisteredAdapter(adapter=adapter, source="config"))
    return adapter


async def test_a_remote_model_calls_a_mutating_tool_with_the_callers_approval(
    stub: Stub, registered: RemoteAdapter
) -> None:
    caller = Caller(stub)
    await caller.start(
        pb.InvokeRequest(adapter="echo-remote", prompt='tool:store:{"key": "k1"}'),
        [tool("store", risk=pb.TOOL_RISK_MUTATING)],
    )
    asked = await caller.receive("approval_request")
    assert (asked.tool_name, asked.adapter) == ("store", "echo-remote")
    await caller.decide(asked.call_id, pb.APPROVAL_DECISION_ALLOW)
    run = await caller.receive("tool_call")
    assert json.loads(run.arguments_json) == {"key": "k1"}
    await caller.result(run.call_id, {"stored": True})
    text = await caller.final_text()
    assert json.loads(text.removeprefix("remote:")) == {"tool": "store", "result": {"stored": True}}


async def test_the_tool_filter_hides_tools_from_the_remote_model(
    stub: Stub, registered: RemoteAdapter
) -> None:
    caller = Caller(stub)
    await caller.start(
        pb.InvokeRequest(
            adapter="echo-remote",
            prompt="tools:",
            options=pb.CallOptions(tool_filter=pb.ToolFilter(deny=["secret"])),
        ),
        [tool("lookup"), tool("secret")],
    )
    assert json.loads((await caller.final_text()).removeprefix("remote:")) == ["lookup"]
    # Calling the hidden tool anyway: the model gets an error outcome; the caller never hears of it.
    caller = Caller(stub)
    await caller.start(
        pb.InvokeRequest(
            adapter="echo-remote",
            prompt='tool:secret:{"key": "k"}',
            options=pb.CallOptions(tool_filter=pb.ToolFilter(deny=["secret"])),
        ),
        [tool("lookup"), tool("secret")],
    )
    outcome = json.loads((await caller.final_text()).removeprefix("remote:"))
    assert outcome["tool"] == "secret"
    assert "secret" in outcome["error"]


async def test_a_remote_conversation_commits_its_state_call_by_call(
    stub: Stub, registered: RemoteAdapter
) -> None:
    options = pb.CallOptions(conversation_id="remote-talk")
    first = await stub.Invoke(
        pb.InvokeRequest(adapter="echo-remote", prompt="one", options=options), timeout=10
    )
    assert first.text == "remote:one (turn 1)"
    # A failed call commits nothing: the next call still sees one turn.
    failing = pb.InvokeRequest(adapter="echo-remote", prompt="fail:UNAVAILABLE", options=options)
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await stub.Invoke(failing, timeout=10)
    assert failure.value.code() is grpc.StatusCode.UNAVAILABLE
    second = await stub.Invoke(
        pb.InvokeRequest(adapter="echo-remote", prompt="two", options=options), timeout=10
    )
    assert second.text == "remote:two (turn 2)"


async def test_a_remote_that_fails_during_a_tool_call_is_reported_by_its_status(
    remote: RemoteAdapter,
) -> None:
    # The remote gives up (RESOURCE_EXHAUSTED, retry in 2 s) while the tool still runs: writing the
    # outcome then finds the call finished, and the remote's own status is what the caller gets.
    tools = LocalToolBox("lookup", delay=0.3)
    with pytest.raises(errors.AdapterRateLimited) as limited:
        await remote.invoke(with_tools("toolthenfail:lookup:RESOURCE_EXHAUSTED", tools))
    assert limited.value.retry_after == 2.0
    assert len(tools.calls) == 1


async def test_nan_never_crosses_to_or_from_a_remote(remote: RemoteAdapter) -> None:
    # Python's json writes and reads NaN; no other JSON parser does.
    result = await remote.invoke(
        with_tools(
            'tool:lookup:{"key": "k"}', LocalToolBox("lookup", outcome=ToolOutcome(result=float("nan")))
        )
    )
    outcome = json.loads(result.text.removeprefix("remote:"))
    assert outcome["error"].startswith("the tool's result is not valid JSON")
    tools = LocalToolBox("lookup")
    arguments = await remote.invoke(with_tools("nanargs:lookup", tools))
    outcome = json.loads(arguments.text.removeprefix("remote:"))
    assert "NaN is not a JSON number" in outcome["error"]
    assert tools.calls == []


async def test_with_every_tool_hidden_the_call_goes_without_tools(remote: RemoteAdapter) -> None:
    # A filter may hide every tool the caller brought: CallWithTools promises at least one.
    reply = await remote.invoke(with_tools("tools:", LocalToolBox()))
    assert reply.text == "remote:tools:"  # Invoke's echo, not CallWithTools' list of names


@pytest.mark.slow
def test_a_conversation_state_that_is_not_json_is_an_internal_failure() -> None:
    response = adapter_pb2.InvokeResponse(text="x")
    response.conversation_state.number_value = float("inf")
    with pytest.raises(errors.AdapterInternal, match="conversation_state is not valid JSON"):
        reply_state("far", response)
    assert reply_state("far", adapter_pb2.InvokeResponse(text="x")) is None
