"""The broker's per-call path: the checks it skips for a warm call are the ones that cannot refuse it."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import grpc
import pytest
from fakes import FakeAdapter, make_declaration
from negotiator_testkit import call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.broker import Broker
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterReply,
    CallKind,
    CallOptions,
    CallRequest,
    Capability,
    MaxDepth,
)
from agentsidecar.negotiator_service.registry import AdapterRegistry, RegisteredAdapter

DECLARATION = make_declaration("fake", supported=list(Capability), accepted_settings=["seed"])


def broker_with(adapter: FakeAdapter, **settings: Any) -> Broker:
    registry = AdapterRegistry()
    registry.add(RegisteredAdapter(adapter=adapter, source="config"))
    return Broker(registry, **settings)


def invoke(**options: Any) -> CallRequest:
    return CallRequest(kind=CallKind.INVOKE, prompt="hi", adapter="fake", options=CallOptions(**options))


async def test_a_top_level_call_is_held_to_a_negative_negotiator_limit() -> None:
    adapter = FakeAdapter(DECLARATION)
    broker = broker_with(adapter, max_depth=-1)
    with pytest.raises(errors.DelegationDepthExceeded) as raised:
        await broker.call(invoke(), time_budget=None)
    assert (raised.value.attempted, raised.value.max_depth) == (0, -1)
    assert adapter.call_count == 0


@pytest.mark.parametrize(("depth", "allowed"), [(0, True), (1, False)])
async def test_a_call_limit_of_zero_admits_only_the_top_level(depth: int, allowed: bool) -> None:
    adapter = FakeAdapter(DECLARATION)
    broker = broker_with(adapter, max_depth=3)
    call = invoke(max_depth=MaxDepth(depth=0))
    if allowed:
        await broker.call(call, time_budget=None, delegation_depth=depth)
        assert adapter.call_count == 1
    else:
        with pytest.raises(errors.DelegationDepthExceeded):
            await broker.call(call, time_budget=None, delegation_depth=depth)
        assert adapter.call_count == 0


async def test_a_deeper_call_meets_the_negotiator_limit() -> None:
    adapter = FakeAdapter(DECLARATION)
    broker = broker_with(adapter, max_depth=1)
    await broker.call(invoke(), time_budget=None, delegation_depth=1)
    with pytest.raises(errors.DelegationDepthExceeded):
        await broker.call(invoke(), time_budget=None, delegation_depth=2)
    assert adapter.call_count == 1


@pytest.mark.parametrize("cls", [CallRequest, AdapterCall, AdapterReply])
def test_the_per_call_value_types_keep_their_dataclass_init(cls: type) -> None:
    """Every field stored as given, defaults and default factories as declared, still frozen."""
    fields = dataclasses.fields(cls)
    required = [
        f for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    given = {f.name: object() for f in required}
    made = cls(**given)
    for item in fields:
        expected: Any
        if item.name in given:
            expected = given[item.name]
        elif item.default is not dataclasses.MISSING:
            expected = item.default
        else:
            expected = item.default_factory()  # type: ignore[operator]
        assert getattr(made, item.name) == expected, item.name
    every = {f.name: object() for f in fields}
    assert [getattr(cls(**every), f.name) for f in fields] == list(every.values())
    assert [getattr(cls(*every.values()), f.name) for f in fields] == list(every.values())
    assert dataclasses.replace(made, **{required[0].name: "changed"}) == cls(
        **{**given, required[0].name: "changed"}
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, required[0].name, "changed")
    with pytest.raises(TypeError):
        cls()


def test_a_default_factory_makes_a_value_per_call() -> None:
    first, second = (
        CallRequest(kind=CallKind.INVOKE, prompt="a"),
        CallRequest(kind=CallKind.INVOKE, prompt="b"),
    )
    assert first.options == CallOptions()
    assert first.options is not second.options


class Behaving:
    """An adapter whose invoke runs `behaviour` (the deadline tests' adapter)."""

    implementation = "behaving"

    def __init__(self, behaviour: Any) -> None:
        self.declaration = DECLARATION
        self._behaviour = behaviour

    async def invoke(self, call: AdapterCall) -> AdapterReply:
        return await self._behaviour()  # type: ignore[no-any-return]

    async def produce(self, call: AdapterCall) -> AdapterReply:
        raise AssertionError("not called here")

    async def close(self) -> None:
        return None


async def run_behaving(behaviour: Any, budget: float | None = 0.05) -> AdapterReply:
    registry = AdapterRegistry()
    registry.add(RegisteredAdapter(adapter=Behaving(behaviour), source="config"))
    reply, _ = await Broker(registry).call(invoke(), time_budget=budget)
    return reply


async def test_a_reply_within_the_budget_leaves_no_timer_behind() -> None:
    async def quick() -> AdapterReply:
        return AdapterReply(text="ok")

    assert (await run_behaving(quick)).text == "ok"
    await asyncio.sleep(0.1)  # past the budget: a timer left armed would cancel this task now
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_a_timeout_error_of_the_adapters_own_is_an_adapter_failure() -> None:
    async def own_timeout() -> AdapterReply:
        raise TimeoutError("upstream read timed out")

    with pytest.raises(errors.AdapterInternal, match="TimeoutError: upstream read timed out"):
        await run_behaving(own_timeout, budget=5.0)
    with pytest.raises(errors.AdapterInternal, match="TimeoutError: upstream read timed out"):
        await run_behaving(own_timeout, budget=None)


@pytest.mark.parametrize(
    ("turned_into", "expected"),
    [
        (TimeoutError("gave up"), errors.AdapterTimeout),
        (errors.AdapterUnavailable("fake", "went away"), errors.AdapterUnavailable),
        (ValueError("broken"), errors.AdapterInternal),
    ],
)
async def test_a_cancellation_the_adapter_turns_into_an_error_after_the_deadline(
    turned_into: Exception, expected: type[Exception]
) -> None:
    async def converting() -> AdapterReply:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise turned_into from None
        raise AssertionError("not reached")

    with pytest.raises(expected):
        await run_behaving(converting)
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0  # the deadline's own cancel was taken back
    await asyncio.sleep(0)  # and nothing is left pending on this task


async def test_the_deadline_is_a_timeout_and_takes_its_cancel_back() -> None:
    async def slow() -> AdapterReply:
        await asyncio.sleep(10)
        raise AssertionError("not reached")

    with pytest.raises(errors.AdapterTimeout, match=r"deadline of 0\.05s exceeded"):
        await run_behaving(slow)
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_a_callers_cancel_is_not_a_timeout() -> None:
    started = asyncio.Event()

    async def slow() -> AdapterReply:
        started.set()
        await asyncio.sleep(10)
        raise AssertionError("not reached")

    call = asyncio.ensure_future(run_behaving(slow, budget=5.0))
    await started.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


async def test_a_caller_cancel_on_top_of_the_deadline_stays_a_cancel() -> None:
    async def stubborn() -> AdapterReply:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # a second cancel, as a caller going away at the same moment would
            await asyncio.sleep(0)
        raise AssertionError("not reached")

    with pytest.raises(asyncio.CancelledError):
        await asyncio.ensure_future(run_behaving(stubborn))


async def test_negotiate_points_its_field_violations_at_the_nested_call(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub,
) -> None:
    missing = await call_error(stub.Negotiate(pb.NegotiateRequest(), timeout=5))
    assert missing.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in missing.field_violations] == ["call"]
    bad = pb.InvokeRequest(adapter="scripted-fw", prompt="p", options=pb.CallOptions(effort=""))
    nested = await call_error(stub.Negotiate(pb.NegotiateRequest(invoke=bad), timeout=5))
    assert nested.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in nested.field_violations] == ["invoke.options.effort"]
    direct = await call_error(stub.Invoke(bad, timeout=5))
    assert [f for f, _ in direct.field_violations] == ["options.effort"]
