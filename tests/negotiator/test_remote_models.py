"""A remote adapter process that declares per model: its entries, effort levels and default model are read."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.server import RunningNegotiator
from tests.procs import start_process, stop_process

VERSIONED_REMOTE = Path(__file__).with_name("versioned_remote.py")


@pytest.fixture
def remote_target(socket_dir: Path) -> Iterator[str]:
    target = f"unix:{socket_dir / 'per-model.sock'}"
    argv = [sys.executable, str(VERSIONED_REMOTE), "--listen", target, "--shortname", "per-model"]
    process, _ = start_process([*argv, "--model-effort", "thinker:low,high", "--default-model", "thinker"])
    try:
        yield target
    finally:
        stop_process(process)


@pytest.fixture
async def stub(
    negotiator: RunningNegotiator,
) -> AsyncIterator[negotiator_pb2_grpc.NegotiatorServiceAsyncStub]:
    async with grpc.aio.insecure_channel(negotiator.bound[0]) as channel:
        yield negotiator_pb2_grpc.NegotiatorServiceStub(channel)


async def decision(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, effort: str, model: str | None = None
) -> pb.Decision:
    options = pb.CallOptions(effort=effort) if model is None else pb.CallOptions(effort=effort, model=model)
    call = pb.InvokeRequest(adapter="per-model", prompt="p", options=options)
    return (await stub.Negotiate(pb.NegotiateRequest(invoke=call), timeout=5)).decision


@pytest.mark.slow
async def test_a_remote_adapters_per_model_declaration_judges_calls_to_that_model(
    stub: negotiator_pb2_grpc.NegotiatorServiceAsyncStub, remote_target: str
) -> None:
    registered = await stub.RegisterAdapter(pb.RegisterAdapterRequest(target=remote_target), timeout=10)
    declaration = registered.adapter.declaration
    assert declaration.default_model == "thinker"
    [entry] = declaration.models
    assert (entry.model, list(entry.effort_levels)) == ("thinker", ["high", "low"])
    states = {c.capability: c.state for c in entry.capabilities}
    assert states[common_pb2.CAPABILITY_EFFORT] == common_pb2.CAPABILITY_STATE_SUPPORTED

    # No model named: the default model's entry judges, and takes effort at its levels only.
    assert (await decision(stub, "low")).accepted
    assert (await decision(stub, "low")).model == "thinker"
    assert not (await decision(stub, "medium")).accepted
    # Another model: the adapter-level declaration, which does not support effort.
    other = await decision(stub, "low", model="plain")
    gaps = {(g.requirement.request_field, g.state) for g in other.gaps}
    assert ("options.effort", common_pb2.CAPABILITY_STATE_UNSUPPORTED) in gaps
    response = await stub.Invoke(
        pb.InvokeRequest(adapter="per-model", prompt="hi", options=pb.CallOptions(effort="high")), timeout=10
    )
    assert response.text == "v1:hi"
    assert response.decision.model == "thinker"
