"""The status table: a canonical code and an ErrorInfo for each seedstore error; the rest is INTERNAL."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore.v1 import seedstore_pb2_grpc
from agentsidecar.seedstore_service import errors
from agentsidecar.seedstore_service.error_status import STATUS_TABLE, Code, request_field
from agentsidecar.seedstore_service.operations import (
    ChangeFeed,
    SeedListing,
    SeedOperations,
    VerifyPlan,
    VerifyRequest,
)
from agentsidecar.seedstore_service.servicer import SeedStoreServicer
from agentsidecar.seedstore_service.status import ERROR_DOMAIN, to_rich_error
from agentsidecar.seedstore_service.store import SeedStore
from agentsidecar.sidecar_runtime.richstatus import decode_error
from agentsidecar.sidecar_runtime.server import ServerOptions, start_server

LOWER_CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$")


def all_subclasses(cls: type[errors.SeedStoreError]) -> Iterator[type[errors.SeedStoreError]]:
    for subclass in cls.__subclasses__():
        yield subclass
        yield from all_subclasses(subclass)


def concrete_errors() -> set[type[errors.SeedStoreError]]:
    return {cls for cls in all_subclasses(errors.SeedStoreError) if not cls.abstract}


# The one concrete class refined by another: InvalidIdentifier is an InvalidArgument that names
# the identifier rule, and callers catching InvalidArgument catch both.
REFINED = {errors.InvalidArgument}


def test_every_error_class_is_in_the_table() -> None:
    """Every concrete class reaches a row, every other base is abstract, every row is a class of the tree."""
    classes = concrete_errors()
    assert classes >= {errors.InvalidIdentifier, errors.SeedMalformed, errors.StoreUnavailable}
    assert [c.__name__ for c in classes if not any(k in STATUS_TABLE for k in c.__mro__)] == []
    tree: set[type[errors.SeedStoreError]] = {errors.SeedStoreError, *all_subclasses(errors.SeedStoreError)}
    assert {c for c in tree if c.__subclasses__() and not c.abstract} == REFINED
    assert set(STATUS_TABLE) <= tree
    assert {c.__name__ for c in tree if c.abstract} == {"SeedStoreError", "CallerError", "StoreError"}


def test_the_table_names_grpc_codes_by_their_names_and_numbers() -> None:
    """error_status.py names codes without importing grpc: each is grpc's code of that name."""
    assert [(code.name, code.value) for code in Code] == [
        (code.name, grpc.StatusCode[code.name].value[0]) for code in Code
    ]


@pytest.mark.parametrize("base", [errors.SeedStoreError, errors.CallerError, errors.StoreError])
def test_a_base_cannot_be_raised(base: type[errors.SeedStoreError]) -> None:
    with pytest.raises(TypeError, match=f"{base.__name__} is abstract"):
        raise base("boom")


