"""A typed, synchronous client for the seedstore service (the asyncio twin is in `agentsidecar.clients.aio`).

    with SeedStoreClient("unix:run/seedstore.sock") as seeds:
        found = seeds.search_seeds(capability="voice_message", broaden=True)
        for event in seeds.verify("say-hello"):
            print(event)

One method per RPC, named after it. Each takes the request's fields as
keyword arguments (the proto's own field names, Python values) or,
positionally, a request proto; it returns the response proto. Server streams
are generators: `verify_seeds`/`watch_seeds` yield the responses,
`verify(...)` yields just the typed event (CheckStarted, CheckFinished or
SeedVerified) and `watch(...)` the changes. Leaving the loop early, or
closing the generator, cancels the call (and with it the running checks).
A failed call, also mid-stream, raises the `agentsidecar.clients.errors` tree.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from functools import cached_property
from typing import Any, TypeAlias, TypedDict, TypeVar, Unpack

from google.protobuf import duration_pb2

from agentsidecar.clients.channel import CLIENT_TIMEOUT, SyncClient, Timeout
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore.v1 import seedstore_pb2_grpc

_Request = TypeVar("_Request")

VerifyEvent: TypeAlias = pb.CheckStarted | pb.CheckFinished | pb.SeedVerified
"""One verification event: a check began, a check ended, or a seed's verdict was written."""


class AddSeedFields(TypedDict, total=False):
    id: str
    domain: str
    kind: str
    command: str | None
    adapter: str | None
    script: str | None
    provides: Sequence[str]
    aliases: Sequence[str]
    preferred_for: Sequence[str]
    avoid_for: Sequence[str]
    ties: Sequence[str]  # "KEY=VALUE"
    auth_env: Sequence[str]
    priority: int | None  # 0-100
    external_service: bool
    may_cost_money: bool
    evidence_commands: Sequence[str]
    suggested_skill_id: str | None


class UpdateSeedFields(TypedDict, total=False):
    id: str
    domain: str | None
    expected_revision: str | None  # the update fails with RevisionConflictError unless it matches
    kind: str | None
    command: str | None
    clear_command: bool
    adapter: str | None
    clear_adapter: bool
    script: str | None
    clear_script: bool
    add_provides: Sequence[str]
    remove_provides: Sequence[str]
    add_aliases: Sequence[str]
    remove_aliases: Sequence[str]
    priority: int | None
    clear_priority: bool
    add_preferred_for: Sequence[str]
    remove_preferred_for: Sequence[str]
    add_avoid_for: Sequence[str]
    remove_avoid_for: Sequence[str]
    add_ties: Sequence[str]
    remove_ties: Sequence[str]
    add_auth_env: Sequence[str]
    remove_auth_env: Sequence[str]
    external_service: bool | None
    may_cost_money: bool | None
    add_evidence_commands: Sequence[str]
    remove_evidence_commands: Sequence[str]
    suggested_skill_id: str | None
    clear_suggested_skill_id: bool
    mark: pb.VerificationMark.ValueType


class ListSeedsFields(TypedDict, total=False):
    domain: str | None
    page_size: int  # 0: the server's default (1000); at most 10000
    page_token: str  # next_page_token of the previous page


def merge_pages(pages: Sequence[pb.ListSeedsResponse]) -> pb.ListSeedsResponse:
    """One reply holding every page's seeds and problems, in order; `next_page_token` empty."""
    merged = pb.ListSeedsResponse()
    if pages:
        merged.seed_store = pages[0].seed_store
        if pages[0].HasField("domain"):
            merged.domain = pages[0].domain
    for page in pages:
        merged.seeds.extend(page.seeds)
        merged.problems.extend(page.problems)
    return merged


class SearchSeedsFields(TypedDict, total=False):
    capability: str
    domain: str | None
    local_only: bool
    preferred_seed: str | None
    broaden: bool
    max_candidates: int  # 0: the server's maximum (1000)


class SeedRefFields(TypedDict, total=False):
    """Which seed: InspectSeed and RemoveSeed."""

    id: str
    domain: str | None


