"""google.rpc.Status with ErrorInfo and BadRequest / PreconditionFailure details.

Every error either sidecar returns carries exactly one ErrorInfo (AIP-193),
so clients in any language can branch on `reason` instead of parsing text.

Size: a status travels in the response's trailers, `grpc-message` (the
message, percent-encoded) and `grpc-status-details-bin` (the serialized
google.rpc.Status, base64). gRPC limits all of a response's metadata
together: C-core clients (grpcio, Node's native client, C++) refuse more than
16 KiB with RESOURCE_EXHAUSTED and no details, and may start refusing at 8 KiB.
So `to_status` caps what an error quotes, whatever its builder put in:

* the message: at most `MAX_MESSAGE_WIRE_BYTES` as sent;
* each ErrorInfo metadata value: at most `MAX_METADATA_VALUE_CHARS`;
* each field of a BadRequest or PreconditionFailure violation: at most
  `MAX_VIOLATION_FIELD_CHARS`;
* both trailers together: at most `MAX_TRAILER_BYTES`, by keeping the first
  violations that fit (at least one) and counting the rest in the ErrorInfo
  metadata `violationsOmitted`.

A shortened text ends in `...(N more characters)`; ErrorInfo metadata
`truncated` then lists what was shortened (`message`, metadata keys,
`violations`), comma-separated, so a client knows a value is incomplete.
Reason, domain, code and RetryInfo are never touched.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

# What a client decodes (statusdecode.py, which a client imports without this module), re-exported.
from agentsidecar.sidecar_runtime.statusdecode import TRUNCATED as TRUNCATED
from agentsidecar.sidecar_runtime.statusdecode import VIOLATIONS_OMITTED as VIOLATIONS_OMITTED
from agentsidecar.sidecar_runtime.statusdecode import DecodedError as DecodedError
from agentsidecar.sidecar_runtime.statusdecode import PreconditionViolation as PreconditionViolation
from agentsidecar.sidecar_runtime.statusdecode import decode_error as decode_error

# Both trailers together, as sent: far below the 8 KiB where C-core clients
# may start refusing, leaving the rest for the other headers and trailers.
MAX_TRAILER_BYTES = 6144
MAX_MESSAGE_WIRE_BYTES = 512
MAX_METADATA_VALUE_CHARS = 256
MAX_VIOLATION_FIELD_CHARS = 256
# The tighter caps applied when the first ones leave no room for even one violation.
_TIGHT_MESSAGE_WIRE_BYTES = 256
_TIGHT_CHARS = 64


def wire_message_size(text: str) -> int:
    """The size of `text` as grpc-message: UTF-8, percent-encoded outside printable ASCII and `%`."""
    return sum(1 if 0x20 <= byte <= 0x7E and byte != 0x25 else 3 for byte in text.encode())


def _marker(omitted: int) -> str:
    return f"...({omitted} more characters)"


def clip(text: str, max_chars: int) -> str:
    """`text`, or its start and a marker saying how much is left out, in at most `max_chars`."""
    if len(text) <= max_chars:
        return text
    keep = max(max_chars - len(_marker(len(text))), 0)
    return text[:keep] + _marker(len(text) - keep)


def clip_message(text: str, max_wire_bytes: int) -> str:
    """`text`, shortened (with a marker) so that it is at most `max_wire_bytes` as grpc-message."""
    # Every character takes at least one byte as sent: a longer text never fits.
    if len(text) <= max_wire_bytes and wire_message_size(text) <= max_wire_bytes:
        return text
    budget = max_wire_bytes - len(_marker(len(text)))
    keep, used = 0, 0
    for char in text:
        size = wire_message_size(char)
        if used + size > budget:
            break
        used += size
        keep += 1
    return text[:keep] + _marker(len(text) - keep)


def trailer_size(status: grpc.Status) -> int:
    """grpc-message plus grpc-status-details-bin of `status`, in bytes as sent (base64 unpadded)."""
    size = wire_message_size(status.details)
    for _, value in status.trailing_metadata:
        raw = value if isinstance(value, bytes) else value.encode()
        size += len(base64.b64encode(raw).rstrip(b"="))
    return size


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
        """The status to send, capped as the module says."""
        status = self._capped(MAX_MESSAGE_WIRE_BYTES, MAX_METADATA_VALUE_CHARS, MAX_VIOLATION_FIELD_CHARS)
        if status is None:
            status = self._capped(_TIGHT_MESSAGE_WIRE_BYTES, _TIGHT_CHARS, _TIGHT_CHARS, at_least_one=False)
        assert status is not None
        return status

    def _capped(
        self, message_bytes: int, value_chars: int, field_chars: int, *, at_least_one: bool = True
    ) -> grpc.Status | None:
        """The status with these caps, keeping as many violations as fit in MAX_TRAILER_BYTES.

        None when not even one violation fits and `at_least_one` is asked.
        """
        truncated: list[str] = []
        message = clip_message(self.message, message_bytes)
        if message != self.message:
            truncated.append("message")
        metadata: dict[str, str] = {}
        for key, value in self.metadata.items():
            metadata[key] = clip(value, value_chars)
            if metadata[key] != value:
                truncated.append(key)
        fields = [(clip(f, field_chars), clip(d, field_chars)) for f, d in self.field_violations]
        preconditions = [
            PreconditionViolation(
                clip(v.type, field_chars), clip(v.subject, field_chars), clip(v.description, field_chars)
            )
            for v in self.precondition_violations
        ]
        clipped = fields != list(self.field_violations) or preconditions != list(self.precondition_violations)
        if clipped:
            truncated.append("violations")

        def build(kept: int) -> grpc.Status:
            extra = dict(metadata)
            omitted = len(fields) + len(preconditions) - kept
            if omitted:
                extra[VIOLATIONS_OMITTED] = str(omitted)
            if truncated:
                extra[TRUNCATED] = ",".join(truncated)
            kept_fields = fields[:kept]
            kept_preconditions = preconditions[: max(kept - len(fields), 0)]
            return self._status(message, extra, kept_fields, kept_preconditions)

        total = len(fields) + len(preconditions)
        status = build(total)
        if trailer_size(status) <= MAX_TRAILER_BYTES:
            return status
        # The most violations that fit: sizes grow with the count, so bisect.
        low, high = 0, total - 1
        while low < high:
            middle = (low + high + 1) // 2
            if trailer_size(build(middle)) <= MAX_TRAILER_BYTES:
                low = middle
            else:
                high = middle - 1
        fitted = build(low)
        if trailer_size(fitted) > MAX_TRAILER_BYTES or (at_least_one and total and low == 0):
            return None if at_least_one else fitted
        return fitted

    def _status(
        self,
        message: str,
        metadata: Mapping[str, str],
        fields: Sequence[tuple[str, str]],
        preconditions: Sequence[PreconditionViolation],
    ) -> grpc.Status:
        details = []
        info = error_details_pb2.ErrorInfo(reason=self.reason, domain=self.domain, metadata=dict(metadata))
        details.append(info)
        if fields:
            details.append(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(field=f, description=d) for f, d in fields
                    ]
                )
            )
        if preconditions:
            details.append(
                error_details_pb2.PreconditionFailure(
                    violations=[
                        error_details_pb2.PreconditionFailure.Violation(
                            type=v.type, subject=v.subject, description=v.description
                        )
                        for v in preconditions
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
        status = status_pb2.Status(code=getattr(code_pb2, self.code.name), message=message, details=packed)
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
