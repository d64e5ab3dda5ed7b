"""ListAdapters pages (AIP-158) over a real negotiator, bounded by count and bytes; the CLI walks them."""

from __future__ import annotations

import asyncio
import json
from typing import TypeAlias

import grpc
import pytest
from fakes import make_declaration
from negotiator_testkit import add_fake, call_error

from agentsidecar.clients.aio import AsyncNegotiatorClient
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service.cli import main as cli_main
from agentsidecar.negotiator_service.server import RunningNegotiator
from agentsidecar.negotiator_service.servicer import DEFAULT_PAGE_SIZE, LIST_PAGE_BYTES, MAX_PAGE_SIZE

Stub: TypeAlias = "negotiator_pb2_grpc.NegotiatorServiceAsyncStub"


def add_many(negotiator: RunningNegotiator, count: int) -> list[str]:
    for index in range(count):
        add_fake(negotiator, make_declaration(f"a-fake-{index:04d}"), source="runtime")
    return sorted(entry.shortname for entry in negotiator.registry.list())


async def walk(stub: Stub, page_size: int = 0) -> list[list[str]]:
    pages: list[list[str]] = []
    request = pb.ListAdaptersRequest(page_size=page_size)
    while True:
        response = await stub.ListAdapters(request, timeout=5)
        pages.append([a.declaration.shortname for a in response.adapters])
        if not response.next_page_token:
            return pages
        request = pb.ListAdaptersRequest(page_size=page_size, page_token=response.next_page_token)


async def test_the_default_page_and_every_page_after_it(stub: Stub, negotiator: RunningNegotiator) -> None:
    everyone = add_many(negotiator, 250)
    pages = await walk(stub)
    assert len(pages) == -(-len(everyone) // DEFAULT_PAGE_SIZE)
    assert [len(page) for page in pages[:-1]] == [DEFAULT_PAGE_SIZE] * (len(pages) - 1)
    assert [name for page in pages for name in page] == everyone


async def test_page_size_is_capped_at_the_maximum_and_honoured_below(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    everyone = add_many(negotiator, 20)
    assert [len(page) for page in await walk(stub, page_size=7)][:2] == [7, 7]
    whole = await stub.ListAdapters(pb.ListAdaptersRequest(page_size=MAX_PAGE_SIZE * 10), timeout=5)
    assert len(whole.adapters) == len(everyone)
    assert not whole.next_page_token


async def test_a_page_stops_before_its_byte_bound(stub: Stub, negotiator: RunningNegotiator) -> None:
    # 40 adapters of ~60 KiB each: far more than one page's bytes.
    for index in range(40):
        settings = [f"s{index}-{n:03d}-" + "x" * 590 for n in range(100)]
        add_fake(negotiator, make_declaration(f"wide-{index:02d}", accepted_settings=settings))
    first = await stub.ListAdapters(pb.ListAdaptersRequest(page_size=MAX_PAGE_SIZE), timeout=5)
    assert first.ByteSize() <= LIST_PAGE_BYTES
    assert first.next_page_token
    pages = await walk(stub, page_size=MAX_PAGE_SIZE)
    assert len(pages) > 2
    assert [name for page in pages for name in page] == sorted(
        e.shortname for e in negotiator.registry.list()
    )


async def test_changes_between_pages_never_repeat_or_skip_what_stayed(
    stub: Stub, negotiator: RunningNegotiator
) -> None:
    add_many(negotiator, 30)
    first = await stub.ListAdapters(pb.ListAdaptersRequest(page_size=10), timeout=5)
    seen = [a.declaration.shortname for a in first.adapters]
    negotiator.registry.remove(seen[0])  # removing a listed one shifts nothing after it
    rest = await stub.ListAdapters(
        pb.ListAdaptersRequest(page_size=MAX_PAGE_SIZE, page_token=first.next_page_token), timeout=5
    )
    names = seen + [a.declaration.shortname for a in rest.adapters]
    assert len(names) == len(set(names))
    assert set(names) >= {entry.shortname for entry in negotiator.registry.list()}


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.ListAdaptersRequest(page_size=-1), "page_size"),
        (pb.ListAdaptersRequest(page_token="not a token!"), "page_token"),
        (pb.ListAdaptersRequest(page_token="aGVsbG8="), "page_token"),  # base64, but not ours
    ],
)
async def test_bad_paging_fields_are_invalid(
    stub: Stub, request_: pb.ListAdaptersRequest, field: str
) -> None:
    error = await call_error(stub.ListAdapters(request_, timeout=5))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in error.field_violations] == [field]


@pytest.mark.slow
async def test_the_clients_and_the_cli_walk_every_page(
    negotiator: RunningNegotiator, capsys: pytest.CaptureFixture[str]
) -> None:
    everyone = add_many(negotiator, 230)
    async with AsyncNegotiatorClient(negotiator.bound[0]) as client:
        assert [a.declaration.shortname for a in await client.list_adapters()] == everyone
    capsys.readouterr()
    code = await asyncio.to_thread(cli_main, ["--server", negotiator.bound[0], "adapters"])
    listed = json.loads(capsys.readouterr().out)["adapters"]
    assert code == 0
    assert [adapter["shortname"] for adapter in listed] == everyone
