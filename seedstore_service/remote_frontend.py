"""The `seedstore --server` front end: the CLI's commands through a running seedstore service.

Its own module so that the local commands never import grpc, the generated code or the client.
It imports what one call from the blocking client needs beside the modules cli.py has loaded:
grpc, the generated seedstore code, `clients.seedstore` and `clients.errors`, and
`remote_convert` (not the service's half of `convert`, nor the asyncio client).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentsidecar.clients.errors import SidecarError
from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore_service import remote_convert as convert
from agentsidecar.seedstore_service.errors import SeedStoreError

if TYPE_CHECKING:
    from agentsidecar.seedstore_service.cli import ProgressListener
    from agentsidecar.seedstore_service.operations import (
        SearchOutcome,
        SeedListing,
        SeedRemoved,
        SeedView,
        VerifyRequest,
    )
    from agentsidecar.seedstore_service.patch import AddSpec, UpdatePatch
    from agentsidecar.seedstore_service.ranking import SearchQuery


class RemoteFrontend:
    """A seedstore service; every response is turned back into the core value the local path returns."""

    errors: tuple[type[Exception], ...] = (SeedStoreError, SidecarError)

    def __init__(self, target: str, token_file: str | None = None) -> None:
        self._client = SeedStoreClient(target, token_file=token_file)

    def close(self) -> None:
        self._client.close()

    def store(self) -> str:
        return self._client.get_store().seed_store

    def add(self, spec: AddSpec) -> SeedView:
        return convert.seed_view_from_proto(self._client.add_seed(convert.add_request(spec)))

    def update(
        self, seed_id: str, domain: str | None, patch: UpdatePatch, expected_revision: str | None
    ) -> SeedView:
        request = convert.update_request(seed_id, domain, patch, expected_revision)
        return convert.seed_view_from_proto(self._client.update_seed(request))

    def list_seeds(self, domain: str | None) -> SeedListing:
        # Every page, so the output is the whole listing as SkillSpec prints it.
        return convert.listing_from_proto(self._client.list_all_seeds(pb.ListSeedsRequest(domain=domain)))

    def search(self, query: SearchQuery, broaden: bool) -> SearchOutcome:
        response = self._client.search_seeds(convert.search_request(query, broaden))
        return convert.search_outcome_from_proto(response)

    def inspect(self, seed_id: str, domain: str | None) -> SeedView:
        request = pb.InspectSeedRequest(id=seed_id, domain=domain)
        return convert.seed_view_from_proto(self._client.inspect_seed(request))

    def prefer(self, seed_id: str, domain: str | None, for_capability: str, priority: int | None) -> SeedView:
        request = pb.PreferSeedRequest(
            id=seed_id, domain=domain, for_capability=for_capability, priority=priority
        )
        return convert.seed_view_from_proto(self._client.prefer_seed(request))

    def remove(self, seed_id: str, domain: str | None) -> SeedRemoved:
        request = pb.RemoveSeedRequest(id=seed_id, domain=domain)
        return convert.removed_from_proto(self._client.remove_seed(request))

    def scan(self) -> str:
        return self._client.scan_seeds().seed_store

    def verify(self, request: VerifyRequest, limits_given: bool, listener: ProgressListener) -> str:
        message = convert.verify_request(request, send_timeout=limits_given, send_concurrency=limits_given)
        seed_store = ""
        for response in self._client.verify_seeds(message):
            seed_store = response.seed_store
            listener(seed_store, convert.verify_event_from_proto(response))
        if not seed_store:
            seed_store = self.store()
        return seed_store

    def planned_checks(self, request: VerifyRequest) -> dict[tuple[str, str], int]:
        from agentsidecar.seedstore_service.verification import plan_checks

        if request.all_in_domain:
            listing = self.list_seeds(request.domain)
            targets: list[tuple[str, str | None]] = [(entry.id, entry.domain) for entry in listing.entries]
        else:
            targets = [(seed_id, request.domain) for seed_id in dict.fromkeys(request.ids)]
        planned = {}
        for seed_id, domain in targets:
            seed = self.inspect(seed_id, domain).stored.seed
            planned[(seed.domain, seed.id)] = len(plan_checks(seed))
        return planned
