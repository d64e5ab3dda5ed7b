"""The broker's per-call path: the checks it skips for a warm call are the ones that cannot refuse it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from fakes import FakeAdapter, make_declaration

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
