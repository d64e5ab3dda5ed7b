"""A small typed, synchronous client for the negotiator service.

Each method sends one request and returns the response proto (the watch
yields responses). A failed call raises `SidecarError` with the decoded status,
never a raw `grpc.RpcError`. For a refusal (FAILED_PRECONDITION, reason
UNSUPPORTED_CAPABILITY) `refusal_gaps` turns the PreconditionFailure back
into one `Gap` per unmet requirement.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

import grpc
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc

from clients.errors import SidecarError
from negotiator_service.model import SET_CAPABILITY, TypedSet
from sidecar_runtime.addresses import parse_address

DEFAULT_TIMEOUT_SECONDS = 30.0
DELEGATION_DEPTH_KEY = "x-delegation-depth"
UNSUPPORTED_CAPABILITY = "UNSUPPORTED_CAPABILITY"
# PreconditionFailure violation type -> the declaration's state for that gap.
GAP_STATES = {"UNSUPPORTED_CAPABILITY": "unsupported", "UNKNOWN_CAPABILITY": "unknown"}

_Response = TypeVar("_Response")


class _Default(enum.Enum):
    TIMEOUT = "the client's timeout"


_DEFAULT = _Default.TIMEOUT


@dataclass(frozen=True, slots=True)
class Gap:
    """One unmet requirement of a refused call."""

    capability: str  # e.g. "settings"
    set: str | None  # e.g. "accepted_settings", for set members
    member: str | None  # e.g. "seed", for set members
    request_field: str  # e.g. "options.settings.seed"
    state: str  # "unsupported" | "unknown"


def refusal_gaps(error: SidecarError) -> list[Gap]:
    """The gaps of an UNSUPPORTED_CAPABILITY refusal, in request order; [] for any other error."""
    if error.reason != UNSUPPORTED_CAPABILITY:
        return []
    gaps = []
    for violation in error.precondition_violations:
        if violation.type not in GAP_STATES:
            continue
        typed_set, member, capability = None, None, violation.subject
        set_name, sep, member_name = violation.subject.partition(":")
        if sep:
            typed_set, member = set_name, member_name
            known = {s.value: s for s in TypedSet}
            capability = SET_CAPABILITY[known[set_name]].value if set_name in known else set_name
        request_field = violation.description.partition(" needs ")[0]
        gaps.append(Gap(capability, typed_set, member, request_field, GAP_STATES[violation.type]))
    return gaps


class NegotiatorClient:
    """`NegotiatorClient("unix:/run/negotiator.sock")` or `NegotiatorClient("127.0.0.1:50062")`.

    `timeout` applies to every call unless a method is given its own;
    None means no deadline.
    """

    def __init__(self, target: str, *, timeout: float | None = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.target = parse_address(target).target
        self.timeout = timeout
        self._channel = grpc.insecure_channel(self.target)
        self._stub = negotiator_pb2_grpc.NegotiatorServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> NegotiatorClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- adapters --------------------------------------------------------

    def list_adapters(self) -> list[pb.Adapter]:
        return list(self._call(self._stub.ListAdapters, pb.ListAdaptersRequest()).adapters)

    def get_adapter(self, shortname: str) -> pb.Adapter:
        return self._call(self._stub.GetAdapter, pb.GetAdapterRequest(shortname=shortname)).adapter

    def watch_adapters(self) -> Iterator[pb.WatchAdaptersResponse]:
        """Existing adapters, then changes, until the server ends the stream; no deadline."""
        return self._stream(self._stub.WatchAdapters(pb.WatchAdaptersRequest()))

    def register_adapter(self, target: str, shortname: str = "") -> pb.Adapter:
        request = pb.RegisterAdapterRequest(target=target, shortname=shortname)
        return self._call(self._stub.RegisterAdapter, request).adapter

    def deregister_adapter(self, shortname: str) -> pb.Adapter:
        return self._call(
            self._stub.DeregisterAdapter, pb.DeregisterAdapterRequest(shortname=shortname)
        ).adapter

    # -- calls -----------------------------------------------------------

    def negotiate(
        self, call: pb.ProduceRequest | pb.InvokeRequest, *, timeout: float | _Default | None = _DEFAULT
    ) -> pb.Decision:
        if isinstance(call, pb.ProduceRequest):
            request = pb.NegotiateRequest(produce=call)
        else:
            request = pb.NegotiateRequest(invoke=call)
        return self._call(self._stub.Negotiate, request, timeout).decision

    def produce(
        self,
        request: pb.ProduceRequest,
        *,
        timeout: float | _Default | None = _DEFAULT,
        delegation_depth: int | None = None,
    ) -> pb.ProduceResponse:
        return self._call(self._stub.Produce, request, timeout, delegation_depth)

    def invoke(
        self,
        request: pb.InvokeRequest,
        *,
        timeout: float | _Default | None = _DEFAULT,
        delegation_depth: int | None = None,
    ) -> pb.InvokeResponse:
        return self._call(self._stub.Invoke, request, timeout, delegation_depth)

    # -- plumbing --------------------------------------------------------

    def _call(
        self,
        method: Callable[..., _Response],
        request: object,
        timeout: float | _Default | None = _DEFAULT,
        delegation_depth: int | None = None,
    ) -> _Response:
        metadata: Sequence[tuple[str, str]] = ()
        if delegation_depth is not None:
            metadata = ((DELEGATION_DEPTH_KEY, str(delegation_depth)),)
        try:
            return method(
                request, timeout=self.timeout if isinstance(timeout, _Default) else timeout, metadata=metadata
            )
        except grpc.RpcError as error:
            raise SidecarError.from_rpc_error(error) from None

    @staticmethod
    def _stream(call: grpc.CallIterator[_Response]) -> Iterator[_Response]:
        try:
            yield from call
        except grpc.RpcError as error:
            raise SidecarError.from_rpc_error(error) from None
        finally:
            call.cancel()  # type: ignore[no-untyped-call]  # a no-op once the stream has ended
