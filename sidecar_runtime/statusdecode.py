"""A google.rpc.Status as a client receives it: code, message and the details, unpacked.

The client's half of `richstatus`, which builds the statuses the sidecars send
(capped as its docstring says: `violationsOmitted` and `truncated` below are
its ErrorInfo metadata keys) and re-exports every name here. A client imports
this module, not `richstatus`: the generated google.rpc code and grpc_status
are imported by the first `decode_error`, when a call has failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from agentsidecar.sidecar_runtime.violations import PreconditionViolation as PreconditionViolation

VIOLATIONS_OMITTED = "violationsOmitted"
TRUNCATED = "truncated"


@dataclass(frozen=True, slots=True)
class DecodedError:
    """A status as a client sees it, details unpacked."""

    code: grpc.StatusCode
    message: str
    reason: str = ""
    domain: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    field_violations: tuple[tuple[str, str], ...] = ()
    precondition_violations: tuple[PreconditionViolation, ...] = ()
    retry_after_seconds: float | None = None


def decode_error(error: grpc.RpcError) -> DecodedError:
    """Unpack the rich details of a failed call (sync or aio)."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    code = error.code()
    message = error.details() or ""
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except ValueError:
        # Details whose code or message differ from the call's: grpc replaced the
        # status on the way (a trailer over the client's metadata limit, say).
        status = None
    if status is None:
        return DecodedError(code=code, message=message)
    reason = domain = ""
    metadata: dict[str, str] = {}
    fields: list[tuple[str, str]] = []
    preconditions: list[PreconditionViolation] = []
    retry_after: float | None = None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields.extend((v.field, v.description) for v in bad.field_violations)
        elif detail.Is(error_details_pb2.PreconditionFailure.DESCRIPTOR):
            failure = error_details_pb2.PreconditionFailure()
            detail.Unpack(failure)
            preconditions.extend(
                PreconditionViolation(v.type, v.subject, v.description) for v in failure.violations
            )
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_after = retry.retry_delay.ToNanoseconds() / 1e9
    return DecodedError(
        code=code,
        message=status.message or message,
        reason=reason,
        domain=domain,
        metadata=metadata,
        field_violations=tuple(fields),
        precondition_violations=tuple(preconditions),
        retry_after_seconds=retry_after,
    )
