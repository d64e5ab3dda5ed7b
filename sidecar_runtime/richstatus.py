"""google.rpc.Status with ErrorInfo and BadRequest / PreconditionFailure details.

Every error either sidecar returns carries exactly one ErrorInfo (AIP-193),
so clients in any language can branch on `reason` instead of parsing text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status


@dataclass(frozen=True, slots=True)
class PreconditionViolation:
    type: str
    subject: str
    description: str


@dataclass(frozen=True, slots=True)
class RichError:
    """Everything a status carries, independent of how it is sent."""

    code: grpc.StatusCode
    message: str
    reason: str
    domain: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    field_violations: Sequence[tuple[str, str]] = ()
    precondition_violations: Sequence[PreconditionViolation] = ()
    retry_after_seconds: float | None = None

    def to_status(self) -> grpc.Status:
        details = []
        info = error_details_pb2.ErrorInfo(
            reason=self.reason, domain=self.domain, metadata=dict(self.metadata)
        )
        details.append(info)
        if self.field_violations:
            details.append(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                        for f, d in self.field_violations
                    ]
                )
            )
        if self.precondition_violations:
            details.append(
                error_details_pb2.PreconditionFailure(
                    violations=[
                        error_details_pb2.PreconditionFailure.Violation(
                            type=v.type, subject=v.subject, description=v.description
                        )
                        for v in self.precondition_violations
                    ]
                )
            )
        if self.retry_after_seconds is not None:
            delay = duration_pb2.Duration()
            delay.FromNanoseconds(int(self.retry_after_seconds * 1e9))
            details.append(error_details_pb2.RetryInfo(retry_delay=delay))
        packed = []
        for detail in details:
            any_detail = any_pb2.Any()
            any_detail.Pack(detail)
            packed.append(any_detail)
        status = status_pb2.Status(
            code=getattr(code_pb2, self.code.name),
            message=self.message,
            details=packed,
        )
        result: grpc.Status = rpc_status.to_status(status)
        return result


async def abort_with(context: grpc.aio.ServicerContext[object, object], error: RichError) -> None:
    """Abort the current call with `error`; never returns.

    Through `abort` with the status's trailing metadata (its packed details)
    rather than `abort_with_status`, which does the same: a context wrapped
    by an interceptor sees an `abort` (OpenTelemetry's records the status
    code on the span that way), while `abort_with_status` would go around it.
    """
    status = error.to_status()
    await context.abort(status.code, status.details, status.trailing_metadata)


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
    code = error.code()
    message = error.details() or ""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
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
