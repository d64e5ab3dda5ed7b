"""The one place where seedstore errors become gRPC statuses.

Every status carries an ErrorInfo (reason = the error class's `reason`,
domain `seedstore.agentsidecar`), plus BadRequest for bad input and
PreconditionFailure for files that must be fixed first. The status message is
the error's own message, so `seedstore --server` prints the same `error: ...`
line as the local CLI. Anything that is not a SeedStoreError is a bug: it
becomes INTERNAL (never UNKNOWN) and is logged with its traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType

import grpc

from agentsidecar.seedstore_service import errors
from agentsidecar.sidecar_runtime.richstatus import PreconditionViolation, RichError
from agentsidecar.sidecar_runtime.rpcerrors import ErrorTable

ERROR_DOMAIN = "seedstore.agentsidecar"
INTERNAL_REASON = "INTERNAL"

# SkillSpec names fields in its messages ("invalid identifier "X" in capability
# id"); clients need the request field instead. Labels not listed here are
# already request field names (e.g. "check_timeout") or need only `-` → `_`.
_FIELD_OF_LABEL: Mapping[str, str] = {
    "capability id": "id",
    "preferred seed": "preferred_seed",
    "for": "for_capability",
    "tie key": "ties",
    "tie": "ties",
    "alias": "aliases",
    "remove-tie": "remove_ties",
}


def request_field(label: str, overrides: Mapping[str, str] | None = None) -> str:
    """The request field a core field label refers to; `overrides` are per RPC (e.g. id → ids)."""
    if overrides and label in overrides:
        return overrides[label]
    if label in _FIELD_OF_LABEL:
        return _FIELD_OF_LABEL[label]
    return label.replace("-", "_").replace(" ", "_")


def _invalid_argument(error: errors.SeedStoreError, fields: Mapping[str, str] | None) -> RichError:
    assert isinstance(error, errors.InvalidArgument)
    field = request_field(error.field, fields) if error.field else ""
    metadata = {"field": field} if field else {}
    if isinstance(error, errors.InvalidIdentifier):
        metadata["value"] = errors.excerpt(error.value)
    return RichError(
        code=grpc.StatusCode.INVALID_ARGUMENT,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata=metadata,
        field_violations=((field, error.message),),
    )


def _not_found(error: errors.SeedStoreError, _: Mapping[str, str] | None) -> RichError:
    assert isinstance(error, errors.SeedNotFound)
    return RichError(
        code=grpc.StatusCode.NOT_FOUND,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={"seedId": error.seed_id},
    )


def _ambiguous(error: errors.SeedStoreError, _: Mapping[str, str] | None) -> RichError:
    assert isinstance(error, errors.AmbiguousSeed)
    return RichError(
        code=grpc.StatusCode.FAILED_PRECONDITION,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={"seedId": error.seed_id, "pathCount": str(len(error.paths))},
        precondition_violations=tuple(
            PreconditionViolation(
                type=error.reason,
                subject=path,
                description=f'one of several files holding seed "{error.seed_id}"; pass a domain',
            )
            for path in error.paths
        ),
    )


def _malformed(error: errors.SeedStoreError, _: Mapping[str, str] | None) -> RichError:
    assert isinstance(error, errors.SeedMalformed)
    where = f"line {error.line}: " if error.line else ""
    return RichError(
        code=grpc.StatusCode.FAILED_PRECONDITION,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={"path": error.path, "line": str(error.line), "detail": error.detail},
        precondition_violations=(
            PreconditionViolation(type=error.reason, subject=error.path, description=where + error.detail),
        ),
    )


def _revision_mismatch(error: errors.SeedStoreError, _: Mapping[str, str] | None) -> RichError:
    assert isinstance(error, errors.RevisionMismatch)
    return RichError(
        code=grpc.StatusCode.ABORTED,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={"seedId": error.seed_id, "expected": error.expected, "actual": error.actual},
    )


def _outside_store(error: errors.SeedStoreError, _: Mapping[str, str] | None) -> RichError:
    assert isinstance(error, errors.OutsideStore)
    return RichError(
        code=grpc.StatusCode.FAILED_PRECONDITION,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={"path": errors.excerpt(error.path, 512)},
        precondition_violations=(
            PreconditionViolation(
                type=error.reason,
                subject=error.path,
                description="the directory is a link out of the store; writes stay inside it",
            ),
        ),
    )


def _watch_backlog(error: errors.SeedStoreError, _: Mapping[str, str] | None) -> RichError:
    assert isinstance(error, errors.WatchBacklogExceeded)
    return RichError(
        code=grpc.StatusCode.ABORTED,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={"backlogBytes": str(error.backlog_bytes), "limitBytes": str(error.limit_bytes)},
    )


def _unavailable(error: errors.SeedStoreError, _: Mapping[str, str] | None) -> RichError:
    return RichError(
        code=grpc.StatusCode.UNAVAILABLE,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
    )


_Builder = Callable[[errors.SeedStoreError, Mapping[str, str] | None], RichError]

# Keyed by class; an error takes the row of its nearest listed class (InvalidIdentifier
# that of InvalidArgument), and a test walks the tree so no concrete class is left out.
STATUS_TABLE: Mapping[type[errors.SeedStoreError], _Builder] = MappingProxyType(
    {
        errors.InvalidArgument: _invalid_argument,
        errors.SeedNotFound: _not_found,
        errors.AmbiguousSeed: _ambiguous,
        errors.SeedMalformed: _malformed,
        errors.RevisionMismatch: _revision_mismatch,
        errors.OutsideStore: _outside_store,
        errors.WatchBacklogExceeded: _watch_backlog,
        errors.StoreUnavailable: _unavailable,
    }
)


def to_rich_error(error: BaseException, fields: Mapping[str, str] | None = None) -> RichError:
    """The status for `error`; `fields` maps core field labels to this RPC's request fields."""
    if isinstance(error, errors.SeedStoreError):
        for cls in type(error).__mro__:
            builder = STATUS_TABLE.get(cls)
            if builder is not None:
                return builder(error, fields)
    return internal_error(error)


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