class PreferSeedFields(TypedDict, total=False):
    id: str
    domain: str | None
    for_capability: str
    priority: int | None


class VerifySeedsFields(TypedDict, total=False):
    ids: Sequence[str]
    domain: str | None
    all_in_domain: bool
    check_timeout: float | duration_pb2.Duration | None  # seconds
    concurrency: int


class WatchSeedsFields(TypedDict, total=False):
    domain: str | None


def build(message: Callable[..., _Request], request: _Request | None, fields: Mapping[str, Any]) -> _Request:
    """`request` itself, or a new message from keyword `fields`; never both."""
    if request is None:
        return message(**fields)
    if fields:
        raise TypeError("pass a request proto or keyword fields, not both")
    return request


def seconds(value: float | duration_pb2.Duration | None) -> duration_pb2.Duration | None:
    if value is None or isinstance(value, duration_pb2.Duration):
        return value
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(round(value * 1e9))
    return duration


def verify_request(request: pb.VerifySeedsRequest | None, fields: VerifySeedsFields) -> pb.VerifySeedsRequest:
    if request is not None:
        return build(pb.VerifySeedsRequest, request, fields)
    return pb.VerifySeedsRequest(
        ids=fields.get("ids", ()),
        domain=fields.get("domain"),
        all_in_domain=fields.get("all_in_domain", False),
        check_timeout=seconds(fields.get("check_timeout")),
        concurrency=fields.get("concurrency", 0),
    )


def verify_event(response: pb.VerifySeedsResponse) -> VerifyEvent | None:
    """The event a response carries; None for an event kind newer than this client."""
    kind = response.WhichOneof("event")
    if kind == "check_started":
        return response.check_started
    if kind == "check_finished":
        return response.check_finished
    if kind == "seed_verified":
        return response.seed_verified
    return None


