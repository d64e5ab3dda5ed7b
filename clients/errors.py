"""What a sidecar call raises when it fails: the decoded google.rpc.Status."""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from sidecar_runtime.richstatus import DecodedError, PreconditionViolation, decode_error


class SidecarError(Exception):
    """A failed call, details unpacked; `str()` is the server's message."""

    def __init__(self, decoded: DecodedError, original: grpc.RpcError | None = None) -> None:
        super().__init__(decoded.message)
        self.decoded = decoded
        self.original = original

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> SidecarError:
        return cls(decode_error(error), error)

    @property
    def code(self) -> grpc.StatusCode:
        return self.decoded.code

    @property
    def message(self) -> str:
        return self.decoded.message

    @property
    def reason(self) -> str:
        return self.decoded.reason

    @property
    def domain(self) -> str:
        return self.decoded.domain

    @property
    def metadata(self) -> Mapping[str, str]:
        return self.decoded.metadata

    @property
    def field_violations(self) -> tuple[tuple[str, str], ...]:
        return self.decoded.field_violations

    @property
    def precondition_violations(self) -> tuple[PreconditionViolation, ...]:
        return self.decoded.precondition_violations

    def __repr__(self) -> str:
        return f"SidecarError(code={self.code.name}, reason={self.reason!r}, message={self.message!r})"
