"""The one place where seedstore errors become gRPC statuses: error_status.py's table, sent.

Every status carries what `error_status.error_status` gives the error: its code,
an ErrorInfo (reason = the error class's `reason`, domain `seedstore.agentsidecar`),
BadRequest for bad input and PreconditionFailure for files that must be fixed
first, and the error's own message. Anything that is not a SeedStoreError is a
bug: it becomes INTERNAL (never UNKNOWN) and is logged with its traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import grpc

from agentsidecar.seedstore_service import errors
from agentsidecar.seedstore_service.error_status import ERROR_DOMAIN as ERROR_DOMAIN
from agentsidecar.seedstore_service.error_status import error_status
from agentsidecar.sidecar_runtime.richstatus import RichError
from agentsidecar.sidecar_runtime.rpcerrors import ErrorTable

INTERNAL_REASON = "INTERNAL"


def to_rich_error(error: BaseException, fields: Mapping[str, str] | None = None) -> RichError:
    """The status for `error`; `fields` maps core field labels to this RPC's request fields."""
    status = error_status(error, fields) if isinstance(error, errors.SeedStoreError) else None
    if status is None:
        return internal_error(error)
    return RichError(
        code=grpc.StatusCode[status.code.name],
        message=status.message,
        reason=status.reason,
        domain=status.domain,
        metadata=status.metadata,
        field_violations=status.field_violations,
        precondition_violations=status.precondition_violations,
    )


def internal_error(error: BaseException, operation: str = "") -> RichError:
    """A bug: INTERNAL with an ErrorInfo, never UNKNOWN; metadata names the exception (and the RPC)."""
    metadata = {"exception": type(error).__name__}
    if operation:
        metadata["operation"] = operation
    return RichError(
        code=grpc.StatusCode.INTERNAL,
        message=f"internal error: {type(error).__name__}: {error}",
        reason=INTERNAL_REASON,
        domain=ERROR_DOMAIN,
        metadata=metadata,
    )


def error_table(fields: Mapping[str, str] | None = None) -> ErrorTable[errors.SeedStoreError]:
    """What the servicer's error decorators send; `fields` maps core labels to the RPC's request fields."""
    return ErrorTable(errors.SeedStoreError, functools.partial(to_rich_error, fields=fields), internal_error)