class SeedStoreClient(SyncClient):
    """`SeedStoreClient("unix:run/seedstore.sock")`, `SeedStoreClient("127.0.0.1:50061")`,
    or `SeedStoreClient(channel=existing_channel)`.

    The arguments (timeout, token, TLS, retry) are `agentsidecar.clients.channel.ChannelClient`'s.
    """

    @cached_property
    def _stub(self) -> seedstore_pb2_grpc.SeedStoreServiceStub:
        return seedstore_pb2_grpc.SeedStoreServiceStub(self.channel)

    # -- unary calls -----------------------------------------------------

    def get_store(self, *, timeout: Timeout = CLIENT_TIMEOUT) -> pb.GetStoreResponse:
        return self._call(self._stub.GetStore, pb.GetStoreRequest(), timeout)

    def add_seed(
        self,
        request: pb.AddSeedRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[AddSeedFields],
    ) -> pb.AddSeedResponse:
        """Create or overwrite a seed (never a malformed file)."""
        return self._call(self._stub.AddSeed, build(pb.AddSeedRequest, request, fields), timeout)

    def update_seed(
        self,
        request: pb.UpdateSeedRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[UpdateSeedFields],
    ) -> pb.UpdateSeedResponse:
        """Patch a seed; with `expected_revision`, only if nobody changed it since."""
        return self._call(self._stub.UpdateSeed, build(pb.UpdateSeedRequest, request, fields), timeout)

    def list_seeds(
        self,
        request: pb.ListSeedsRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[ListSeedsFields],
    ) -> pb.ListSeedsResponse:
        """One page of the listing; pass its `next_page_token` as `page_token` for the next."""
        return self._call(self._stub.ListSeeds, build(pb.ListSeedsRequest, request, fields), timeout)

    def list_pages(
        self,
        request: pb.ListSeedsRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[ListSeedsFields],
    ) -> Generator[pb.ListSeedsResponse, None, None]:
        """Every page of the listing, in order (each call has its own `timeout`)."""
        message = pb.ListSeedsRequest()
        message.CopyFrom(build(pb.ListSeedsRequest, request, fields))
        while True:
            page = self.list_seeds(message, timeout=timeout)
            yield page
            if not page.next_page_token:
                return
            message.page_token = page.next_page_token

    def list_all_seeds(
        self,
        request: pb.ListSeedsRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[ListSeedsFields],
    ) -> pb.ListSeedsResponse:
        """The whole listing, every page walked and merged (`merge_pages`)."""
        return merge_pages(list(self.list_pages(request, timeout=timeout, **fields)))

    def search_seeds(
        self,
        request: pb.SearchSeedsRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[SearchSeedsFields],
    ) -> pb.SearchSeedsResponse:
        """Rank seeds for a capability; `broaden=True` also tries equivalent terms when nothing matches."""
        return self._call(self._stub.SearchSeeds, build(pb.SearchSeedsRequest, request, fields), timeout)

    def inspect_seed(
        self,
        request: pb.InspectSeedRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[SeedRefFields],
    ) -> pb.InspectSeedResponse:
        return self._call(self._stub.InspectSeed, build(pb.InspectSeedRequest, request, fields), timeout)

    def prefer_seed(
        self,
        request: pb.PreferSeedRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[PreferSeedFields],
    ) -> pb.PreferSeedResponse:
        return self._call(self._stub.PreferSeed, build(pb.PreferSeedRequest, request, fields), timeout)

    def remove_seed(
        self,
        request: pb.RemoveSeedRequest | None = None,
        /,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
        **fields: Unpack[SeedRefFields],
    ) -> pb.RemoveSeedResponse:
        return self._call(self._stub.RemoveSeed, build(pb.RemoveSeedRequest, request, fields), timeout)

    def scan_seeds(self, *, timeout: Timeout = CLIENT_TIMEOUT) -> pb.ScanSeedsResponse:
        return self._call(self._stub.ScanSeeds, pb.ScanSeedsRequest(), timeout)

    # -- streams ---------------------------------------------------------

    def verify_seeds(
        self,
        request: pb.VerifySeedsRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Unpack[VerifySeedsFields],
    ) -> Generator[pb.VerifySeedsResponse, None, None]:
        """The VerifySeeds responses as the server sends them; stopping early cancels the checks."""
        from agentsidecar.clients.errors import mapped_stream

        return mapped_stream(self._stub.VerifySeeds(verify_request(request, fields), timeout=timeout))

    def verify(
        self,
        *ids: str,
        domain: str | None = None,
        all_in_domain: bool = False,
        check_timeout: float | None = None,
        concurrency: int = 0,
        timeout: float | None = None,
    ) -> Generator[VerifyEvent, None, None]:
        """Run the seeds' evidence, yielding each check as it starts and ends, then each verdict."""
        responses = self.verify_seeds(
            ids=ids,
            domain=domain,
            all_in_domain=all_in_domain,
            check_timeout=check_timeout,
            concurrency=concurrency,
            timeout=timeout,
        )
        try:
            for response in responses:
                event = verify_event(response)
                if event is not None:
                    yield event
        finally:
            responses.close()

    def watch_seeds(
        self,
        request: pb.WatchSeedsRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Unpack[WatchSeedsFields],
    ) -> Generator[pb.WatchSeedsResponse, None, None]:
        """Changes to the store (also edits by other programs) until the server ends the stream."""
        from agentsidecar.clients.errors import mapped_stream

        return mapped_stream(
            self._stub.WatchSeeds(build(pb.WatchSeedsRequest, request, fields), timeout=timeout)
        )

    def watch(
        self, *, domain: str | None = None, timeout: float | None = None
    ) -> Generator[pb.WatchSeedsResponse, None, None]:
        """`watch_seeds` by keyword: every change, optionally of one domain only."""
        return self.watch_seeds(domain=domain, timeout=timeout)


__all__ = [
    "AddSeedFields",
    "ListSeedsFields",
    "PreferSeedFields",
    "SearchSeedsFields",
    "SeedRefFields",
    "SeedStoreClient",
    "UpdateSeedFields",
    "VerifyEvent",
    "VerifySeedsFields",
    "WatchSeedsFields",
    "build",
    "seconds",
    "verify_event",
    "verify_request",
]
