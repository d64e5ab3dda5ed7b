"""The one place where seedstore errors become gRPC statuses.

Every status carries an ErrorInfo (reason = the error class's `reason`,
domain `seedstore.agentsidecar`), plus BadRequest for bad input and
PreconditionFailure for files that must be fixed first. The status message is
the error's own message, so `seedstore --server` prints the same `error: ...`
line as the local CLI. Anything that is not a SeedStoreError is a bug: it
becomes INTERNAL (never UNKNOWN) and is logged with its traceback.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc

from seedstore_service import errors
from sidecar_runtime.richstatus import PreconditionViolation, RichError, abort_with

ERROR_DOMAIN = "seedstore.agentsidecar"
INTERNAL_REASON = "INTERNAL"

_LOGGER = logging.getLogger(__name__)

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


def _base(error: errors.SeedStoreError, _: Mapping[str, str] | None) -> RichError:
    # The base class is raised by nobody on purpose; should it be, it is still a server bug.
    return internal_error(error)


_Builder = Callable[[errors.SeedStoreError, Mapping[str, str] | None], RichError]

# Exact classes; a subclass not listed here falls back to its nearest listed
# ancestor, and a test walks the tree so none is forgotten.
STATUS_TABLE: Mapping[type[errors.SeedStoreError], _Builder] = {
    errors.SeedStoreError: _base,
    errors.InvalidArgument: _invalid_argument,
    errors.InvalidIdentifier: _invalid_argument,
    errors.SeedNotFound: _not_found,
    errors.AmbiguousSeed: _ambiguous,
    errors.SeedMalformed: _malformed,
    errors.RevisionMismatch: _revision_mismatch,
    errors.OutsideStore: _outside_store,
    errors.WatchBacklogExceeded: _watch_backlog,
    errors.StoreUnavailable: _unavailable,
}


def to_rich_error(error: BaseException, fields: Mapping[str, str] | None = None) -> RichError:
    """The status for `error`; `fields` maps core field labels to this RPC's request fields."""
    if isinstance(error, errors.SeedStoreError):
        for cls in type(error).__mro__:
            builder = STATUS_TABLE.get(cls)
            if builder is not None:
                return builder(error, fields)
    return internal_error(error)


def internal_error(error: BaseException) -> RichError:
    return RichError(
        code=grpc.StatusCode.INTERNAL,
        message=f"internal error: {type(error).__name__}: {error}",
        reason=INTERNAL_REASON,
        domain=ERROR_DOMAIN,
        metadata={"exception": type(error).__name__},
    )


async def _abort_for(
    context: grpc.aio.ServicerContext[Any, Any], error: Exception, fields: Mapping[str, str] | None
) -> None:
    """End the call with `error`'s mapped status (INTERNAL, logged, for anything outside the taxonomy)."""
    if isinstance(error, errors.SeedStoreError):
        await abort_with(context, to_rich_error(error, fields))
    else:
        _LOGGER.exception("unexpected error in a seedstore call")
        await abort_with(context, internal_error(error))


@contextlib.asynccontextmanager
async def rpc_errors(
    context: grpc.aio.ServicerContext[Any, Any], fields: Mapping[str, str] | None = None
) -> AsyncIterator[None]:
    """Abort the call with the mapped status when the body raises.

    Cancellation and grpc's own abort pass through untouched.
    """
    try:
        yield
    except grpc.aio.AbortError:
        raise
    except Exception as error:
        await _abort_for(context, error, fields)


_Servicer = TypeVar("_Servicer")
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
_Context = grpc.aio.ServicerContext[Any, Any]
UnaryMethod = Callable[[_Servicer, _Request, _Context], Awaitable[_Response]]
StreamMethod = Callable[[_Servicer, _Request, _Context], AsyncGenerator[_Response, None]]


def unary_errors(
    fields: Mapping[str, str] | None = None,
) -> Callable[[UnaryMethod[_Servicer, _Request, _Response]], UnaryMethod[_Servicer, _Request, _Response]]:
    """Decorate a unary servicer method so every error leaves it as a mapped status."""

    def decorate(
        method: UnaryMethod[_Servicer, _Request, _Response],
    ) -> UnaryMethod[_Servicer, _Request, _Response]:
        @functools.wraps(method)
        async def wrapper(self: _Servicer, request: _Request, context: _Context) -> _Response:
            async with rpc_errors(context, fields):
                return await method(self, request, context)
            raise AssertionError("unreachable: rpc_errors aborts the call")

        return wrapper

    return decorate


def stream_errors(
    fields: Mapping[str, str] | None = None,
) -> Callable[[StreamMethod[_Servicer, _Request, _Response]], StreamMethod[_Servicer, _Request, _Response]]:
    """Decorate a server-streaming servicer method (an async generator) the same way."""

    def decorate(
        method: StreamMethod[_Servicer, _Request, _Response],
    ) -> StreamMethod[_Servicer, _Request, _Response]:
        @functools.wraps(method)
        async def wrapper(
            self: _Servicer, request: _Request, context: _Context
        ) -> AsyncGenerator[_Response, None]:
            # `rpc_errors` and `aclosing`, spelled out: a stream's first message
            # waits for this wrapper, and two context managers cost more than the
            # handlers' own work before it.
            stream = method(self, request, context)
            try:
                try:
                    async for response in stream:
                        yield response
                finally:
                    await stream.aclose()
            except grpc.aio.AbortError:
                raise
            except Exception as error:
                await _abort_for(context, error, fields)

        return wrapper

    return decorate
