"""Errors that quote a lot still reach a C-core client whole: real `negotiator serve` and `seedstore serve`.

gRPC limits a response's metadata (8 KiB soft, 16 KiB hard in C-core), and
an error's status travels there. Each case below makes a sidecar refuse with
an error that would quote far more than that: Invoke with 500 unknown
settings keys (500 gaps), calls naming a 100 KB adapter or seed identifier.
grpcio's synchronous client (C-core) must get the documented code and
ErrorInfo, with the trailers under the runtime's budget
(`agentsidecar.sidecar_runtime.richstatus.MAX_TRAILER_BYTES`), and `violationsOmitted`
counting what was left out.

Figures: trailer bytes per case and violations kept.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf import struct_pb2

from agentsidecar.negotiator.v1 import negotiator_pb2, negotiator_pb2_grpc
from agentsidecar.seedstore.v1 import seedstore_pb2, seedstore_pb2_grpc
from agentsidecar.sidecar_runtime.richstatus import (
    MAX_METADATA_VALUE_CHARS,
    MAX_TRAILER_BYTES,
    VIOLATIONS_OMITTED,
    DecodedError,
    decode_error,
)
from tests.reliability.rel_support import (
    Figures,
    Sidecar,
    make_short_dir,
    negotiator_error_problem,
    seedstore_error_problem,
    start_negotiator,
    start_seedstore,
)
from tests.runtime.runtime_support import trailer_bytes

GAPS = 500
HUGE = "a" * 100_000
CONFIG = """\
adapters:
  - shortname: framework
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {settings: supported}
      accepted_settings: [temperature]
    options:
      invoke: {echo: true}
"""


@dataclass
class Pair:
    negotiator: negotiator_pb2_grpc.NegotiatorServiceStub
    seedstore: seedstore_pb2_grpc.SeedStoreServiceStub


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    directory = tmp_path_factory.mktemp("trailers")
    (directory / "negotiator.yaml").write_text(CONFIG)
    sockets = make_short_dir("rel-tr-")
    started: list[Sidecar] = []
    try:
        started.append(
            start_negotiator(directory / "negotiator.yaml", sockets / "ng.sock", directory / "negotiator.log")
        )
        started.append(start_seedstore(directory / "home", sockets / "ss.sock", directory / "seedstore.log"))
        with (
            grpc.insecure_channel(started[0].target) as negotiator,
            grpc.insecure_channel(started[1].target) as seedstore,
        ):
            yield Pair(
                negotiator_pb2_grpc.NegotiatorServiceStub(negotiator),
                seedstore_pb2_grpc.SeedStoreServiceStub(seedstore),
            )
        for sidecar in started:
            assert sidecar.alive(), sidecar.log_tail()
    finally:
        for sidecar in started:
            sidecar.stop()
        shutil.rmtree(sockets, ignore_errors=True)


def unknown_settings(count: int) -> struct_pb2.Struct:
    settings = struct_pb2.Struct()
    settings.update({f"unknown_setting_{number:04d}": 1 for number in range(count)})
    return settings


def invoke_with_gaps() -> negotiator_pb2.InvokeRequest:
    options = negotiator_pb2.CallOptions(settings=unknown_settings(GAPS))
    return negotiator_pb2.InvokeRequest(adapter="framework", prompt="hi", options=options)


CASES: dict[str, tuple[str, Callable[[Pair], object]]] = {
    "invoke_500_gaps": ("negotiator", lambda p: p.negotiator.Invoke(invoke_with_gaps(), timeout=10)),
    "invoke_100kb_adapter": (
        "negotiator",
        lambda p: p.negotiator.Invoke(negotiator_pb2.InvokeRequest(adapter=HUGE, prompt="hi"), timeout=10),
    ),
    "get_adapter_100kb": (
        "negotiator",
        lambda p: p.negotiator.GetAdapter(negotiator_pb2.GetAdapterRequest(shortname=HUGE), timeout=10),
    ),
    "inspect_seed_100kb_id": (
        "seedstore",
        lambda p: p.seedstore.InspectSeed(seedstore_pb2.InspectSeedRequest(id=HUGE), timeout=10),
    ),
    "add_seed_100kb_id": (
        "seedstore",
        lambda p: p.seedstore.AddSeed(
            seedstore_pb2.AddSeedRequest(id=HUGE, domain="d", kind="cli", command="x", provides=["p"]),
            timeout=10,
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_oversized_errors_arrive_with_their_code_and_error_info(
    pair: Pair, case: str, figures: Figures
) -> None:
    service, call = CASES[case]
    with pytest.raises(grpc.RpcError) as caught:
        call(pair)
    error: DecodedError = decode_error(caught.value)
    problem = (negotiator_error_problem if service == "negotiator" else seedstore_error_problem)(error)
    assert problem is None, problem
    assert error.code is not grpc.StatusCode.RESOURCE_EXHAUSTED
    size = trailer_bytes(caught.value)
    assert size <= MAX_TRAILER_BYTES
    assert all(len(value) <= MAX_METADATA_VALUE_CHARS for value in error.metadata.values())
    kept = len(error.precondition_violations) + len(error.field_violations)
    if case.endswith("_gaps"):
        assert error.reason == "UNSUPPORTED_CAPABILITY"
        assert kept >= 1
        assert kept + int(error.metadata[VIOLATIONS_OMITTED]) == GAPS
    figures.record(
        "error trailers",
        {f"{case}.trailer_bytes": size, f"{case}.code": error.code.name, f"{case}.violations_kept": kept},
    )


def test_an_oversized_request_is_grpcs_own_resource_exhausted(pair: Pair, figures: Figures) -> None:
    """Over --max-message-bytes (4 MiB): refused by grpc before the sidecar runs, so no ErrorInfo."""
    seed = seedstore_pb2.AddSeedRequest(
        id="big", domain="d", kind="cli", command="x" * (5 << 20), provides=["p"]
    )
    with pytest.raises(grpc.RpcError) as caught:
        pair.seedstore.AddSeed(seed, timeout=30)
    error = decode_error(caught.value)
    assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Received message larger than max" in error.message
    assert (error.reason, error.domain) == ("", "")
    assert pair.seedstore.GetStore(seedstore_pb2.GetStoreRequest(), timeout=10).seed_store
    figures.record("error trailers", {"oversized_request.code": error.code.name})