EXAMPLES: list[tuple[errors.SeedStoreError, grpc.StatusCode]] = [
    (errors.InvalidIdentifier("Bad", "capability id"), grpc.StatusCode.INVALID_ARGUMENT),
    (
        errors.InvalidArgument("priority must be between 0 and 100", "priority"),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    (errors.SeedNotFound("say"), grpc.StatusCode.NOT_FOUND),
    (
        errors.AmbiguousSeed("say", ["/s/voice/say.yml", "/s/audio/say.yml"]),
        grpc.StatusCode.FAILED_PRECONDITION,
    ),
    (errors.SeedMalformed("/s/voice/say.yml", 3, 'unknown field "x"'), grpc.StatusCode.FAILED_PRECONDITION),
    (errors.RevisionMismatch("say", "aaaa", "bbbb"), grpc.StatusCode.ABORTED),
    (errors.OutsideStore("/s/voice", "/s"), grpc.StatusCode.FAILED_PRECONDITION),
    (errors.WatchBacklogExceeded(9_000_000, 8_388_608), grpc.StatusCode.ABORTED),
    (errors.StoreUnavailable("HOME is not set; set SKILLSPEC_HOME or HOME"), grpc.StatusCode.UNAVAILABLE),
]


def test_examples_cover_every_class() -> None:
    assert {type(error) for error, _ in EXAMPLES} == concrete_errors()


@pytest.mark.parametrize(("error", "code"), EXAMPLES, ids=lambda value: type(value).__name__)
def test_each_error_maps_to_its_code_with_error_info(
    error: errors.SeedStoreError, code: grpc.StatusCode
) -> None:
    rich = to_rich_error(error)
    assert rich.code == code
    assert rich.message == error.message
    assert rich.reason == error.reason
    assert rich.domain == ERROR_DOMAIN
    assert all(LOWER_CAMEL.match(key) for key in rich.metadata)
    status = status_pb2.Status()
    status.ParseFromString(dict(rich.to_status().trailing_metadata)["grpc-status-details-bin"])
    infos = [detail for detail in status.details if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    assert len(infos) == 1


def test_detail_payloads() -> None:
    bad = to_rich_error(errors.InvalidIdentifier("Bad", "capability id"), {"capability id": "ids"})
    assert bad.field_violations == (("ids", 'invalid identifier "Bad" in capability id'),)
    assert bad.metadata == {"field": "ids", "value": "Bad"}

    ambiguous = to_rich_error(errors.AmbiguousSeed("say", ["/a.yml", "/b.yml"]))
    assert [violation.subject for violation in ambiguous.precondition_violations] == ["/a.yml", "/b.yml"]
    assert all(violation.type == "SEED_AMBIGUOUS" for violation in ambiguous.precondition_violations)

    malformed = to_rich_error(errors.SeedMalformed("/s/x.yml", 7, "bad"))
    (violation,) = malformed.precondition_violations
    assert (violation.subject, violation.description) == ("/s/x.yml", "line 7: bad")
    assert malformed.metadata == {"path": "/s/x.yml", "line": "7", "detail": "bad"}

    stale = to_rich_error(errors.RevisionMismatch("say", "aaaa", "bbbb"))
    assert stale.metadata == {"seedId": "say", "expected": "aaaa", "actual": "bbbb"}


@pytest.mark.parametrize(
    ("label", "field"),
    [
        ("capability id", "id"),
        ("domain", "domain"),
        ("preferred seed", "preferred_seed"),
        ("for", "for_capability"),
        ("tie key", "ties"),
        ("add-provides", "add_provides"),
        ("remove-preferred-for", "remove_preferred_for"),
        ("remove-tie", "remove_ties"),
        ("check_timeout", "check_timeout"),
    ],
)
def test_core_labels_become_request_fields(label: str, field: str) -> None:
    assert request_field(label) == field


def test_anything_else_is_internal_never_unknown() -> None:
    rich = to_rich_error(KeyError("boom"))
    assert rich.code == grpc.StatusCode.INTERNAL
    assert rich.reason == "INTERNAL"
    assert rich.domain == ERROR_DOMAIN


class ExplodingOperations(SeedOperations):
    """Operations with a bug, to see what a client gets."""

    def list_seeds(self, domain: str | None) -> SeedListing:
        raise RuntimeError("list exploded")

    def plan_verify(self, request: VerifyRequest, *, may_refresh: bool = True) -> VerifyPlan:
        raise ZeroDivisionError("verify exploded")


async def test_a_bug_reaches_the_client_as_internal_with_error_info(tmp_path: Path, socket_dir: Path) -> None:
    operations = ExplodingOperations(SeedStore(tmp_path / "capabilities"))
    servicer = SeedStoreServicer(
        operations, ChangeFeed(asyncio.get_running_loop()), check_timeout=10, verify_concurrency=4
    )
    running = await start_server(
        lambda server: seedstore_pb2_grpc.add_SeedStoreServiceServicer_to_server(servicer, server),
        ("agentsidecar.seedstore.v1.SeedStoreService",),
        ServerOptions(listen=(f"unix:{socket_dir / 'bug.sock'}",), grace_seconds=0),
    )
    try:
        async with grpc.aio.insecure_channel(running.bound[0]) as channel:
            stub = seedstore_pb2_grpc.SeedStoreServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as unary:
                await stub.ListSeeds(pb.ListSeedsRequest())
            with pytest.raises(grpc.aio.AioRpcError) as stream:
                async for _ in stub.VerifySeeds(pb.VerifySeedsRequest(ids=["x"])):
                    pass
            # Known errors keep their mapping on the same server.
            with pytest.raises(grpc.aio.AioRpcError) as known:
                await stub.InspectSeed(pb.InspectSeedRequest(id="nope"))
    finally:
        await running.stop()
    for raised, text in (
        (unary, "RuntimeError: list exploded"),
        (stream, "ZeroDivisionError: verify exploded"),
    ):
        decoded = decode_error(raised.value)
        assert decoded.code == grpc.StatusCode.INTERNAL
        assert decoded.reason == "INTERNAL"
        assert decoded.domain == ERROR_DOMAIN
        assert text in decoded.message
    assert decode_error(known.value).code == grpc.StatusCode.NOT_FOUND
