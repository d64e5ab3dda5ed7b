"""Delegation depth: the limit every call meets before dispatch, over a real negotiator.

A call at depth d (metadata `x-delegation-depth`, 0 at the top) passes iff
d <= min(config `limits.max_depth` (default 3), the call's numeric
`options.max_depth`). The round trip through tests/negotiator/remote_double.py shows
a call coming back through a negotiator arrives one deeper.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TypeAlias

import grpc
import pytest
from fakes import make_declaration
from negotiator_testkit import EVERYTHING, REMOTE_ADAPTER, TEST_CONFIG, add_fake, call_error

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.depth import (
    DEFAULT_MAX_DEPTH,
    NEGOTIATOR_LIMIT,
    REQUEST_LIMIT,
    check_depth,
)
from agentsidecar.negotiator_service.errors import DelegationDepthExceeded
from agentsidecar.negotiator_service.model import CallOptions, Capability, MaxDepth
from agentsidecar.negotiator_service.server import RunningNegotiator, Settings, create_server
from tests.procs import start_process, stop_process

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"
DEPTH_KEY = "x-delegation-depth"


def at_depth(depth: int) -> tuple[tuple[str, str], ...]:
    return ((DEPTH_KEY, str(depth)),)


def invoke(max_depth: pb.MaxDepth | None = None, prompt: str = "p") -> pb.InvokeRequest:
    options = pb.CallOptions(max_depth=max_depth) if max_depth is not None else pb.CallOptions()
    return pb.InvokeRequest(adapter="fake", prompt=prompt, options=options)


# --- the rule, pure -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("depth", "max_depth", "negotiator_max", "refused_by"),
    [
        (0, None, 3, None),
        (3, None, 3, None),
        (4, None, 3, (3, NEGOTIATOR_LIMIT)),
        (0, MaxDepth(depth=0), 3, None),
        (1, MaxDepth(depth=0), 3, (0, REQUEST_LIMIT)),
        (2, MaxDepth(depth=1), 3, (1, REQUEST_LIMIT)),
        (3, MaxDepth(depth=3), 3, None),
        (4, MaxDepth(depth=5), 3, (3, NEGOTIATOR_LIMIT)),  # a caller narrows, never widens
        (3, MaxDepth(provider_managed=True), 3, None),
        (4, MaxDepth(provider_managed=True), 3, (3, NEGOTIATOR_LIMIT)),
        (1, None, 0, (0, NEGOTIATOR_LIMIT)),
        (0, None, 0, None),
    ],
)
def test_a_call_passes_iff_its_depth_is_within_the_smaller_limit(
    depth: int, max_depth: MaxDepth | None, negotiator_max: int, refused_by: tuple[int, str] | None
) -> None:
    options = CallOptions(max_depth=max_depth)
    if refused_by is None:
        check_depth(depth, options, negotiator_max)
        return
    with pytest.raises(DelegationDepthExceeded) as raised:
        check_depth(depth, options, negotiator_max)
    assert (raised.value.attempted, raised.value.max_depth, raised.value.limit) == (depth, *refused_by)


def test_the_default_limit_is_three() -> None:
    assert DEFAULT_MAX_DEPTH == 3


# --- over the service ---------------------------------------------------------------


async def test_depth_two_with_max_depth_one_is_refused_before_dispatch(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator)
    error = await call_error(stub.Invoke(invoke(pb.MaxDepth(depth=1)), metadata=at_depth(2), timeout=5))
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "DELEGATION_DEPTH_EXCEEDED")
    assert error.metadata == {"attemptedDepth": "2", "maxDepth": "1", "limit": "options.max_depth.depth"}
    [violation] = error.precondition_violations
    assert (violation.type, violation.subject) == ("DELEGATION_DEPTH_EXCEEDED", "options.max_depth.depth")
    assert fake.call_count == 0


async def test_max_depth_zero_allows_only_the_top_level_call(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator)
    await stub.Invoke(invoke(pb.MaxDepth(depth=0)), timeout=5)
    assert [call.options.max_depth for _, call in fake.calls] == [MaxDepth(depth=0)]
    for depth in (1, 2):
        error = await call_error(
            stub.Invoke(invoke(pb.MaxDepth(depth=0)), metadata=at_depth(depth), timeout=5)
        )
        assert (error.reason, error.metadata["maxDepth"]) == ("DELEGATION_DEPTH_EXCEEDED", "0")
    assert fake.call_count == 1


async def test_without_max_depth_the_default_of_three_applies(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator)
    await stub.Invoke(invoke(), metadata=at_depth(3), timeout=5)
    assert [call.delegation_depth for _, call in fake.calls] == [3]
    error = await call_error(stub.Invoke(invoke(), metadata=at_depth(4), timeout=5))
    assert error.reason == "DELEGATION_DEPTH_EXCEEDED"
    assert error.metadata == {"attemptedDepth": "4", "maxDepth": "3", "limit": "limits.max_depth"}
    # A request may narrow the negotiator's limit but not widen it.
    error = await call_error(stub.Invoke(invoke(pb.MaxDepth(depth=9)), metadata=at_depth(4), timeout=5))
    assert error.metadata["limit"] == "limits.max_depth"
    assert fake.call_count == 1


async def test_depth_is_checked_before_the_capability_verdict(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    # The harness does not declare depth_limit: at depth 4 the depth refusal comes first.
    request = pb.InvokeRequest(agent="scripted-harness", prompt="p", options=pb.CallOptions(persona="x"))
    error = await call_error(stub.Invoke(request, metadata=at_depth(4), timeout=5))
    assert error.reason == "DELEGATION_DEPTH_EXCEEDED"
    error = await call_error(stub.Invoke(request, metadata=at_depth(1), timeout=5))
    assert error.reason == "UNSUPPORTED_CAPABILITY"


async def test_provider_managed_needs_depth_limit_and_still_meets_the_negotiator_limit(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    managed = pb.MaxDepth(provider_managed=True)
    no_limit = add_fake(
        negotiator,
        make_declaration("fake", supported=[Capability.SUBAGENTS], unsupported=[Capability.DEPTH_LIMIT]),
        source="runtime",
    )
    error = await call_error(stub.Invoke(invoke(managed), timeout=5))
    assert (error.reason, error.metadata["gaps"]) == ("UNSUPPORTED_CAPABILITY", "depth_limit")
    assert no_limit.call_count == 0

    negotiator.registry.remove("fake")
    enforcing = add_fake(
        negotiator, make_declaration("fake", supported=[Capability.SUBAGENTS, Capability.DEPTH_LIMIT])
    )
    await stub.Invoke(invoke(managed), metadata=at_depth(3), timeout=5)
    assert enforcing.calls[0][1].options.max_depth == MaxDepth(provider_managed=True)
    error = await call_error(stub.Invoke(invoke(managed), metadata=at_depth(4), timeout=5))
    assert error.metadata["limit"] == "limits.max_depth"
    assert enforcing.call_count == 1


# --- a configured limit, and the round trip through a remote adapter ---------------------


@pytest.fixture
async def shallow(socket_dir: Path, tmp_path: Path) -> AsyncIterator[RunningNegotiator]:
    """A negotiator whose config sets `limits: {max_depth: 1}`."""
    config = tmp_path / "shallow.yaml"
    config.write_text(TEST_CONFIG + "limits:\n  max_depth: 1\n")
    running = await create_server(
        Settings(listen=(f"unix:{socket_dir / 'shallow.sock'}",), config_path=config, grace_seconds=1.0)
    )
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def shallow_stub(shallow: RunningNegotiator) -> AsyncIterator[Stub]:
    async with grpc.aio.insecure_channel(shallow.bound[0]) as channel:
        yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)


async def test_the_config_limit_applies_to_every_call(shallow: RunningNegotiator, shallow_stub: Stub) -> None:
    fake = add_fake(shallow, EVERYTHING)
    await shallow_stub.Invoke(invoke(), metadata=at_depth(1), timeout=5)
    error = await call_error(shallow_stub.Invoke(invoke(), metadata=at_depth(2), timeout=5))
    assert error.metadata == {"attemptedDepth": "2", "maxDepth": "1", "limit": "limits.max_depth"}
    assert fake.call_count == 1


@pytest.fixture
def delegating_adapter(socket_dir: Path) -> Iterator[str]:
    """tests/negotiator/remote_double.py as a process; its `delegate:` prompts call a negotiator back."""
    target = f"unix:{socket_dir / 'delegating.sock'}"
    process, _ = start_process(
        [
            sys.executable,
            str(REMOTE_ADAPTER),
            "--listen",
            target,
            "--shortname",
            "hop",
        ]
    )
    try:
        yield target
    finally:
        stop_process(process)


@pytest.mark.slow
async def test_a_call_through_a_remote_adapter_arrives_one_deeper(
    shallow: RunningNegotiator, shallow_stub: Stub, delegating_adapter: str
) -> None:
    await shallow_stub.RegisterAdapter(pb.RegisterAdapterRequest(target=delegating_adapter), timeout=10)
    fake = add_fake(shallow, EVERYTHING)
    back = shallow.bound[0]

    # Depth 0 here: the remote adapter receives 0 and calls back at 1, within the limit of 1.
    reply = await shallow_stub.Invoke(
        pb.InvokeRequest(adapter="hop", prompt=f"delegate:{back}:fake:hello"), timeout=10
    )
    assert reply.text == "remote:hello"
    assert [call.delegation_depth for _, call in fake.calls] == [1]

    # Depth 1 here: the call back arrives at 2 and is refused there, before the fake runs.
    error = await call_error(
        shallow_stub.Invoke(
            pb.InvokeRequest(adapter="hop", prompt=f"delegate:{back}:fake:again"),
            metadata=at_depth(1),
            timeout=10,
        )
    )
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "ADAPTER_REFUSED")
    assert "delegation depth 2 exceeds the maximum depth 1" in error.metadata["cause"]
    assert fake.call_count == 1
