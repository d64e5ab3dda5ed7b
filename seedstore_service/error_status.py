"""What each seedstore error reports as a status, with no gRPC: the one table both ends use.

Every error has a canonical code (google.rpc.Code, named), an ErrorInfo (reason =
the error class's `reason`, domain `seedstore.agentsidecar`) with metadata, plus
BadRequest field violations for bad input and PreconditionFailure violations for
files that must be fixed first. The message is the error's own, so `seedstore
--server` prints the same `error: ...` line as the local CLI. status.py sends an
ErrorStatus as the gRPC status (and anything that is not a SeedStoreError as
INTERNAL); the local CLI prints it as the same JSON error object
(`cli_common.status_error_object`), without importing gRPC.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from agentsidecar.seedstore_service.errors import (
    AmbiguousSeed,
    InvalidArgument,
    InvalidIdentifier,
    OutsideStore,
    RevisionMismatch,
    SeedMalformed,
    SeedNotFound,
    SeedStoreError,
    StoreUnavailable,
    WatchBacklogExceeded,
    excerpt,
)
from agentsidecar.sidecar_runtime.violations import PreconditionViolation


class Code(enum.Enum):
    """The canonical codes (google.rpc.Code) a seedstore error takes, by their gRPC names."""

    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    FAILED_PRECONDITION = 9
    ABORTED = 10
    UNAVAILABLE = 14


@dataclass(frozen=True, slots=True)
class ErrorStatus:
    """A seedstore error's status, as status.py sends it and the CLI prints it."""

    code: Code
    message: str
    reason: str
    domain: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    field_violations: tuple[tuple[str, str], ...] = ()
    precondition_violations: tuple[PreconditionViolation, ...] = ()


ERROR_DOMAIN = "seedstore.agentsidecar"
# SkillSpec names fields in its messages ("invalid identifier "X" in capability
# id"); clients need the request field instead. Labels not listed here are
# already request field names (e.g. "check_timeout") or need only `-` → `_`.
_FIELD_OF_LABEL: Mapping[str, str] = MappingProxyType(
    {
        "capability id": "id",
        "preferred seed": "preferred_seed",
        "for": "for_capability",
        "tie key": "ties",
        "tie": "ties",
        "alias": "aliases",
        "remove-tie": "remove_ties",
    }
)


def request_field(label: str, overrides: Mapping[str, str] | None = None) -> str:
    """The request field a core field label refers to; `overrides` are per RPC (e.g. id → ids)."""
    if overrides and label in overrides:
        return overrides[label]
    if label in _FIELD_OF_LABEL:
        return _FIELD_OF_LABEL[label]
    return label.replace("-", "_").replace(" ", "_")


def _invalid_argument(error: SeedStoreError, fields: Mapping[str, str] | None) -> ErrorStatus:
    assert isinstance(error, InvalidArgument)
    field = request_field(error.field, fields) if error.field else ""
    metadata = {"field": field} if field else {}
    if isinstance(error, InvalidIdentifier):
        metadata["value"] = excerpt(error.value)
    return ErrorStatus(
        code=Code.INVALID_ARGUMENT,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata=metadata,
        field_violations=((field, error.message),),
    )


def _not_found(error: SeedStoreError, _: Mapping[str, str] | None) -> ErrorStatus:
    assert isinstance(error, SeedNotFound)
    return ErrorStatus(
        code=Code.NOT_FOUND,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={"seedId": error.seed_id},
    )


def _ambiguous(error: SeedStoreError, _: Mapping[str, str] | None) -> ErrorStatus:
    assert isinstance(error, AmbiguousSeed)
    return ErrorStatus(
        code=Code.FAILED_PRECONDITION,
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


def _malformed(error: SeedStoreError, _: Mapping[str, str] | None) -> ErrorStatus:
    assert isinstance(error, SeedMalformed)
    where = f"line {error.line}: " if error.line else ""
    return ErrorStatus(
        code=Code.FAILED_PRECONDITION,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={"path": error.path, "line": str(error.line), "detail": error.detail},
        precondition_violations=(
            PreconditionViolation(type=error.reason, subject=error.path, description=where + error.detail),
        ),
    )


def _revision_mismatch(error: SeedStoreError, _: Mapping[str, str] | None) -> ErrorStatus:
    assert isinstance(error, RevisionMismatch)
    return ErrorStatus(
        code=Code.ABORTED,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={"seedId": error.seed_id, "expected": error.expected, "actual": error.actual},
    )


def _outside_store(error: SeedStoreError, _: Mapping[str, str] | None) -> ErrorStatus:
    assert isinstance(error, OutsideStore)
    return ErrorStatus(
        code=Code.FAILED_PRECONDITION,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={"path": excerpt(error.path, 512)},
        precondition_violations=(
            PreconditionViolation(
                type=error.reason,
                subject=error.path,
                description="the directory is a link out of the store; writes stay inside it",
            ),
        ),
    )


def _watch_backlog(error: SeedStoreError, _: Mapping[str, str] | None) -> ErrorStatus:
    assert isinstance(error, WatchBacklogExceeded)
    return ErrorStatus(
        code=Code.ABORTED,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={"backlogBytes": str(error.backlog_bytes), "limitBytes": str(error.limit_bytes)},
    )


def _unavailable(error: SeedStoreError, _: Mapping[str, str] | None) -> ErrorStatus:
    return ErrorStatus(
        code=Code.UNAVAILABLE,
        message=error.message,
        reason=error.reason,
        domain=ERROR_DOMAIN,
    )


_Builder = Callable[[SeedStoreError, Mapping[str, str] | None], ErrorStatus]

# Keyed by class; an error takes the row of its nearest listed class (InvalidIdentifier
# that of InvalidArgument), and a test walks the tree so no concrete class is left out.
STATUS_TABLE: Mapping[type[SeedStoreError], _Builder] = MappingProxyType(
    {
        InvalidArgument: _invalid_argument,
        SeedNotFound: _not_found,
        AmbiguousSeed: _ambiguous,
        SeedMalformed: _malformed,
        RevisionMismatch: _revision_mismatch,
        OutsideStore: _outside_store,
        WatchBacklogExceeded: _watch_backlog,
        StoreUnavailable: _unavailable,
    }
)


def error_status(error: SeedStoreError, fields: Mapping[str, str] | None = None) -> ErrorStatus | None:
    """The status of `error`: the row of its nearest listed class (None: no row, a bug status.py
    sends as INTERNAL; a test walks the tree so that none is left out); `fields` maps core field
    labels to the RPC's request fields."""
    for cls in type(error).__mro__:
        builder = STATUS_TABLE.get(cls)
        if builder is not None:
            return builder(error, fields)
    return None
