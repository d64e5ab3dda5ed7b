"""A small typed, synchronous client for the seedstore service.

Each method sends one request proto and returns the response proto (streams
yield responses). A failed call raises `SidecarError` with the decoded
status (code, ErrorInfo reason and metadata, field and precondition
violations), never a raw `grpc.RpcError`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from types import TracebackType
from typing import TypeVar

import grpc
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore.v1 import seedstore_pb2_grpc

from clients.errors import SidecarError
from sidecar_runtime.addresses import parse_address

DEFAULT_TIMEOUT_SECONDS = 30.0

_Response = TypeVar("_Response")


class SeedStoreClient:
    """`SeedStoreClient("unix:/run/seedstore.sock")` or `SeedStoreClient("127.0.0.1:50051")`."""

    def __init__(self, target: str, *, timeout: float | None = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.target = parse_address(target).target
        self.timeout = timeout
        self._channel = grpc.insecure_channel(self.target)
        self._stub = seedstore_pb2_grpc.SeedStoreServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> SeedStoreClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- unary calls -----------------------------------------------------

    def get_store(self) -> pb.GetStoreResponse:
        return self._call(self._stub.GetStore, pb.GetStoreRequest())

    def add_seed(self, request: pb.AddSeedRequest) -> pb.AddSeedResponse:
        return self._call(self._stub.AddSeed, request)

    def update_seed(self, request: pb.UpdateSeedRequest) -> pb.UpdateSeedResponse:
        return self._call(self._stub.UpdateSeed, request)

    def list_seeds(self, request: pb.ListSeedsRequest) -> pb.ListSeedsResponse:
        return self._call(self._stub.ListSeeds, request)

    def search_seeds(self, request: pb.SearchSeedsRequest) -> pb.SearchSeedsResponse:
        return self._call(self._stub.SearchSeeds, request)

    def inspect_seed(self, request: pb.InspectSeedRequest) -> pb.InspectSeedResponse:
        return self._call(self._stub.InspectSeed, request)

    def prefer_seed(self, request: pb.PreferSeedRequest) -> pb.PreferSeedResponse:
        return self._call(self._stub.PreferSeed, request)

    def remove_seed(self, request: pb.RemoveSeedRequest) -> pb.RemoveSeedResponse:
        return self._call(self._stub.RemoveSeed, request)

    def scan_seeds(self) -> pb.ScanSeedsResponse:
        return self._call(self._stub.ScanSeeds, pb.ScanSeedsRequest())

    # -- streams ---------------------------------------------------------

    def verify_seeds(self, request: pb.VerifySeedsRequest) -> Generator[pb.VerifySeedsResponse, None, None]:
        """Events as the server sends them; stopping early cancels the call (and the checks)."""
        return self._stream(self._stub.VerifySeeds(request))

    def watch_seeds(self, request: pb.WatchSeedsRequest) -> Generator[pb.WatchSeedsResponse, None, None]:
        """Changes until the server ends the stream; stopping early cancels the call."""
        return self._stream(self._stub.WatchSeeds(request))

    # -- plumbing --------------------------------------------------------

    def _call(self, method: Callable[..., _Response], request: object) -> _Response:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise SidecarError.from_rpc_error(error) from None

    @staticmethod
    def _stream(call: grpc.CallIterator[_Response]) -> Generator[_Response, None, None]:
        try:
            yield from call
        except grpc.RpcError as error:
            raise SidecarError.from_rpc_error(error) from None
        finally:
            call.cancel()  # type: ignore[no-untyped-call]  # a no-op once the stream has ended
